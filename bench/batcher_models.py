"""Two models on one batcher process and one device: does a burst on one starve the other?

The goal (issue 18, "Several models on one device"): with two models served by one process, a
burst on one of them leaves the other with at least 99% of its requests answered within its SLO.

Section 1, simulated: two engines on one :class:`~batcher.device.SharedDevice` over simulated
devices (model "bursty": t(b) = 20 ms + 2 ms·b; model "steady": t(b) = 5 ms + 1 ms·b; SLO 150 ms
each) in virtual time: exact, deterministic, independent of this machine. "steady" gets a Poisson
stream at a fixed rate; "bursty" gets a calm stream, then a burst at ``--burst`` times its own
peak, then calm again. Three runs: steady alone, both without the burst, both with it.

Section 2, in process: the same two engines and shared device in real time, with stand-in
devices that sleep a batch's time on their own threads without holding the CPU, as a GPU kernel
does (``bench/sleeping_models.py``): what the scheduling achieves on this machine's clock and
threads, without the HTTP path's CPU cost.

Section 3, HTTP: one ``autoglm-batcher --model-repository`` process serving those stand-ins, so
the device and not the CPU of this small machine is what the burst saturates. The same three
phases with open-loop Poisson clients; latency is measured from each request's scheduled send
time. "bursty"'s peak is read from the server's own fitted cost (``cost_fixed_seconds`` and
``cost_per_item_seconds`` at its largest batch); the rates sent to it are capped at
``--max-rate``, what one loopback client and server carry on a small machine.

Per phase and model it reports requests sent, answered, refused (429) and the share answered
within the SLO, with p50 and p99 of the answered ones. The goal is "steady"'s share within the
SLO in the burst phase.

    nice -n 15 python bench/batcher_models.py           # all three sections, about 5 minutes
    nice -n 15 python bench/batcher_models.py --smoke   # under a minute; figures meaningless

Writes JSON to ``bench/results/batcher_models.json`` (``--json``); the load average is recorded
with every HTTP phase: on a loaded machine the HTTP figures say little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import random
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder comes first on sys.path and ``bench/batcher.py`` would
# shadow the ``batcher`` package; import from the repository root instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402
import numpy as np  # noqa: E402
from prometheus_client import CollectorRegistry  # noqa: E402

from batcher.device import SharedDevice  # noqa: E402
from batcher.engine import Batcher  # noqa: E402
from batcher.errors import Rejected  # noqa: E402
from batcher.execution import ThreadExecutor  # noqa: E402
from batcher.metrics import BatcherMetrics  # noqa: E402
from batcher.models.simulated import SimPayload, SimulatedModel  # noqa: E402
from batcher.simulation import VirtualTimeLoop  # noqa: E402
from bench.batcher_process import BatcherProcess  # noqa: E402
from bench.sleeping_models import FEATURES, SleepingModel  # noqa: E402

GOAL = 0.99  # share of the steady model's requests within its SLO during the burst
MODELS = ("bursty", "steady")
PHASES = ("steady alone", "both calm", "burst on bursty")


@dataclass
class Outcomes:
    """What one model's clients saw in one phase."""

    slo: float
    latencies: list[float] = field(default_factory=list)  # answered requests
    refused: int = 0  # 429: refused at admission
    failed: int = 0  # any other error

    @property
    def sent(self) -> int:
        return len(self.latencies) + self.refused + self.failed

    def summary(self) -> dict:
        answered = sorted(self.latencies)
        within = sum(1 for x in answered if x <= self.slo)

        def quantile(q: float) -> float | None:
            return float(np.quantile(answered, q)) if answered else None

        return {
            "sent": self.sent,
            "answered": len(answered),
            "refused": self.refused,
            "failed": self.failed,
            "within_slo": within / self.sent if self.sent else None,
            "p50_seconds": quantile(0.5),
            "p99_seconds": quantile(0.99),
            "slo_seconds": self.slo,
        }


def rate_plan(
    calm: float, burst: float, calm_s: float, burst_s: float
) -> list[tuple[float, float]]:
    """(rate, seconds) pieces of the bursty model's stream; burst 0: calm throughout."""
    if burst <= 0:
        return [(calm, 2 * calm_s + burst_s)]
    return [(calm, calm_s), (burst, burst_s), (calm, calm_s)]


def arrival_times(plan: list[tuple[float, float]], seed: int) -> list[float]:
    """Poisson arrival offsets (seconds from the start) for piecewise-constant rates."""
    rng = random.Random(seed)
    times: list[float] = []
    start = 0.0
    for rate, seconds in plan:
        t = start
        while rate > 0:
            t += rng.expovariate(rate)
            if t >= start + seconds:
                break
            times.append(t)
        start += seconds
    return times


# --- sections 1 and 2: the engines alone, in virtual time and in real time ------------------------


def engine_phase(phase: str, args: argparse.Namespace, real: bool) -> dict[str, dict]:
    """One phase against two engines on one shared device, with no HTTP in between.

    Virtual time: simulated devices on a virtual clock, seeded with their exact costs. Real time:
    the sleeping stand-in devices on their own threads (as the server runs a model), timed by the
    warm-up as the server does, on this machine's clock.
    """
    slo = args.sim_slo
    costs = {"bursty": (0.020, 0.002), "steady": (0.005, 0.001)}
    peak = 32 / (costs["bursty"][0] + 32 * costs["bursty"][1])

    async def engine(name: str, device: SharedDevice) -> Batcher:
        metrics = BatcherMetrics(CollectorRegistry(), name, slo, 32)
        fixed, per_row = costs[name]
        executor: ThreadExecutor | SimulatedModel = (
            ThreadExecutor(SleepingModel(fixed, per_row))
            if real
            else SimulatedModel(fixed, per_row)
        )
        batcher = Batcher(
            executor, max_batch_size=32, slo_seconds=slo, metrics=metrics, device=device
        )
        sizes = (1, 2, 4, 8, 16, 32)
        if real:
            rows = lambda n: [{"input": np.zeros((n, FEATURES), np.float32)}]  # noqa: E731
            await batcher.calibrate(rows, sizes, 3)
        else:
            for size in sizes:  # what a warm-up measures on a simulated device
                for _ in range(3):
                    batcher.cost.observe(size, fixed + per_row * size)
        await batcher.start()
        return batcher

    def payload(i: int) -> object:
        return {"input": np.zeros((1, FEATURES), np.float32)} if real else SimPayload(i)

    async def main() -> dict[str, dict]:
        device = SharedDevice()
        loop = asyncio.get_running_loop()
        engines = {name: await engine(name, device) for name in MODELS}
        outcomes = {name: Outcomes(slo) for name in MODELS}
        total = 2 * args.calm_seconds + args.burst_seconds
        plans = {
            "steady": [(args.steady_rate, total)],
            "bursty": rate_plan(
                args.calm_fraction * peak,
                args.burst * peak if phase == "burst on bursty" else 0.0,
                args.calm_seconds,
                args.burst_seconds,
            ),
        }
        if phase == "steady alone":
            plans["bursty"] = []
        start = loop.time() + 0.1

        async def one(name: str, i: int, at: float) -> None:
            scheduled = start + at
            await asyncio.sleep(max(0.0, scheduled - loop.time()))
            try:
                await engines[name].submit(payload(i))
            except Rejected:
                outcomes[name].refused += 1
                return
            except Exception:
                outcomes[name].failed += 1
                return
            outcomes[name].latencies.append(loop.time() - scheduled)

        tasks = [
            one(name, i, at)
            for seed, name in enumerate(MODELS)
            for i, at in enumerate(arrival_times(plans[name], seed + 1))
        ]
        await asyncio.gather(*tasks)
        for batcher in engines.values():
            await batcher.drain()
        return {name: o.summary() for name, o in outcomes.items() if o.sent}

    logging.getLogger("batcher").setLevel(logging.ERROR)  # the engines' notes would flood the table
    if real:
        return asyncio.run(main())
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


# --- section 3: HTTP -----------------------------------------------------------------------------


class RepositoryServer:
    """One ``autoglm-batcher --model-repository`` process on 127.0.0.1 with a free port."""

    def __init__(self, folder: Path, args: argparse.Namespace) -> None:
        self.process = BatcherProcess(
            [
                "--model-repository", str(folder),
                "--device", "cpu",
                "--torch-threads", "1",
                "--listen", "127.0.0.1:0",
                "--warmup-repeats", str(args.warmup_repeats),
            ],
            start_timeout=600,
        )  # fmt: skip
        self.port = self.process.port

    def gauge(self, name: str, model: str) -> float:
        async def get() -> str:
            url = f"http://127.0.0.1:{self.port}/metrics"
            async with aiohttp.ClientSession() as session, session.get(url) as reply:
                return await reply.text()

        prefix = f'autoglm_batcher_{name}{{model="{model}"}} '
        for line in asyncio.run(get()).splitlines():
            if line.startswith(prefix):
                return float(line[len(prefix) :])
        raise RuntimeError(f"no {prefix.strip()} series")

    def stop(self) -> None:
        self.process.stop()


def write_repository(folder: Path, args: argparse.Namespace) -> None:
    for name in MODELS:
        (folder / name).mkdir()
        (folder / name / "config.yaml").write_text(
            f"model: bench.sleeping_models:{name}\nmax_batch_size: 32\n"
            f"slo_seconds: {args.http_slo}\n"
        )
    args.features = {name: FEATURES for name in MODELS}


async def http_phase_async(port: int, plans: dict, slo: float, features: dict) -> dict[str, dict]:
    outcomes = {name: Outcomes(slo) for name in plans}
    bodies = {
        name: json.dumps(
            {"inputs": [{"name": "input", "shape": [1, n], "datatype": "FP32", "data": [0.5] * n}]}
        ).encode()
        for name, n in features.items()
    }
    connector = aiohttp.TCPConnector(limit=256)
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        loop = asyncio.get_running_loop()
        start = loop.time() + 0.2

        async def one(name: str, at: float) -> None:
            scheduled = start + at
            await asyncio.sleep(max(0.0, scheduled - loop.time()))
            url = f"http://127.0.0.1:{port}/v2/models/{name}/infer"
            try:
                async with session.post(
                    url, data=bodies[name], headers={"Content-Type": "application/json"}
                ) as reply:
                    await reply.read()
                    status = reply.status
            except (aiohttp.ClientError, TimeoutError):
                status = 0
            if status == 200:
                outcomes[name].latencies.append(loop.time() - scheduled)
            elif status == 429:
                outcomes[name].refused += 1
            else:
                outcomes[name].failed += 1

        await asyncio.gather(
            *(
                one(name, at)
                for seed, (name, plan) in enumerate(plans.items())
                for at in arrival_times(plan, seed + 11)
            )
        )
    return {name: o.summary() for name, o in outcomes.items() if o.sent}


def http_section(args: argparse.Namespace) -> dict:
    with tempfile.TemporaryDirectory() as folder:
        write_repository(Path(folder), args)
        server = RepositoryServer(Path(folder), args)
        try:
            fixed = server.gauge("cost_fixed_seconds", "bursty")
            per_item = server.gauge("cost_per_item_seconds", "bursty")
            peak = 32 / (fixed + 32 * per_item)
            print(f"bursty: t(b) = {fixed * 1e3:.1f} ms + {per_item * 1e3:.2f} ms·b, ", end="")
            print(f"peak {peak:.0f}/s; HTTP rates capped at {args.max_rate:.0f}/s")
            total = 2 * args.calm_seconds + args.burst_seconds
            phases = {}
            for phase in PHASES:
                plans = {"steady": [(args.steady_rate, total)]}
                if phase != "steady alone":
                    burst = args.burst * peak if phase == "burst on bursty" else 0.0
                    plans["bursty"] = rate_plan(
                        min(args.calm_fraction * peak, args.max_rate / 4),
                        min(burst, args.max_rate),
                        args.calm_seconds,
                        args.burst_seconds,
                    )
                load_before = loadavg()
                rows = asyncio.run(
                    http_phase_async(server.port, plans, args.http_slo, args.features)
                )
                phases[phase] = {"models": rows, "loadavg": [load_before, loadavg()]}
            return {"bursty_peak_per_second": peak, "phases": phases}
        finally:
            server.stop()


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def print_table(title: str, phases: dict[str, dict[str, dict]]) -> None:
    print(f"\n{title}")
    header = (
        f"{'phase':<18} {'model':<7} {'sent':>6} {'ok':>6} {'429':>5} {'err':>4} "
        f"{'in SLO':>7} {'p50 ms':>7} {'p99 ms':>7}"
    )
    print(header)
    print("-" * len(header))
    for phase, models in phases.items():
        for name, row in models.items():
            within = "-" if row["within_slo"] is None else f"{100 * row['within_slo']:.1f}%"
            p50 = "-" if row["p50_seconds"] is None else f"{1e3 * row['p50_seconds']:.1f}"
            p99 = "-" if row["p99_seconds"] is None else f"{1e3 * row['p99_seconds']:.1f}"
            print(
                f"{phase:<18} {name:<7} {row['sent']:>6} {row['answered']:>6} "
                f"{row['refused']:>5} {row['failed']:>4} {within:>7} {p50:>7} {p99:>7}"
            )


def verdict(phases: dict[str, dict[str, dict]]) -> dict:
    steady = phases["burst on bursty"]["steady"]
    alone = phases["steady alone"]["steady"]
    return {
        "steady_within_slo_under_burst": steady["within_slo"],
        "steady_within_slo_alone": alone["within_slo"],
        "goal": GOAL,
        "met": steady["within_slo"] is not None and steady["within_slo"] >= GOAL,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=str(ROOT / "bench/results/batcher_models.json"))
    parser.add_argument("--only", choices=("sim", "process", "http"), help="run one section")
    parser.add_argument("--burst", type=float, default=2.0, help="burst rate / bursty's peak")
    parser.add_argument("--calm-fraction", type=float, default=0.3, help="calm rate / its peak")
    parser.add_argument("--calm-seconds", type=float, default=10.0, help="before and after")
    parser.add_argument("--burst-seconds", type=float, default=10.0, help="length of the burst")
    parser.add_argument("--steady-rate", type=float, default=40.0, help="steady's requests/s")
    parser.add_argument(
        "--sim-slo", type=float, default=0.15, help="sim and in-process: SLO of both, seconds"
    )
    parser.add_argument("--http-slo", type=float, default=0.15, help="HTTP: SLO of both, seconds")
    parser.add_argument("--warmup-repeats", type=int, default=3, help="HTTP: server warm-up")
    parser.add_argument(
        "--max-rate",
        type=float,
        default=400.0,
        help="HTTP: highest request rate sent to bursty (what one loopback client carries)",
    )
    parser.add_argument("--smoke", action="store_true", help="under a minute; figures meaningless")
    args = parser.parse_args(argv)
    if args.smoke:
        args.calm_seconds, args.burst_seconds, args.warmup_repeats = 0.5, 1.0, 1
        args.max_rate = 300.0
    report: dict = {
        "settings": vars(args).copy(),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": loadavg()},
    }
    if args.only in (None, "sim"):
        simulated = {phase: engine_phase(phase, args, real=False) for phase in PHASES}
        print_table("simulated (virtual time, exact)", simulated)
        report["simulated"] = {"phases": simulated, "verdict": verdict(simulated)}
        print(f"simulated verdict: {report['simulated']['verdict']}")
    if args.only in (None, "process"):
        in_process = {phase: engine_phase(phase, args, real=True) for phase in PHASES}
        print_table(f"in process (real time, no HTTP; load average {loadavg()})", in_process)
        report["in_process"] = {"phases": in_process, "verdict": verdict(in_process)}
        print(f"in-process verdict: {report['in_process']['verdict']}")
    if args.only in (None, "http"):
        http = http_section(args)
        print_table(
            f"HTTP (one process, CPU; load average {loadavg()})",
            {phase: row["models"] for phase, row in http["phases"].items()},
        )
        http["verdict"] = verdict({p: r["models"] for p, r in http["phases"].items()})
        report["http"] = http
        print(f"HTTP verdict: {http['verdict']}")
    report["machine"]["loadavg_end"] = loadavg()
    path = Path(args.json)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=2))
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
