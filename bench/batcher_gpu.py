"""Batching on a GPU: the open-loop HTTP sweep with a model of several GB, and the allocator.

Prepared for one run on a machine with an H200 (a session there has about 15 minutes of device
time, start-up included), so it is one command that needs nothing else:

    python bench/batcher_gpu.py                       # CUDA, about 6 minutes
    python bench/batcher_gpu.py --device cpu --quick  # a small model on the CPU, short points
    python bench/batcher_gpu.py --device cpu --smoke  # proves it runs end to end (the tests)

Part 1, sweep: ``bench/batcher.py``'s HTTP section (no batching, fixed delay, greedy, this
runtime; grid sweep, then top-rate rounds with the policies interleaved) against
``batcher.models.gpu_bench`` (12.9 GB of bf16 weights by default), each server with the runtime's
default memory settings. The smoke sweeps two of the policies (``SMOKE_POLICIES``): the five go
through the same code in ``bench/batcher.py``'s own smoke.

Part 2, memory: the adaptive runtime twice, with compaction (expandable segments, batches padded
to the warm-up's buckets, cached memory released after ``--idle-release-seconds`` idle) and
without (none of the three), under the same stepped load (rates rising and falling through the
peak, so batches of every size run). ``/metrics`` is polled throughout; the table gives the peaks
of allocated, reserved, reserved-but-unallocated and inactive split bytes, the allocation retries
and OOMs at the end, and what stays reserved once idle. On a CPU there is no caching allocator:
the statistics are absent and printed as n/a, the rest runs the same.

Results go to ``bench/results/batcher_gpu.json`` (``--json``). Operator settings of
``PYTORCH_CUDA_ALLOC_CONF`` are removed first: the comparison sets the allocator itself.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import threading
import time
import urllib.request
from dataclasses import asdict
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]
MODEL = "batcher.models.gpu_bench:factory"
GRID = (0.1, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 1.0)
QUICK_GRID = (0.3, 0.7, 1.0)
SMOKE_GRID = (0.5, 1.0, 2.0)  # 2x the peak fails even a short run: a tight bracket
LOAD_STEPS = (0.2, 0.5, 0.8, 0.95, 1.1, 0.6, 0.3)  # of the peak: every batch size, and a backlog
SMOKE_LOAD_STEPS = (0.5, 1.1, 0.3)
SMOKE_POLICIES = ("fixed-delay", "adaptive")  # a baseline and the runtime: one ratio
QUICK_SHAPE = "256,8,16"  # a few hundred requests/s on one CPU thread
MEMORY_STATS = (
    "allocated_bytes",
    "reserved_bytes",
    "reserved_unallocated_bytes",
    "inactive_split_bytes",
)
MEMORY_COUNTERS = ("alloc_retries_total", "allocator_ooms_total")


def load_cpu_bench() -> ModuleType:
    """``bench/batcher.py`` as a module (by path: its file name would shadow the package)."""
    spec = importlib.util.spec_from_file_location("batcher_bench", ROOT / "bench/batcher.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


bench = load_cpu_bench()

COMPACTION = {
    "compaction": ["--expandable-segments", "--padding", "on"],
    "none": ["--no-expandable-segments", "--padding", "off", "--idle-release-seconds", "0"],
}


def memory_metrics(port: int) -> dict[str, float]:
    """The allocator series of one server's ``/metrics``, by name without the prefix."""
    prefix = "autoglm_batcher_memory_"
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    values = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, value = line.rsplit(" ", 1)
            name = name.split("{", 1)[0].removeprefix(prefix)
            if not name.endswith("_created"):  # when a counter started, not a statistic
                values[name] = float(value)
    return values


class MemoryPoller:
    """Polls a server's allocator statistics in a thread and keeps the highest of each."""

    def __init__(self, port: int, interval: float) -> None:
        self.port = port
        self.interval = interval
        self.peaks: dict[str, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> MemoryPoller:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            for name, value in memory_metrics(self.port).items():
                if name in MEMORY_STATS:
                    self.peaks[name] = max(value, self.peaks.get(name, value))


def memory_run(
    config: str, peak: float, args: argparse.Namespace, common: list[str]
) -> dict[str, object]:
    """One adaptive server with or without compaction under the stepped load; its statistics."""
    flags = [*common, "--policy", "adaptive", "--max-batch-size", str(args.max_batch_size)]
    if config == "compaction":
        flags += ["--idle-release-seconds", str(args.idle_release_seconds)]
    server = bench.Server([*flags, *COMPACTION[config]], MODEL, args.device)
    points = []
    try:
        with MemoryPoller(server.port, args.poll_seconds) as poller:
            for fraction in SMOKE_LOAD_STEPS if args.smoke else LOAD_STEPS:
                point = bench.http_point(server, fraction * peak, args)
                bench.print_point(config, point, point.sustained(args.slo))
                points.append(point)
        at_end = memory_metrics(server.port)
        time.sleep(args.idle_release_seconds + 2 * args.poll_seconds + 1.0)
        idle = memory_metrics(server.port)
    finally:
        server.stop()
    return {
        "config": config,
        "flags": COMPACTION[config],
        "pad_buckets": server.buckets,
        "peaks": poller.peaks,
        "at_end": at_end,
        "idle": idle,
        "releases": idle.get("releases_total", 0.0),
        "points": [asdict(p) for p in points],
    }


def gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / 2**30:8.3f}"


def memory_table(runs: list[dict]) -> None:
    """Print the allocator statistics side by side, in GiB and counts."""
    print(f"  {'statistic':<36}" + "".join(f"{r['config']:>14}" for r in runs))
    for stat in MEMORY_STATS:
        print(f"  {'peak ' + stat:<36}" + "".join(f"{gib(r['peaks'].get(stat)):>14}" for r in runs))
    for stat in MEMORY_COUNTERS:
        print(
            f"  {stat:<36}"
            + "".join(
                f"{'n/a' if stat not in r['at_end'] else int(r['at_end'][stat]):>14}" for r in runs
            )
        )
    print(
        f"  {'reserved_bytes once idle':<36}"
        + "".join(f"{gib(r['idle'].get('reserved_bytes')):>14}" for r in runs)
    )
    print(f"  {'idle releases':<36}" + "".join(f"{int(r['releases']):>14}" for r in runs))
    if not any(r["peaks"] for r in runs):
        print("  (no caching allocator on this device: the statistics do not apply)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="small model, short points")
    parser.add_argument("--smoke", action="store_true", help="small model, a few tiny points")
    parser.add_argument("--json", default=str(ROOT / "bench/results/batcher_gpu.json"))
    parser.add_argument("--shape", default="", help="width,layers,tokens of the model")
    parser.add_argument("--slo", type=float, default=0.25, help="p99 latency SLO, seconds")
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--fixed-delay", type=float, default=0.02, help="baseline's max delay, s")
    parser.add_argument("--duration", type=float, default=4.0, help="seconds per rate")
    parser.add_argument("--max-requests", type=int, default=4000, help="cap per rate")
    parser.add_argument("--request-timeout", type=float, default=5.0)
    parser.add_argument("--warmup-repeats", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=1, help="interleaved top-rate rounds")
    parser.add_argument("--resolution", type=float, default=0.02, help="bisection step, of peak")
    parser.add_argument("--idle-release-seconds", type=float, default=5.0)
    parser.add_argument("--poll-seconds", type=float, default=0.25)
    args = parser.parse_args(argv)
    if args.quick or args.smoke:
        args.shape = args.shape or QUICK_SHAPE
        args.duration, args.max_requests, args.warmup_repeats = 1.0, 150, 2
        args.resolution, args.idle_release_seconds, args.max_batch_size = 0.1, 1.0, 16
    if args.smoke:
        args.duration, args.max_requests, args.resolution = 0.5, 40, 0.5
        args.idle_release_seconds = 0.5  # each memory run then waits 2 s for the idle release
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        os.environ.pop(var, None)
    os.environ["AUTOGLM_GPU_BENCH_DEVICE"] = args.device
    if args.shape:
        os.environ["AUTOGLM_GPU_BENCH_SHAPE"] = args.shape

    report: dict = {"load_average_at_start": bench.loadavg(), "device": args.device}
    print(f"load average at start: {report['load_average_at_start']}; device {args.device}")
    grid = SMOKE_GRID if args.smoke else QUICK_GRID if args.quick else GRID
    policies = SMOKE_POLICIES if args.smoke else bench.POLICIES
    sweep = bench.http_section(args, MODEL, args.device, grid, policies)
    report["sweep"] = sweep
    print("== memory: the adaptive runtime with and without compaction, same stepped load")
    common = bench.server_settings(args)
    runs = [memory_run(config, sweep["offline_peak"], args, common) for config in COMPACTION]
    memory_table(runs)
    report["memory"] = runs
    report["load_average_at_end"] = bench.loadavg()
    bench.write_report(Path(args.json), report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
