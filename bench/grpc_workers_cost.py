"""Server CPU per gRPC request: in the engine process (one process) vs through ``--workers 1``.

With ``--workers`` the front worker serves gRPC and forwards ``ModelInfer`` to the engine; this
splits each point's server CPU into the engine process's own and the workers', next to the
one-process batcher's gRPC and REST JSON (``bench.reference_mlp:identity``, the bench's open-loop
client, one point per mode and server per round):

    python bench/grpc_workers_cost.py                 # 2 rounds at 400 req/s, 4 s a point
    python bench/grpc_workers_cost.py --rate 1000 --rounds 3
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.batcher_serving import loadavg, targets_for, tree_cpu_seconds  # noqa: E402
from bench.serving_cost_ab import IDENTITY, TreeServer  # noqa: E402

TICKS = os.sysconf("SC_CLK_TCK")


def own_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


async def measure(args: argparse.Namespace) -> None:
    extra = ["--max-batch-size", "128", "--max-queue", "4096", "--warmup-repeats", "1"]
    servers = {
        "one process": TreeServer(ROOT, IDENTITY, extra),
        "--workers 1": TreeServer(ROOT, IDENTITY, [*extra, "--workers", "1"]),
    }
    closers, targets = [], {}
    try:
        for label, server in servers.items():
            found, close = await targets_for(server, None, ("grpc", "rest-json"))  # type: ignore[arg-type]
            closers.append(close)
            for mode, target in found.items():
                targets[(label, mode)] = (server, target)
        for _, target in targets.values():
            await target.point(args.rate / 4, 1.0, 1.0, seed=0)
        for index in range(1, args.rounds + 1):
            print(f"round {index}, load average {loadavg()}", flush=True)
            for (label, mode), (server, target) in targets.items():
                pid = server.proc.pid
                engine0, tree0 = own_cpu_seconds(pid), tree_cpu_seconds(pid)
                point = await target.point(args.rate, args.seconds, 1.0, seed=index)
                engine = own_cpu_seconds(pid) - engine0
                fronts = tree_cpu_seconds(pid) - tree0 - engine
                n = max(1, point["answered"])
                print(
                    f"  {label:<12} {mode:<10} engine {1e6 * engine / n:5.0f} us/req  "
                    f"workers {1e6 * fronts / n:5.0f} us/req  "
                    f"total {1e6 * (engine + fronts) / n:5.0f}"
                    f"  answered {point['answered']} failed {point['failures']} "
                    f"p99 {point['p99_ms']:.1f} ms",
                    flush=True,
                )
        print(f"load average after {loadavg()}")
    finally:
        for close in closers:
            await close()
        for server in servers.values():
            server.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rate", type=float, default=400.0)
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=2)
    asyncio.run(measure(parser.parse_args()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
