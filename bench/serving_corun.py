"""Whether a rate fits this machine at all: the cheapest server's work and the model's, run at once.

Issue 18 asks the batcher's REST JSON path for 8x MLServer's highest rate at p99 <= 100 ms.
``bench/serving_bounds.py`` bounds that rate by adding up costs measured apart (the floor server's
CPU per request, the MLP's per row, the client's), which leaves out what two busy cores do to
each other: the MLP streams its 25 MB of weights through the cache the cores share at every
batch, and the serving loop and the client contend with it for both cores. This bench measures
them together.

For each pass it finds MLServer's highest held rate (the serving bench's search and client), then
runs **co-run points** at ``--multiples`` of it, the target (8x) first: the floor server
(``bench/serving_bounds.py``'s, on uvicorn by default: the cheapest JSON request measured on these
stacks; decode the row, answer it, no model, no batching) answers the open-loop client at that
rate while, in another process, the reference MLP runs batches of ``b`` rows back to back, flat
out: at ``nice`` 19, where the floor and the client take the CPU they need first and the model has
what is left, and at ``nice`` 0, where the scheduler shares the cores evenly. One point per batch
size, torch thread count and nice value, until one fits.

Why it bounds every server on these stacks: a server that holds rate R here must, on these same
cores, answer every request (at least the floor's work), run the model on every row, and share
the machine with the client; in the co-run those three run with nothing else added (no batching
hand-off, no copies between them, no interpreter lock between server and model), so they cost
less than in any real server. Holding R needs, for some batch size b:

* the floor holds R beside the model (p99 <= SLO, <= 1% failed);
* the model completes at least R rows a second in what is left;
* the model's batch runs inside the SLO: at least 99% of batches (of equal size) take <= SLO,
  since every request waits at least for its own batch, and a p99 within the SLO allows no
  more than 1% of requests in batches that take longer.

If no (b, threads, nice) point meets all three, no server on these stacks holds R on this
machine (for the batch sizes tried; the model's cost per row falls with the batch while its batch
time grows, so the grid spans the sizes whose batch fits the SLO). The model's share (its rows a
second over R) says how far off. The lower multiples, tried in turn until one fits, bracket the
highest rate any server could hold here, as multiples of MLServer's in the same pass.

    python bench/serving_corun.py                        # 3 passes, 8x..3x MLServer, 5 s points
    python bench/serving_corun.py --target-rate 2200     # no MLServer: a rate of your choosing
    python bench/serving_corun.py --smoke                # proves it runs (the slow tests)
    python bench/serving_corun.py --from-json bench/results/serving_corun.json   # print it again
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.batcher_serving import (  # noqa: E402
    MLSERVER_BIN,
    MLSERVER_MODE,
    MLServer,
    Neighbours,
    Target,
    interleaved,
    loadavg,
    targets_for,
    top_rate_search,
    warm_rate,
)
from bench.report_json import write_report  # noqa: E402
from bench.serving_bounds import FloorServer  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "serving_corun.json"
BURNER_WARM_BATCHES = 3


# --- the model, flat out (a child process: ``--burn BATCH``) -----------------------------------


def burn(batch: int, threads: int, niceness: int) -> None:
    """Run the reference MLP on ``batch`` rows back to back until standard input closes; then
    print each batch's (start, end) on the system's monotonic clock, and this process's CPU
    seconds when warm and at the end, as JSON. Says ``ready`` once warm, so the parent starts
    its load after the warm-up."""
    os.nice(niceness)
    import torch

    from bench.reference_mlp import FEATURES, reference_mlp

    torch.set_num_threads(threads)
    module = reference_mlp().eval()
    rows = torch.randn(batch, FEATURES)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    spans: list[tuple[float, float]] = []
    with torch.inference_mode():
        for _ in range(BURNER_WARM_BATCHES):
            module(rows)
        ready = {"at": time.monotonic(), "cpu_seconds": time.process_time()}
        print("ready", flush=True)
        while not stop.is_set():
            start = time.monotonic()
            module(rows)
            spans.append((start, time.monotonic()))
    ended = {"at": time.monotonic(), "cpu_seconds": time.process_time()}
    print(json.dumps({"spans": spans, "ready": ready, "ended": ended}), flush=True)


class Burner:
    """:func:`burn` in a child process; :meth:`finish` returns what it ran."""

    def __init__(self, batch: int, threads: int, niceness: int) -> None:
        command = [sys.executable, __file__, "--burn", str(batch)]
        command += ["--threads", str(threads), "--nice", str(niceness)]
        self.proc = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdin is not None
        line = self.proc.stdout.readline().strip()
        if line != "ready":
            self.proc.kill()
            raise RuntimeError(f"the model process did not start (it said {line!r})")

    def finish(self) -> dict:
        assert self.proc.stdout is not None and self.proc.stdin is not None
        self.proc.stdin.close()
        out = json.loads(self.proc.stdout.readline())
        self.proc.wait(timeout=30)
        return out

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


# --- the arithmetic (pure: the tests check it without servers) ----------------------------------


def model_in_window(spans: list[tuple[float, float]], start: float, end: float, batch: int) -> dict:
    """What the model did between ``start`` and ``end``: rows a second (each batch counted for the
    part of it inside the window, so a batch straddling an edge is neither lost nor double
    counted) and its batches' durations, of those that ran wholly inside."""
    if end <= start:
        raise ValueError("the window must have a positive length")
    done = 0.0
    inside = []
    for began, ended in spans:
        overlap = min(ended, end) - max(began, start)
        if overlap > 0 and ended > began:
            done += batch * overlap / (ended - began)
        if began >= start and ended <= end:
            inside.append(ended - began)
    inside.sort()
    return {
        "rows_per_second": done / (end - start),
        "batches": len(inside),
        "batch_ms_p50": 1000 * statistics.median(inside) if inside else math.inf,
        "batch_ms_p99": 1000 * inside[min(len(inside) - 1, int(0.99 * len(inside)))]
        if inside
        else math.inf,
    }


def fits(point: dict, rate: float, slo_seconds: float) -> bool:
    """Whether a co-run point shows ``rate`` fitting the machine (the three conditions above)."""
    return (
        bool(point["floor_held"])
        and point["model"]["rows_per_second"] >= rate
        and batch_inside(point, slo_seconds)
    )


def batch_inside(point: dict, slo_seconds: float) -> bool:
    """At least 99% of the model's batches ran inside the SLO."""
    return bool(point["model"]["batch_ms_p99"] <= 1000 * slo_seconds)


def model_share(point: dict, rate: float) -> float:
    """The model's rows a second over the rate: at least 1 where the model keeps up."""
    return point["model"]["rows_per_second"] / rate


def one_executor_p99_ms(point: dict, rate: float) -> float:
    """The least p99 latency any server with one model executor (batches run one after another,
    all of this point's size) could give at ``rate``, from this point's batch time T (median).

    The executor must be busy a fraction u = rate / (rows a second it does flat out) of the time,
    whatever the policy; a Poisson arrival finds it busy with that probability (PASTA) and then
    waits the rest of the running batch, at least uniform on [0, T] for batches of one length,
    and then its own batch, T. So P(latency > T + x) >= u (1 - x / T), and the p99 is at least
    T (2 - 0.01 / u); T alone when u is under 1%."""
    busy = min(1.0, rate / point["model"]["rows_per_second"])
    batch_ms = point["model"]["batch_ms_p50"]
    return batch_ms * (2 - 0.01 / busy) if busy > 0.01 else batch_ms


def fits_one_executor(point: dict, rate: float, slo_seconds: float) -> bool:
    """:func:`fits`, and the least p99 of a server with one model executor inside the SLO."""
    return fits(point, rate, slo_seconds) and one_executor_p99_ms(point, rate) <= 1000 * slo_seconds


def verdict(points: list[dict], rate: float, slo_seconds: float) -> str:
    if any(fits(p, rate, slo_seconds) for p in points):
        return "fits: not out of reach by this bound"
    return "out of reach: no batch size and thread count fits both the floor and the model"


# --- measuring ----------------------------------------------------------------------------------


async def corun_point(
    target: Target, rate: float, model: tuple[int, int, int], args: argparse.Namespace, seed: int
) -> dict:
    """One co-run point: the floor at ``rate`` and the model, (threads, batch rows, nice),
    together."""
    threads, batch, niceness = model
    burner = await asyncio.to_thread(Burner, batch, threads, niceness)
    try:
        start = time.monotonic()
        floor = await target.point(rate, args.seconds, args.slo_seconds, seed=seed)
        end = time.monotonic()
        ran = await asyncio.to_thread(burner.finish)
    finally:
        burner.kill()
    point = {
        "rate": rate,
        "batch": batch,
        "threads": threads,
        "nice": niceness,
        "floor_held": floor["held"],
        "floor_p99_ms": floor["p99_ms"],
        "floor_failures": floor["failures"],
        "floor_server_us": 1e6 * floor["server_cpu_seconds"] / max(1, floor["answered"]),
        "floor_cores": floor["server_cores"],
        "client_us": 1000 * floor["client_cpu_ms_per_request"],
        "model": model_in_window(ran["spans"], start, end, batch),
        "model_cores": (ran["ended"]["cpu_seconds"] - ran["ready"]["cpu_seconds"])
        / max(1e-9, ran["ended"]["at"] - ran["ready"]["at"]),
        "model_cpu_seconds": ran["ended"]["cpu_seconds"],  # all of it, warm-up included
    }
    point["model_share"] = model_share(point, rate)
    point["batch_ok"] = batch_inside(point, args.slo_seconds)
    point["fits"] = fits(point, rate, args.slo_seconds)
    print(
        f"    co-run {rate:7.0f}/s  batch {batch:4d} x{threads} thread nice {niceness:2d}  floor "
        f"p99 {point['floor_p99_ms']:7.1f} ms {'held' if point['floor_held'] else 'MISS'}  model "
        f"{point['model']['rows_per_second']:6.0f} rows/s ({point['model_share']:.2f} of the "
        f"rate), batch p99 {point['model']['batch_ms_p99']:6.1f} ms  "
        f"{'FITS' if point['fits'] else 'no'}",
        flush=True,
    )
    return point


async def mlserver_top(target: Target, start: float, args: argparse.Namespace, seed: int) -> float:
    """MLServer's highest held rate, by the serving bench's search and its driver."""

    async def run(mode: str, rate: float) -> bool:
        point = await target.point(rate, args.seconds, args.slo_seconds, seed=seed)
        print(
            f"    mlserver {rate:7.0f}/s  p99 {point['p99_ms']:7.1f} ms  "
            f"{'held' if point['held'] else 'MISS'}",
            flush=True,
        )
        return bool(point["held"])

    search = top_rate_search(start, args.step, args.resolution, 20.0, args.ceiling)
    return float((await interleaved({MLSERVER_MODE: search}, run))[MLSERVER_MODE])


async def one_pass(
    targets: dict[str, Target], args: argparse.Namespace, index: int, mlserver_start: float
) -> dict:
    """MLServer's top rate (when compared), then co-run grids at each multiple of it, highest
    first, until one fits: the highest multiple that fits bounds every server's rate from above
    (to within one step of the multiples), and the first says whether the target fits."""
    before, neighbours, began = loadavg(), Neighbours(), time.monotonic()
    reference = None
    if MLSERVER_MODE in targets:
        reference = await mlserver_top(targets[MLSERVER_MODE], mlserver_start, args, index)
        base = reference
    else:
        base = args.target_rate / args.multiples[0]
    floor = targets["rest-json"]
    grids: dict[float, list[dict]] = {}
    order = [(t, b, n) for n in args.nice for t in args.threads for b in args.batches]
    fitted = 0.0
    for multiple in args.multiples:
        rate = multiple * base
        grid = grids[multiple] = []
        for model in order:
            grid.append(await corun_point(floor, rate, model, args, index))
            if grid[-1]["fits"]:
                break
        if grid[-1]["fits"]:
            fitted = multiple
            break
        # the next, lower rate tries first the configurations that came closest at this one
        order = [
            (p["threads"], p["batch"], p["nice"]) for p in sorted(grid, key=closeness, reverse=True)
        ]
    target_rate = args.multiples[0] * base
    result = {
        "mlserver_top_rate": reference,
        "target_rate": target_rate,
        "grids": {str(m): g for m, g in grids.items()},
        "verdict": verdict(grids[args.multiples[0]], target_rate, args.slo_seconds),
        "highest_multiple_fitting": fitted,
        "lowest_multiple_not_fitting": min(m for m in grids if m > fitted)
        if fitted < args.multiples[0]
        else None,
        "loadavg": {"before": before, "after": loadavg()},
        # the model processes have exited, so Neighbours counts their CPU as others': take it out
        "neighbour_cores": neighbours.cores()
        - sum(p["model_cpu_seconds"] for g in grids.values() for p in g)
        / (time.monotonic() - began),
        "host_steal_cores": neighbours.steal_cores(),
    }
    print(
        f"pass {index}: target {target_rate:.0f}/s"
        + (f" ({args.multiples[0]:g}x MLServer's {reference:.0f})" if reference else "")
        + f": {result['verdict']}; highest multiple fitting {fitted:g}"
        + f"; load average {before} -> {loadavg()}, other work {result['neighbour_cores']:.2f}"
        f" cores (host steal {result['host_steal_cores']:.2f})",
        flush=True,
    )
    return result


def closeness(point: dict) -> tuple:
    """How near a co-run point came to fitting: the floor's and the batch's latency conditions
    met first, then the model's share of the rate."""
    return (point["fits"], point["floor_held"] and point["batch_ok"], point["model_share"])


async def run(args: argparse.Namespace, floor: FloorServer, mlserver: MLServer | None) -> list:
    modes = ("rest-json", MLSERVER_MODE) if mlserver is not None else ("rest-json",)
    targets, close = await targets_for(floor, mlserver, modes)  # type: ignore[arg-type]
    passes = []
    try:
        for target in targets.values():  # connections open, paths warm
            await target.point(warm_rate(args.start), 1.0, args.slo_seconds, seed=0)
        start = args.start
        for index in range(1, args.passes + 1):
            print(f"pass {index}", flush=True)
            result = await one_pass(targets, args, index, start)
            if result["mlserver_top_rate"]:
                start = max(40.0, result["mlserver_top_rate"] / args.step)
            passes.append(result)
    finally:
        await close()
    return passes


def summarise(passes: list[dict], multiples: list[float], slo_seconds: float) -> dict:
    """Per pass the verdict at the target and the bracket the highest fitting rate lies in; over
    passes their medians, and whether the target is out of reach in most passes (the goal takes
    the median pass). Also, per pass, the multiples at which a server with one model executor
    could fit (:func:`fits_one_executor`), of those tried."""
    top = str(multiples[0])
    for p in passes:
        p["one_executor_fits_at"] = [
            float(m)
            for m, grid in p["grids"].items()
            if any(fits_one_executor(g, g["rate"], slo_seconds) for g in grid)
        ]
    shares = [
        max((min(g["model_share"], 1.0) for g in p["grids"][top] if g["floor_held"]), default=0.0)
        for p in passes
    ]
    out: dict = {
        "verdicts": [p["verdict"] for p in passes],
        "out_of_reach_in_every_pass": all(p["verdict"].startswith("out") for p in passes),
        "out_of_reach_in_most_passes": 2 * sum(p["verdict"].startswith("out") for p in passes)
        > len(passes),
        "one_executor_fits_target_in": sum(float(top) in p["one_executor_fits_at"] for p in passes),
        "highest_multiple_fitting": statistics.median(
            p["highest_multiple_fitting"] for p in passes
        ),
        "best_model_share_at_target": statistics.median(shares),
    }
    references = [p["mlserver_top_rate"] for p in passes if p["mlserver_top_rate"]]
    if references:
        out["mlserver_top_rate"] = statistics.median(references)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0, help="per point")
    parser.add_argument(
        "--multiples",
        default="8,7,6,5,4,3",
        help="rates to try, as multiples of MLServer's top rate, highest (the target) first",
    )
    parser.add_argument(
        "--target-rate",
        type=float,
        help="no MLServer: the target rate (req/s), the first multiple's; the others scale it",
    )
    parser.add_argument("--batches", default="64,96,128,192", help="the model's batch sizes")
    parser.add_argument("--threads", default="1,2", help="the model's torch thread counts")
    parser.add_argument(
        "--nice",
        default="19,0",
        help="the model process's nice values: 19 leaves it what the floor and client do not use, "
        "0 shares the cores evenly",
    )
    parser.add_argument("--stack", choices=("uvicorn", "aiohttp"), default="uvicorn")
    parser.add_argument("--slo-seconds", type=float, default=0.1)
    parser.add_argument("--start", type=float, default=200.0, help="MLServer's first rate")
    parser.add_argument("--step", type=float, default=1.5, help="MLServer's search, as the bench's")
    parser.add_argument("--resolution", type=float, default=0.05)
    parser.add_argument("--ceiling", type=float, default=20000.0)
    parser.add_argument("--mlserver", type=Path, default=MLSERVER_BIN)
    parser.add_argument("--mlserver-batch-time", type=float, default=0.01)
    parser.add_argument("--max-batch-size", type=int, default=128, help="MLServer's")
    parser.add_argument("--smoke", action="store_true", help="one short pass: proves it runs")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument(
        "--from-json",
        type=Path,
        help="measure nothing: print an earlier run's report (its --json) with this arithmetic",
    )
    parser.add_argument("--burn", type=int, help=argparse.SUPPRESS)
    args, problem = parse(parser, argv)
    if problem:
        parser.error(problem)
    if args.burn:
        burn(args.burn, args.threads[0], args.nice[0])
        return 0
    if args.from_json:
        report = json.loads(args.from_json.read_text())
        passes, multiples = report["passes"], report["multiples"]
        print_summary(passes, summarise(passes, multiples, report["slo_seconds"]), multiples)
        return 0
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.smoke:
        args.passes, args.seconds, args.batches, args.threads, args.nice = 1, 0.5, [8], [1], [19]
        args.multiples = args.multiples[:2]
        args.start, args.ceiling, args.step, args.resolution = 50.0, 100.0, 2.0, 0.5
    mlserver = None
    if args.target_rate is None:
        print(f"MLServer {args.mlserver}, max_batch_time {args.mlserver_batch_time}", flush=True)
        mlserver = MLServer(args.mlserver, args.max_batch_size, args.mlserver_batch_time, 1)
    load_before = loadavg()
    with tempfile.TemporaryDirectory(prefix="serving-corun-") as scratch:
        try:
            floor = FloorServer(Path(scratch), "floor", 0.0, args.stack)
            try:
                passes = asyncio.run(run(args, floor, mlserver))
            finally:
                floor.stop()
        finally:
            if mlserver is not None:
                mlserver.stop()
    summary = summarise(passes, args.multiples, args.slo_seconds)
    print_summary(passes, summary, args.multiples)
    write_report(
        args.json,
        {
            "stack": args.stack,
            "multiples": args.multiples,
            "target_rate": args.target_rate,
            "batches": args.batches,
            "threads": args.threads,
            "nice": args.nice,
            "slo_seconds": args.slo_seconds,
            "seconds_per_point": args.seconds,
            "smoke": args.smoke,
            "cpus": os.cpu_count(),
            "loadavg_before": load_before,
            "loadavg_after": loadavg(),
            "summary": summary,
            "passes": passes,
        },
    )
    return 0


def parse(parser: argparse.ArgumentParser, argv: list[str] | None) -> tuple:
    """The arguments, and the first problem with them (or ``""``), all checked before any
    server starts."""
    args = parser.parse_args(argv)
    try:
        args.batches = [int(b) for b in args.batches.split(",") if b]
        args.threads = [int(t) for t in args.threads.split(",") if t]
        args.multiples = [float(m) for m in args.multiples.split(",") if m]
        args.nice = [int(n) for n in args.nice.split(",") if n]
    except ValueError:
        return args, (
            "--batches, --threads, --multiples and --nice take numbers separated by commas, "
            "e.g. 64,128"
        )
    if args.burn:
        return args, ""
    if args.from_json is not None:
        if not args.from_json.is_file():
            return (
                args,
                f"--from-json {args.from_json}: no such file; give a report this bench wrote",
            )
        return args, ""
    if not args.batches or min(args.batches) < 1 or not args.threads or min(args.threads) < 1:
        return args, "--batches and --threads need at least one value, each at least 1"
    if not args.multiples or min(args.multiples) <= 0:
        return args, "--multiples needs at least one positive value, e.g. 8,7,6"
    if args.multiples != sorted(args.multiples, reverse=True):
        return args, f"--multiples must go from the highest down, e.g. 8,7,6; got {args.multiples}"
    if args.passes < 1 or args.seconds <= 0 or args.slo_seconds <= 0:
        return args, "--passes, --seconds and --slo-seconds must be positive"
    if not args.nice or not all(0 <= n <= 19 for n in args.nice):
        return args, f"--nice takes values from 0 to 19; got {args.nice}"
    if args.target_rate is not None and args.target_rate <= 0:
        return args, f"--target-rate must be positive; got {args.target_rate}"
    if args.target_rate is None and not args.mlserver.exists():
        return args, f"{args.mlserver} is absent: run bash bench/mlserver-venv, or --target-rate"
    if args.stack == "uvicorn" and not all(map(importlib.util.find_spec, ("uvicorn", "httptools"))):
        return args, "the uvicorn floor needs uvicorn and httptools: pip install -e '.[test]'"
    return args, ""


def print_summary(passes: list[dict], summary: dict, multiples: list[float]) -> None:
    print(
        f"{'pass':>4} {'MLServer':>9} {'target':>8} {'fits at':>8} {'not at':>7} "
        f"{'one executor fits at':>20}  verdict"
    )
    for index, p in enumerate(passes, 1):
        reference = p["mlserver_top_rate"]
        above = p["lowest_multiple_not_fitting"]
        one = ",".join(f"{m:g}x" for m in p["one_executor_fits_at"]) or "none tried"
        print(
            f"{index:>4} {reference or math.nan:>9.0f} {p['target_rate']:>8.0f} "
            f"{p['highest_multiple_fitting']:>7g}x {(above or math.nan):>6g}x {one:>20}  "
            f"{p['verdict']}"
        )
    print(
        f"{'x':>4} {'batch':>6} {'threads':>7} {'nice':>4} {'floor p99 ms':>12} "
        f"{'model rows/s':>12} {'share':>6} {'batch p99 ms':>12} {'floor us':>8} "
        f"{'client us':>9} {'1-exec p99':>10}  (every point)"
    )
    for p in passes:
        for multiple, grid in p["grids"].items():
            for g in grid:
                print(
                    f"{float(multiple):>4g} {g['batch']:>6} {g['threads']:>7} {g['nice']:>4} "
                    f"{g['floor_p99_ms']:>12.1f} {g['model']['rows_per_second']:>12.0f} "
                    f"{g['model_share']:>6.2f} {g['model']['batch_ms_p99']:>12.1f} "
                    f"{g['floor_server_us']:>8.0f} {g['client_us']:>9.0f} "
                    f"{one_executor_p99_ms(g, g['rate']):>10.1f}"
                )
    print(
        f"median highest multiple of MLServer fitting: {summary['highest_multiple_fitting']:g}x "
        f"(0: none of {multiples}); the target out of reach in most passes: "
        f"{summary['out_of_reach_in_most_passes']}, in every pass: "
        f"{summary['out_of_reach_in_every_pass']}; a one-executor server fits it in "
        f"{summary['one_executor_fits_target_in']} of {len(passes)} passes"
    )


if __name__ == "__main__":
    raise SystemExit(main())
