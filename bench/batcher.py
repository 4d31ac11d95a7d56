"""Batching runtime benchmark: the policies in simulated time, then an open-loop HTTP sweep.

Both sections compare, side by side in one run, five ways to serve the same model:

1. no batching          -- ``--policy fixed-delay --max-batch-size 1``;
2. fixed-delay baseline -- Triton-style, as its users tune it: a max queue delay (60 ms) and a
                            preferred batch size (the largest), ``batcher.policy.FixedDelayPolicy``;
3. greedy               -- the same with Triton's default max queue delay of 0: whatever waits
                            starts as soon as the device is free;
4. adaptive-no-adm      -- the ablation: this runtime with SLO admission off, so the ratios say
                            what the dispatch rule alone and the admission alone contribute;
5. this runtime          -- ``--policy adaptive`` (keep-up/self-clocking/deadline dispatch,
                            cost-model cap, SLO admission: a request predicted to finish past the
                            SLO is refused at once).

The three baselines run with SLO admission off (``--no-refuse-past-slo``), as Triton's dynamic
batcher has no deadline admission; all keep the queue bound and the timeout refusal.

For each it sweeps offered Poisson rates (fractions of the offline peak, max over b of b / t(b))
and reports throughput and p50/p99 latency per rate. A rate is sustained when p99 is within the
SLO and under 1% of requests failed. The grid is 5% of the peak apart at the top, too coarse to
rank policies that all run full batches there, so the highest sustained rate is then found by
bisection between the grid's last passing and first failing rate (each end re-checked, and the
bracket moved when it no longer holds), down to ``--resolution`` of the peak, and repeated:

* simulated: once per seed (``--seeds``), every policy on the same seeded arrivals (scaled to each
  rate), so the comparison is paired and exact for that seed;
* HTTP: ``--rounds`` times, the policies interleaved point by point (A, B, C, D, A, B, ...) with
  all servers up at once, so drift in this shared machine's load hits every policy alike.

The summary gives per policy the median top rate and its range, its ratios to the offline peak
and to no batching, and the paired ratios per seed or round (``PAIRS``: the runtime to each
baseline and to its ablation, the ablation to the fixed-delay baseline), median and range. A
refused request counts as failed (infinitely late), so admission can only raise the top rate by
keeping refusals plus late answers under 1%. In simulation over the offline peak, a finite run
still passes while the backlog it builds stays within the SLO: top rates a little above the peak
there say how long a run survives, not a sustainable rate.

Section 1, simulated: the engine itself against :class:`~batcher.models.simulated.SimulatedModel`
with a known t(b), on a virtual clock (:mod:`batcher.simulation`): exact, deterministic and
independent of this machine's load, so it shows the policy maths alone. Scenarios: a linear
device shaped like the HTTP model; a CPU-like device whose cost is not monotone in the batch size
(8 rows cost more than 16), with 20% seeded jitter; and a tight SLO with a large maximum batch,
where the SLO, not the maximum, must bound the batch. Every batcher is warmed up as the server
does it (timing at start-up, padding to the buckets that picks).

Section 2, HTTP: each policy is a separate ``autoglm-batcher`` process running the torch CPU model
``bench_factory`` (a deep MLP whose batch cost is clearly sublinear) on ONE torch thread, so the
model holds one core and the server's event loop and this load generator share the other. The
servers start one after the other (their warm-ups must not overlap) and stay up together. The
offline peak comes from the servers' own start-up warm-up (same process, same thread settings as
they serve with), logged as ``warm-up timed the model``. The load generator is one asyncio process
with one connection pool, open loop (latency counted from the scheduled send time, so a lagging
client cannot hide queueing), bounded per point in requests and in time (a request unanswered
after ``--request-timeout`` counts as failed). The machine is shared: the load average is
recorded around every sweep and round; on a loaded machine the HTTP figures say little.

    python bench/batcher.py                  # both sections
    python bench/batcher.py --quick          # a short run
    python bench/batcher.py --smoke          # proves it runs end to end (the tests); no figures,
                                             # a small model (bench/smoke_model.py)
    python bench/batcher.py --only sim       # the simulated section alone (a few minutes);
                                             # --only keeps the other section in the JSON
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import statistics
import sys
from collections.abc import Callable, Generator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder comes first on sys.path and its name would shadow the
# ``batcher`` package; import from the repository root instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from prometheus_client import CollectorRegistry  # noqa: E402

from batcher.engine import Batcher  # noqa: E402
from batcher.metrics import BatcherMetrics  # noqa: E402
from batcher.models.simulated import SimulatedModel  # noqa: E402
from batcher.policy import FixedDelayPolicy  # noqa: E402
from batcher.simulation import LoadPoint, simulate_point, summarize  # noqa: E402
from bench.batcher_process import BatcherProcess, histogram_totals  # noqa: E402
from bench.report_json import write_report  # noqa: E402

MODEL = "batcher.models.demo:bench_factory"
SMOKE_MODEL = "bench.smoke_model:smoke_factory"  # MODEL's signature, a sleep for its time
CONNECTIONS = 256  # client pool; beyond it requests wait in the client, and that wait counts
RATE_FRACTIONS = (0.03, 0.05, 0.07, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 1.0)
# No rate above twice the offline peak is searched: no policy sustains it in a real run.
SEARCH_CEILING = 2.0
SMOKE_FRACTIONS = (0.5, 1.0, 2.0)  # 2x the peak fails even a short run: a tight bracket
NO_ADMISSION = "adaptive-no-adm"  # the ablation: this runtime with SLO admission off
POLICIES = ("no-batching", "fixed-delay", "greedy", NO_ADMISSION, "adaptive")
# (policy, baseline) pairs whose top rates are compared per seed or round: the runtime against
# the Triton-style baselines, and the ablation saying what the dispatch rule alone and the SLO
# admission alone contribute
PAIRS = (
    ("adaptive", "fixed-delay"),
    ("adaptive", "greedy"),
    ("adaptive", NO_ADMISSION),
    (NO_ADMISSION, "fixed-delay"),
)

# A CPU-like device: per-size seconds as measured on this kind of machine's BLAS (3..15 rows take
# a slow kernel), the line t = 80 ms + 2.2 ms per row above 16.
CPU_LIKE = {1: 0.050, 2: 0.060, **{b: 0.150 + 0.004 * b for b in range(3, 16)}}
CPU_LIKE.update({b: 0.080 + 0.0022 * (b - 16) for b in range(16, 129)})


@dataclass(frozen=True)
class Scenario:
    """A simulated device and the SLO it is served under."""

    name: str
    label: str
    device: Callable[[], SimulatedModel]
    slo: float
    max_batch: int
    fixed_delay: float

    @property
    def peak(self) -> tuple[float, int]:
        """Offline peak items/s and the size giving it (exact: the device's own t(b))."""
        device = self.device()
        best = max(range(1, self.max_batch + 1), key=lambda b: b / device.seconds_for(b))
        return best / device.seconds_for(best), best


SCENARIOS = (
    Scenario(
        "linear",
        "t(b) = 30 ms + 2.5 ms*b, SLO 0.6 s, max batch 32 (the HTTP model's shape)",
        lambda: SimulatedModel(0.030, 0.0025),
        0.6,
        32,
        0.06,
    ),
    Scenario(
        "cpu-like",
        "non-monotone t(b) (8 rows cost more than 16) x 20% jitter, SLO 0.6 s, max batch 32",
        lambda: SimulatedModel(0.0, 0.0, costs=CPU_LIKE, jitter=0.2, seed=3),
        0.6,
        32,
        0.06,
    ),
    Scenario(
        "tight-slo",
        "t(b) = 30 ms + 2.5 ms*b, SLO 0.25 s, max batch 128: the SLO must bound the batch",
        lambda: SimulatedModel(0.030, 0.0025),
        0.25,
        128,
        0.06,
    ),
)


@dataclass
class PolicyResult:
    name: str
    label: str
    points: list[LoadPoint] = field(default_factory=list)
    best_rate: float = 0.0


def sim_batcher(policy: str, scenario: Scenario) -> Callable[[], tuple[Batcher, SimulatedModel]]:
    """A factory of fresh (batcher, device) pairs for one policy."""

    def make() -> tuple[Batcher, SimulatedModel]:
        device = scenario.device()
        size = 1 if policy == "no-batching" else scenario.max_batch
        delays = {"no-batching": 0.0, "fixed-delay": scenario.fixed_delay, "greedy": 0.0}
        # Triton's dynamic batcher has no deadline admission: the baselines run without it
        settings: dict = {"refuse_past_slo": policy == "adaptive"}
        if policy in delays:
            settings["policy"] = FixedDelayPolicy(delays[policy], size)
            settings["adaptive_cap"] = False
        metrics = BatcherMetrics(CollectorRegistry(), "sim", scenario.slo, size)
        batcher = Batcher(
            device,
            max_batch_size=size,
            slo_seconds=scenario.slo,
            max_queue=4096,
            default_timeout_seconds=10 * scenario.slo,
            metrics=metrics,
            **settings,
        )
        return batcher, device

    return make


def sweep_rates(
    result: PolicyResult, rates: list[float], slo: float, run: Callable[[float], LoadPoint]
) -> PolicyResult:
    """Run rates in order until two misses in a row (one alone may be noise)."""
    misses = 0
    for rate in rates:
        point = run(rate)
        result.points.append(point)
        ok = point.sustained(slo)
        print_point(result.name, point, ok)
        if ok:
            result.best_rate = max(result.best_rate, rate)
            misses = 0
        else:
            misses += 1
            if misses == 2:
                break
    return result


def grid_table(results: list[PolicyResult], peak: float, slo: float) -> dict:
    """Print the best grid rates with ratios; return them for the JSON."""
    no_batching = next((r.best_rate for r in results if r.name == "no-batching"), 0) or math.nan
    print(f"  grid: {'policy':<15} {'best rate/s':>11} {'vs peak':>8} {'vs no-batch':>11}")
    rows = []
    for r in results:
        rows.append(
            {
                "policy": r.name,
                "best_rate": r.best_rate,
                "vs_offline_peak": r.best_rate / peak,
                "vs_no_batching": r.best_rate / no_batching,
            }
        )
        print(
            f"        {r.name:<15} {r.best_rate:11.1f} {r.best_rate / peak:8.2f} "
            f"{r.best_rate / no_batching:11.2f}"
        )
    return {"slo_seconds": slo, "offline_peak": peak, "grid_summary": rows}


def p99_table(results: list[PolicyResult], peak: float, slo: float) -> None:
    """p99 latency per policy side by side at the grid's upper half, where the policies differ.

    A MISS mark is a rate not sustained (p99 over the SLO or over 1% errors); blank: not run
    (the sweep stops after two misses).
    """
    rates = sorted({p.rate for r in results for p in r.points if p.rate / peak >= 0.495})
    print("  p99 latency (ms) by offered rate:")
    print(f"  {'rate':>12} {'of peak':>8}" + "".join(f"{r.name:>16}" for r in results))
    for rate in rates:
        cells = []
        for r in results:
            point = next((p for p in r.points if p.rate == rate), None)
            if point is None:
                cells.append(f"{'':>16}")
            else:
                mark = "" if point.sustained(slo) else " MISS"
                cells.append(f"{point.p99 * 1000:>11.0f}{mark:<5}")
        print(f"  {rate:10.1f}/s {rate / peak:8.2f}" + "".join(cells))


def bracket(result: PolicyResult, peak: float) -> tuple[float, float]:
    """(last passing, first failing) grid rate around the policy's best; 5% above if none."""
    low = result.best_rate or min(p.rate for p in result.points)
    above = [p.rate for p in result.points if p.rate > low]  # never low: a bracket of width 0
    return low, min(above) if above else low + 0.05 * peak


def top_rate_search(
    low: float, high: float, resolution: float, ceiling: float = math.inf
) -> Generator[float, bool, float]:
    """Yield rates to try, be sent whether each was sustained; return the highest sustained.

    Bisection between ``low`` (expected to pass) and ``high`` (expected to fail), down to
    ``resolution``. Both ends are checked first: on a noisy machine the grid's bracket may not
    hold in a later repeat, and the bracket is then moved by its own width until it does.
    Returns 0 when nothing down to ``resolution`` is sustained, and ``ceiling`` when even that is:
    a short run (the smoke's few requests) can pass at any rate, and the search must end.
    """
    width = high - low
    while not (yield low):
        if low <= resolution:
            return 0.0
        low, high = max(resolution, low - width), low
    while (yield high):
        if high >= ceiling:
            return high
        low, high = high, min(ceiling, high + width)
    while high - low > resolution:
        middle = (low + high) / 2
        if (yield middle):
            low = middle
        else:
            high = middle
    return low


def interleaved_searches(
    searches: dict[str, Generator[float, bool, float]],
    run: Callable[[str, float], bool],
) -> dict[str, float]:
    """Advance every search one point at a time, in turn; the top rate each found, by name.

    Running the policies point by point in turn, rather than one search after the other, spreads
    any drift of the machine (a neighbour starting, thermal limits) over all of them alike.
    """
    pending = {name: next(search) for name, search in searches.items()}
    found: dict[str, float] = {}
    while pending:
        for name in list(pending):
            try:
                pending[name] = searches[name].send(run(name, pending[name]))
            except StopIteration as stop:
                found[name] = stop.value
                del pending[name]
    return found


def spread(values: list[float]) -> dict:
    """Median and range of repeated measurements, with the values themselves (for the JSON).

    No values (a ratio whose baseline sustained no rate in any repeat) give NaN, not a crash.
    """
    if not values:
        return {"values": values, "median": math.nan, "min": math.nan, "max": math.nan}
    return {
        "values": values,
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
    }


def top_rate_table(tops: dict[str, list[float]], peak: float, resolution: float) -> dict:
    """Print median and range of each policy's top rate, the paired ratios and the goals (of
    the policies in ``tops``, which must hold ``adaptive``)."""
    runs = len(tops["adaptive"])
    ran_unbatched = "no-batching" in tops
    no_batching = (statistics.median(tops["no-batching"]) if ran_unbatched else 0) or math.nan
    print(
        f"  top sustained rate, bisection to {resolution:.1%} of the peak, {runs} repeats:\n"
        f"        {'policy':<15} {'median/s':>9} {'min..max/s':>15} {'vs peak':>8} "
        f"{'vs no-batch':>11}"
    )
    rows = []
    for name in (p for p in POLICIES if p in tops):
        row = {"policy": name, **spread(tops[name])}
        row["vs_offline_peak"] = row["median"] / peak
        row["vs_no_batching"] = row["median"] / no_batching
        rows.append(row)
        print(
            f"        {name:<15} {row['median']:9.1f} {row['min']:7.1f}..{row['max']:<7.1f}"
            f"{row['vs_offline_peak']:8.3f} {row['vs_no_batching']:11.2f}"
        )
    ratios, verdicts = {}, {}
    for policy, base in ((p, b) for p, b in PAIRS if p in tops and b in tops):
        paired = [a / b for a, b in zip(tops[policy], tops[base], strict=True) if b > 0]
        ratio = spread(paired)
        # one bisection step on each side: a difference below it is not a difference
        tolerance = 2 * resolution * peak / max(statistics.median(tops[base]), 1e-9)
        if not paired:
            verdict = f"not compared: {base} sustained no rate"
        elif ratio["min"] > 1.0:
            verdict = "ahead in every repeat"
        elif ratio["median"] > 1.0 + tolerance:
            verdict = "ahead (median)"
        elif ratio["median"] >= 1.0 - tolerance:
            verdict = f"tied within the resolution (+-{tolerance:.1%})"
        else:
            verdict = "behind"
        pair = f"{policy}/{base}"
        ratios[pair] = {**ratio, "tolerance": tolerance, "verdict": verdict}
        verdicts[pair] = verdict
        print(
            f"        {pair:<32} median {ratio['median']:.3f} "
            f"range {ratio['min']:.3f}..{ratio['max']:.3f}  per repeat "
            + " ".join(f"{r:.3f}" for r in paired)
            + f": {verdict}"
        )
    adaptive = statistics.median(tops["adaptive"])
    goals = {"adaptive >= 0.85 offline peak": adaptive >= 0.85 * peak}
    if ran_unbatched:
        goals["adaptive >= 3x no batching"] = adaptive >= 3 * no_batching
    for base in ("fixed-delay", "greedy"):
        if f"adaptive/{base}" in verdicts:
            goals[f"adaptive ahead of {base}"] = verdicts[f"adaptive/{base}"].startswith("ahead")
    for goal, met in goals.items():
        print(f"  goal {goal}: {'met' if met else 'NOT met'}")
    return {"top_rates": rows, "ratios": ratios, "goals": goals}


def simulated_top_rates(
    scenario: Scenario,
    makers: dict[str, Callable[[], tuple[Batcher, SimulatedModel]]],
    brackets: dict[str, tuple[float, float]],
    args: argparse.Namespace,
) -> tuple[dict[str, list[float]], list[dict]]:
    """Each policy's top sustained rate once per seed; also every point the searches ran."""
    peak, _ = scenario.peak
    tops: dict[str, list[float]] = {policy: [] for policy in POLICIES}
    searched: list[dict] = []
    for seed in range(1, args.seeds + 1):
        # The same seed at every rate and for every policy: the same arrivals, scaled.
        def sustained(policy: str, rate: float, seed: int = seed) -> bool:
            point = simulate_point(makers[policy], rate, args.sim_requests, seed=1000 + seed)
            searched.append({"seed": seed, "policy": policy, **asdict(point)})
            return point.sustained(scenario.slo)

        found = interleaved_searches(
            {
                p: top_rate_search(*brackets[p], args.resolution * peak, SEARCH_CEILING * peak)
                for p in POLICIES
            },
            sustained,
        )
        for policy in POLICIES:
            tops[policy].append(found[policy])
        print(f"  seed {seed}: " + "  ".join(f"{p} {found[p]:.1f}/s" for p in POLICIES))
    return tops, searched


def simulated_section(args: argparse.Namespace) -> list[dict]:
    print("== 1. simulated device, virtual time (policy maths, independent of this machine)")
    out = []
    for scenario in SCENARIOS[:1] if args.smoke else SCENARIOS:
        peak, peak_b = scenario.peak
        print(f"{scenario.name}: {scenario.label}; offline peak {peak:.1f}/s at b={peak_b}")
        rates = sorted({round(f * peak, 1) for f in args.fractions})
        makers = {policy: sim_batcher(policy, scenario) for policy in POLICIES}
        results = []
        for policy in POLICIES:

            def run(rate: float, make=makers[policy]) -> LoadPoint:
                count = max(args.sim_requests // 4, min(args.sim_requests, int(rate * 20)))
                return simulate_point(make, rate, count, seed=int(rate * 100))

            results.append(sweep_rates(PolicyResult(policy, policy), rates, scenario.slo, run))
        table = grid_table(results, peak, scenario.slo)
        p99_table(results, peak, scenario.slo)
        brackets = {r.name: bracket(r, peak) for r in results}
        tops, searched = simulated_top_rates(scenario, makers, brackets, args)
        refined = top_rate_table(tops, peak, args.resolution)
        out.append(
            {
                "scenario": scenario.name,
                "label": scenario.label,
                "offline_peak_batch": peak_b,
                **table,
                **refined,
                "policies": [
                    {**asdict(r), "points": [asdict(p) for p in r.points]} for r in results
                ],
                "search_points": searched,
            }
        )
    return out


class Server:
    """One ``autoglm-batcher`` process on 127.0.0.1 with a free port, the model on one thread.

    ``model`` and ``device`` default to this benchmark's CPU model on the CPU (``auto`` would put
    it on a GPU where there is one); ``bench/batcher_gpu.py`` passes its own.
    """

    def __init__(self, args: list[str], model: str = MODEL, device: str = "cpu") -> None:
        self.process = BatcherProcess(
            ["--model", model, "--device", device, "--listen", "127.0.0.1:0",
             "--torch-threads", "1", *args]
        )  # fmt: skip
        self.port = self.process.port
        warmup = self.process.startup_record("warm-up timed the model") or {}
        self.warmup: dict[int, float] = {
            int(b): t for b, t in warmup.get("seconds_by_size", {}).items()
        }
        self.buckets: list[int] | None = warmup.get("pad_buckets")

    @property
    def peak(self) -> tuple[float, int]:
        """Offline peak from the server's own warm-up: max over b of b / t(b)."""
        best = max(self.warmup, key=lambda b: b / self.warmup[b])
        return best / self.warmup[best], best

    def batch_totals(self) -> tuple[float, float]:
        """(items, batches) executed so far, from the server's own metrics."""
        return histogram_totals(self.port, "autoglm_batcher_batch_size_items")

    def stop(self) -> None:
        self.process.stop()


def loadavg() -> str:
    """The 1, 5 and 15 minute load averages, as /proc/loadavg gives them."""
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def request_body(seed: int) -> bytes:
    row = np.random.default_rng(seed).normal(size=64).round(4).tolist()
    return json.dumps(
        {"inputs": [{"name": "input", "shape": [1, 64], "datatype": "FP32", "data": row}]}
    ).encode()


async def open_loop(
    url: str, rate: float, count: int, seed: int, request_timeout: float
) -> tuple[list[float], int, float]:
    """Send ``count`` requests at Poisson times; return OK latencies, failures, elapsed time."""
    rng = np.random.default_rng(seed)
    offsets = np.cumsum(rng.exponential(1.0 / rate, size=count))
    bodies = [request_body(i) for i in range(16)]
    latencies: list[float] = []
    errors = 0
    connector = aiohttp.TCPConnector(limit=CONNECTIONS)
    timeout = aiohttp.ClientTimeout(total=request_timeout)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time()

        async def one(i: int) -> None:
            nonlocal errors
            scheduled = start + offsets[i]
            await asyncio.sleep(max(0.0, scheduled - loop.time()))
            try:
                async with session.post(
                    url, data=bodies[i % 16], headers={"Content-Type": "application/json"}
                ) as reply:
                    await reply.read()
                    ok = reply.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if ok:
                latencies.append(loop.time() - scheduled)
            else:
                errors += 1

        await asyncio.gather(*(one(i) for i in range(count)))
        elapsed = loop.time() - start
    return latencies, errors, elapsed


def http_point(server: Server, rate: float, args: argparse.Namespace) -> LoadPoint:
    """One open-loop run at ``rate`` against ``server``; the batch sizes from its metrics."""
    url = f"http://127.0.0.1:{server.port}/v2/models/demo/infer"
    count = max(20, min(args.max_requests, int(rate * args.duration)))
    items, batches = server.batch_totals()
    latencies, errors, elapsed = asyncio.run(
        open_loop(url, rate, count, int(rate * 1000), args.request_timeout)
    )
    items_after, batches_after = server.batch_totals()
    served = batches_after - batches
    mean_batch = (items_after - items) / served if served else 0.0
    return summarize(rate, latencies, errors, elapsed, mean_batch)


def print_point(name: str, point: LoadPoint, ok: bool) -> None:
    print(
        f"  {name:<15} rate {point.rate:7.1f}/s  thr {point.throughput:7.1f}/s  "
        f"p50 {point.p50 * 1000:7.1f} ms  p99 {point.p99 * 1000:7.1f} ms  "
        f"batch {point.mean_batch:5.1f}  err {point.errors:4d}  {'ok' if ok else 'MISS'}",
        flush=True,
    )


def http_plans(args: argparse.Namespace) -> tuple[dict[str, list[str]], dict[str, str]]:
    """Command-line flags and a label for each policy's server."""
    mb = ["--max-batch-size", str(args.max_batch_size)]
    # Triton's dynamic batcher has no deadline admission: the baselines run without it
    off = "--no-refuse-past-slo"
    fixed = ["--policy", "fixed-delay", off, *mb, "--max-queue-delay-seconds"]
    plans = {
        "no-batching": ["--policy", "fixed-delay", off, "--max-batch-size", "1"],
        "fixed-delay": [*fixed, str(args.fixed_delay)],
        "greedy": [*fixed, "0"],
        NO_ADMISSION: ["--policy", "adaptive", off, *mb],
        "adaptive": ["--policy", "adaptive", "--refuse-past-slo", *mb],
    }
    labels = {
        "no-batching": "fixed-delay policy, max batch 1, no delay",
        "fixed-delay": f"Triton-style: max_queue_delay {args.fixed_delay * 1000:.0f} ms, "
        f"preferred size {args.max_batch_size}, padding from the warm-up",
        "greedy": f"Triton's default max_queue_delay 0, preferred size {args.max_batch_size}: "
        "whatever waits when the device frees",
        NO_ADMISSION: "ablation: this runtime with SLO admission off (the dispatch rule alone)",
        "adaptive": "this runtime: keep-up/self-clocking/deadline dispatch, cost-model cap, "
        "padding from the warm-up, SLO admission (refuses what would finish past the deadline)",
    }
    return plans, labels


def server_settings(args: argparse.Namespace) -> list[str]:
    """Flags every benchmarked server shares: SLO, model name, timeout, warm-up."""
    return [
        *("--slo-seconds", str(args.slo), "--model-name", "demo"),
        *("--default-timeout-seconds", str(args.request_timeout)),
        *("--warmup-repeats", str(args.warmup_repeats)),
    ]


def http_section(
    args: argparse.Namespace,
    model: str = MODEL,
    device: str = "cpu",
    fractions: tuple[float, ...] = RATE_FRACTIONS,
    policies: tuple[str, ...] = POLICIES,
) -> dict:
    """The HTTP sweep and the interleaved top-rate rounds; ``bench/batcher_gpu.py`` reuses it
    (its smoke with two of the ``policies``; ``adaptive`` is always one)."""
    print(f"== HTTP, {model} on {device}, one torch thread per server (this machine, now)")
    common = server_settings(args)
    plans, labels = http_plans(args)
    servers: dict[str, Server] = {}
    peaks: dict[str, dict] = {}
    loads: dict[str, list[str]] = {}
    try:
        for name in policies:  # one after the other: warm-ups must not overlap
            servers[name] = server = Server([*common, *plans[name]], model, device)
            url = f"http://127.0.0.1:{server.port}/v2/models/demo/infer"
            # open connections: 20 requests over 2 s, or over one point's duration when shorter
            warm_rate = 20 / min(2.0, args.duration)
            asyncio.run(open_loop(url, warm_rate, 20, 0, args.request_timeout))
            if name != "no-batching":
                peak, peak_b = server.peak
                peaks[name] = {
                    "seconds_by_size": server.warmup,
                    "peak": peak,
                    "peak_batch": peak_b,
                    "pad_buckets": server.buckets,
                }
                print(
                    f"{name} warm-up: "
                    + "  ".join(f"t({b})={t * 1000:.1f}ms" for b, t in server.warmup.items())
                    + f"; peak {peak:.1f}/s at b={peak_b}; pad buckets {server.buckets}"
                )
        peak = max(p["peak"] for p in peaks.values())
        rates = sorted({round(f * peak, 1) for f in fractions})
        print(f"SLO p99 <= {args.slo * 1000:.0f} ms; offline peak {peak:.1f}/s (best warm-up)")
        results: dict[str, PolicyResult] = {}
        for name in policies:
            print(f"{name}: {labels[name]}", flush=True)
            before = loadavg()
            results[name] = sweep_rates(
                PolicyResult(name, labels[name]),
                rates,
                args.slo,
                lambda rate, server=servers[name]: http_point(server, rate, args),
            )
            loads[f"grid {name}"] = [before, loadavg()]
            print(f"  load average before/after: {before} / {loads[f'grid {name}'][1]}")
        ordered = [results[n] for n in policies]
        table = grid_table(ordered, peak, args.slo)
        p99_table(ordered, peak, args.slo)
        brackets = {r.name: bracket(r, peak) for r in ordered}
        tops: dict[str, list[float]] = {policy: [] for policy in policies}
        searched: list[dict] = []
        for round_index in range(1, args.rounds + 1):
            print(f"round {round_index}: the policies interleaved point by point", flush=True)
            before = loadavg()

            def sustained(name: str, rate: float, round_index: int = round_index) -> bool:
                point = http_point(servers[name], rate, args)
                ok = point.sustained(args.slo)
                print_point(name, point, ok)
                searched.append({"round": round_index, "policy": name, **asdict(point)})
                return ok

            found = interleaved_searches(
                {
                    p: top_rate_search(*brackets[p], args.resolution * peak, SEARCH_CEILING * peak)
                    for p in policies
                },
                sustained,
            )
            for policy in policies:
                tops[policy].append(found[policy])
            loads[f"round {round_index}"] = [before, loadavg()]
            print(
                f"  round {round_index}: "
                + "  ".join(f"{p} {found[p]:.1f}/s" for p in policies)
                + f"; load average before/after {before} / {loadavg()}"
            )
    finally:
        for server in servers.values():
            server.stop()
    refined = top_rate_table(tops, peak, args.resolution)
    return {
        "model": model,
        "device": device,
        "torch_threads": 1,
        "max_batch_size": args.max_batch_size,
        "warmups": peaks,
        "load_average": loads,
        **table,
        **refined,
        "policies": [{**asdict(r), "points": [asdict(p) for p in r.points]} for r in ordered],
        "search_points": searched,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=str(ROOT / "bench/results/batcher.json"))
    parser.add_argument("--only", choices=("sim", "http"), help="run one section")
    parser.add_argument("--slo", type=float, default=0.6, help="HTTP: p99 latency SLO, seconds")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--fixed-delay", type=float, default=0.06, help="baseline's max delay, s")
    parser.add_argument("--duration", type=float, default=8.0, help="HTTP: seconds per rate")
    parser.add_argument("--max-requests", type=int, default=2000, help="HTTP: cap per rate")
    parser.add_argument("--request-timeout", type=float, default=5.0, help="HTTP: per request")
    parser.add_argument("--warmup-repeats", type=int, default=7, help="HTTP: server warm-up")
    parser.add_argument("--sim-requests", type=int, default=6000, help="sim: cap per rate")
    parser.add_argument("--seeds", type=int, default=5, help="sim: top-rate searches, one a seed")
    parser.add_argument("--rounds", type=int, default=3, help="HTTP: interleaved top-rate rounds")
    parser.add_argument(
        "--resolution", type=float, default=0.01, help="top-rate bisection step, of the peak"
    )
    parser.add_argument("--quick", action="store_true", help="short run")
    parser.add_argument("--smoke", action="store_true", help="tiny run, figures meaningless")
    args = parser.parse_args(argv)
    args.fractions = SMOKE_FRACTIONS if args.smoke else RATE_FRACTIONS
    if args.quick:
        args.duration, args.max_requests, args.sim_requests = 3.0, 400, 1500
        args.seeds, args.rounds, args.resolution = 2, 1, 0.02
    if args.smoke:
        args.duration, args.max_requests, args.sim_requests = 1.0, 60, 600
        args.seeds, args.rounds, args.resolution, args.warmup_repeats = 1, 1, 0.5, 2

    out = Path(args.json)
    report: dict = {}
    if args.only and out.exists():  # one section re-run: keep the other one's results
        report = json.loads(out.read_text())
    report["load_average_at_start"] = loadavg()
    print(f"load average at start: {report['load_average_at_start']}")
    if args.only in (None, "sim"):
        report["simulated"] = simulated_section(args)
    if args.only in (None, "http"):
        model = SMOKE_MODEL if args.smoke else MODEL
        report["http"] = http_section(args, model, fractions=args.fractions)
    write_report(out, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
