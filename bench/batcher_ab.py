"""Batcher settings side by side: the model on a thread or in its own process, eager or filling
batches, any flags.

Each way is an ``autoglm-batcher`` serving the reference MLP (one torch thread) with its own
extra flags, all running at once (``--ways``; by default ``thread`` with the model on a thread of
the server's interpreter and ``process`` with ``--model-process``). The same open-loop REST JSON
load goes to each in turn, rate by rate, alternating, so a machine whose load drifts hits all
alike. Per point the table shows the latency, the failures, the mean batch, the requests per
server CPU-second, and the model's **inflation**: the time a batch took in the server (the
engine's own ``compute_latency`` histogram) over what the MLP alone takes for a batch of that
size (timed in a child process with nothing else running in it). Inflation above 1 is time the
model spent waiting, not computing: on a thread, mostly waiting to take the interpreter lock
back between operators while the event loop holds it. **Idle** is the share of the point's time
the device sat idle between batches while the next one's requests waited, for the serving
path's turnaround (``autoglm_batcher_dispatch_gap_seconds{cause="turnaround"}``): what the
look-ahead dispatch is there to remove.

    python bench/batcher_ab.py                          # thread against process, 1000..3000 req/s
    python bench/batcher_ab.py --ways "eager=--dispatch eager,fill=--dispatch fill"
    python bench/batcher_ab.py --rates 1500,2500 --rounds 3 --seconds 6
    python bench/batcher_ab.py --smoke                  # proves it runs (the slow tests)
"""

from __future__ import annotations

import argparse
import asyncio
import math
import re
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.batcher_process import histogram_totals  # noqa: E402
from bench.batcher_serving import (  # noqa: E402
    BatcherServer,
    Neighbours,
    loadavg,
    model_row_microseconds,
    targets_for,
)
from bench.report_json import write_report  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "batcher_ab.json"
DEFAULT_WAYS = "thread=,process=--model-process"


def parse_ways(text: str) -> dict[str, list[str]]:
    """``name=flags,name=flags`` (flags split on spaces) as a dict; ValueError naming the
    problem."""
    ways: dict[str, list[str]] = {}
    for part in text.split(","):
        name, sep, flags = part.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"{part!r} is not name=flags")
        if name.strip() in ways:
            raise ValueError(f"way {name.strip()!r} is given twice")
        ways[name.strip()] = flags.split()
    if len(ways) < 2:
        raise ValueError("give at least two ways to compare")
    return ways


async def measure(server: BatcherServer, rate: float, seconds: float, seed: int) -> dict:
    """One open-loop point, with the batches the server ran during it."""
    targets, close = await targets_for(server, None, ("rest-json",))
    compute = "autoglm_batcher_compute_latency_seconds"
    gap, turnaround = "autoglm_batcher_dispatch_gap_seconds", 'cause="turnaround"'
    try:
        seconds_before, batches_before = histogram_totals(server.http_port, compute)
        idle_before, _ = histogram_totals(server.http_port, gap, turnaround)
        wall_before = time.monotonic()
        point = await targets["rest-json"].point(rate, seconds, 0.1, seed)  # its mean batch too
        wall = time.monotonic() - wall_before
        seconds_after, batches_after = histogram_totals(server.http_port, compute)
        idle_after, _ = histogram_totals(server.http_port, gap, turnaround)
    finally:
        await close()
    batches = batches_after - batches_before
    point["batches"] = batches
    point["batch_seconds"] = (seconds_after - seconds_before) / batches if batches else math.nan
    # the device idle with work waiting, for the serving path's turnaround: a share of the point
    point["turnaround_idle_share"] = (idle_after - idle_before) / wall
    return point


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--rates", default="1000,1500,2000,2500,3000", help="req/s, comma-separated"
    )
    parser.add_argument(
        "--ways", default=DEFAULT_WAYS, help="name=extra batcher flags, comma-separated"
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=4.0, help="per point")
    parser.add_argument(
        "--model-device", default="cpu", help="where both run the MLP: cpu, or cuda (device check)"
    )
    parser.add_argument("--smoke", action="store_true", help="one short round: proves it runs")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    try:
        rates = [float(r) for r in args.rates.split(",")]
    except ValueError:
        parser.error(
            f"--rates takes numbers separated by commas, e.g. 1000,2000; got {args.rates!r}"
        )
    try:
        ways = parse_ways(args.ways)
    except ValueError as exc:
        parser.error(f"--ways: {exc}; e.g. --ways 'a=,b=--model-process'")
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.model_device):
        parser.error(f"--model-device takes cpu, cuda or cuda:N; got {args.model_device!r}")
    if not rates or min(rates) <= 0 or args.rounds < 1 or args.seconds <= 0:
        parser.error("--rates must be positive, --rounds at least 1, --seconds above 0")
    if args.smoke:
        rates, args.rounds, args.seconds = [100.0], 1, 0.5
    extra = ["--max-batch-size", "128", "--max-queue", "4096", "--slo-seconds", "0.1"]
    extra += ["--warmup-repeats", "1" if args.smoke else "3"]
    load_before, neighbours = loadavg(), Neighbours()
    servers = {
        way: BatcherServer([*extra, *flags], device=args.model_device)
        for way, flags in ways.items()
    }
    points: list[dict] = []
    try:
        for round_index in range(args.rounds):
            for rate in rates:
                for way, server in servers.items():
                    point = asyncio.run(measure(server, rate, args.seconds, round_index))
                    point.update(way=way, round=round_index)
                    points.append(point)
                    print(
                        f"  {way:10} {rate:6.0f}/s  p50 {point['p50_ms']:7.1f} ms  p99 "
                        f"{point['p99_ms']:7.1f} ms  fail {point['failures']:4}  batch "
                        f"{point['mean_batch_items']:5.1f}  {1000 * point['batch_seconds']:6.2f} "
                        f"ms/batch  {point['server_cores']:.2f} cores  idle "
                        f"{100 * point['turnaround_idle_share']:4.1f}%",
                        flush=True,
                    )
    finally:
        for server in servers.values():
            server.stop()
    sizes = sorted({max(1, round(p["mean_batch_items"])) for p in points if p["batches"]})
    alone = model_row_microseconds(sizes, 0.1 if args.smoke else 1.0, args.model_device)
    for point in points:
        size = max(1, round(point["mean_batch_items"])) if point["batches"] else None
        model_seconds = alone[size] * size / 1e6 if size else math.nan
        point["model_alone_seconds"] = model_seconds
        point["inflation"] = point["batch_seconds"] / model_seconds if size else math.nan
    rows = summarize(points, rates, list(ways))
    print(
        f"\n{'rate':>6} | {'way':10} {'p99 ms':>8} {'held':>5} {'batch':>6} {'req/CPU-s':>9} "
        f"{'inflation':>9} {'idle':>6}   (medians over {args.rounds} round(s); inflation: batch "
        "time / the MLP alone; idle: the device's, with work waiting, for the serving path)"
    )
    for row in rows:
        held = "yes" if row["held"] else "no"
        print(
            f"{row['rate']:6.0f} | {row['way']:10} {row['p99_ms']:8.1f} {held:>5} "
            f"{row['mean_batch_items']:6.1f} {row['requests_per_server_cpu_second']:9.0f} "
            f"{row['inflation']:9.2f} {100 * row['turnaround_idle_share']:5.1f}%"
        )
    write_report(
        args.json,
        {
            "model": "MLP 512-2048-2048-512, torch, 1 CPU thread (bench/reference_mlp.py)",
            "model_device": args.model_device,
            "seconds_per_point": args.seconds,
            "rounds": args.rounds,
            "smoke": args.smoke,
            "loadavg_before": load_before,
            "loadavg_after": loadavg(),
            "other_work_cores": neighbours.cores(),
            "host_steal_cores": neighbours.steal_cores(),
            "summary": rows,
            "points": points,
        },
    )
    return 0


def summarize(points: list[dict], rates: list[float], ways: list[str]) -> list[dict]:
    """Per rate and way, the medians over the rounds; held only if every round held."""
    rows = []
    for rate in rates:
        for way in ways:
            mine = [p for p in points if p["rate"] == rate and p["way"] == way]
            if not mine:
                continue
            rows.append(
                {
                    "rate": rate,
                    "way": way,
                    "p99_ms": statistics.median(p["p99_ms"] for p in mine),
                    "held": all(p["held"] for p in mine),
                    "mean_batch_items": statistics.median(p["mean_batch_items"] for p in mine),
                    "requests_per_server_cpu_second": statistics.median(
                        p["requests_per_server_cpu_second"] for p in mine
                    ),
                    "inflation": statistics.median(p["inflation"] for p in mine),
                    "turnaround_idle_share": statistics.median(
                        p["turnaround_idle_share"] for p in mine
                    ),
                }
            )
    return rows


if __name__ == "__main__":
    raise SystemExit(main())
