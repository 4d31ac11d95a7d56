"""Best-effort backfill on the real batcher: online p99 with and without a saturating job.

The question (issue 14, "Real batcher"): with a best-effort job filling the capacity online
requests leave idle, does the online tail stay where it was (p99 within 1.1x of the same load
alone), and is the device then busy (at least 90% of the time)?

Section 1, simulated: the engine itself against a simulated device shaped like the HTTP model
(t(b) = 50 ms + 6 ms·b, 10% seeded jitter) on a virtual clock (:mod:`batcher.simulation`): exact,
deterministic and independent of this machine's load, so it shows the scheduling rules alone. It
also varies the quantum (the default tenth of the SLO, a quarter, and none at all: best-effort
batches up to the maximum size) to show what the quantum buys. The job there is 32 closed-loop
clients that wait out each refusal's ``Retry-After`` rounded up to whole seconds, as HTTP carries
it.

Section 2, HTTP: one ``autoglm-batcher`` process serves the torch CPU MLP of ``bench/batcher.py``
(``batcher.models.demo:bench_factory``, one torch thread, so the model holds one core). For each
online rate (a fraction of the offline peak that the server's own warm-up measured) and each round
it runs two phases on the same server, in alternating order so drift in this shared machine's load
hits both alike:

* **alone**: an open-loop Poisson stream of one-row online requests (latency from the scheduled
  send time, as ``bench/batcher.py`` measures it);
* **with job**: the same stream (same seed) while a separate process runs ``--job-clients``
  closed-loop best-effort clients (``"parameters": {"priority": "best-effort"}``) that never run
  dry and wait out each 429's ``Retry-After``.

Per phase it reports the online p50/p99 and failures (client side), and from the server's own
counters over the phase: the device busy share (``device_busy_seconds_total`` over wall time),
split by class, best-effort requests served and refused by reason, and the controller's share at
the end. The summary gives per rate the median p99 of each phase, the paired p99 ratio per round
(with job / alone), the median busy share with the job, and the worst case a non-preemptible
device allows: an online request that arrives as a best-effort batch starts waits up to that
batch's time, at least t(1), so were the p99 request always to meet one the ratio would be
1 + t(1)/p99 (only the requests arriving during a best-effort batch wait, so the tail grows less).

    nice -n 15 python bench/batcher_backfill.py            # both sections, about 8 minutes
    nice -n 15 python bench/batcher_backfill.py --only sim # the simulated section (a minute)
    nice -n 15 python bench/batcher_backfill.py --smoke    # under a minute; figures meaningless

Writes JSON to ``bench/results/batcher_backfill.json`` (``--json``). The machine is shared: the
load average is recorded around every phase; on a loaded machine the figures say little.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from types import ModuleType

import aiohttp
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder comes first on sys.path and ``bench/batcher.py`` would
# shadow the ``batcher`` package; import from the repository root instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))
P99_GOAL = 1.1  # online p99 with the job, as a multiple of the same load alone
BUSY_GOAL = 0.9  # device busy share with the job


bench: ModuleType  # bench/batcher.py, imported by the measuring process only (it loads torch,
# which the job's process, started mid-run on a busy machine, should not wait for)


# --- the best-effort job (its own process, so its CPU does not slow the online client) ------------


def job_body(rows: int) -> bytes:
    data = np.random.default_rng(rows).normal(size=(rows, 64)).round(4).ravel().tolist()
    return json.dumps(
        {
            "inputs": [{"name": "input", "shape": [rows, 64], "datatype": "FP32", "data": data}],
            "parameters": {"priority": "best-effort"},
        }
    ).encode()


async def job_clients(url: str, clients: int, rows: int) -> None:
    """Closed-loop best-effort clients until SIGTERM; a refusal waits its Retry-After."""
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    body = job_body(rows)
    counts = {"ok": 0, "refused": 0, "timed_out": 0, "failed": 0}
    timeout = aiohttp.ClientTimeout(total=60)
    connector = aiohttp.TCPConnector(limit=clients)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        print("sending", flush=True)

        async def client() -> None:
            while not stop.is_set():
                try:
                    async with session.post(url, data=body, headers=headers) as reply:
                        await reply.read()
                        status, retry = reply.status, reply.headers.get("Retry-After")
                except (aiohttp.ClientError, TimeoutError):
                    status, retry = 0, None
                if status == 200:
                    counts["ok"] += 1
                    continue
                outcome = {429: "refused", 503: "refused", 504: "timed_out"}.get(status, "failed")
                counts[outcome] += 1  # 504: accepted, then throttled past its timeout
                wait = float(retry) if retry else 1.0
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)

        await asyncio.gather(*(client() for _ in range(clients)))
    print(json.dumps(counts), flush=True)


class Job:
    """The best-effort job: this script in ``--job-client`` mode, in its own process."""

    def __init__(self, url: str, clients: int, rows: int) -> None:
        self.proc = subprocess.Popen(
            [
                *(sys.executable, __file__, "--job-client", url),
                *("--job-clients", str(clients), "--job-rows", str(rows)),
            ],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "sending":
            raise RuntimeError("the best-effort job did not start")

    def stop(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=120)
        lines = out.strip().splitlines()
        return json.loads(lines[-1]) if lines else {}


# --- section 1: simulated ------------------------------------------------------------------------

SIM_FIXED, SIM_PER_ITEM = 0.050, 0.006  # shaped like bench_factory on one quiet CPU thread
SIM_QUANTA = {"default (0.1 SLO)": 0.0, "0.25 SLO": 0.25, "none": 1.0}  # fraction of the SLO
SIM_JOB_CLIENTS = 32


async def simulated_job(batcher: object, stop: asyncio.Event) -> int:
    """Closed-loop best-effort clients until ``stop``; returns the items they got served."""
    from batcher.errors import BatcherError, Rejected
    from batcher.models.simulated import SimPayload

    served = 0

    async def client(c: int) -> None:
        nonlocal served
        i = 0
        while not stop.is_set():
            i += 1
            try:
                await batcher.submit(SimPayload(-(c * 1_000_000 + i)), priority="best-effort")
                served += 1
            except Rejected as exc:
                wait = max(1, math.ceil(exc.retry_after or 1.0))  # HTTP's whole seconds
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), wait)
            except BatcherError:
                pass

    await asyncio.gather(*(client(c) for c in range(SIM_JOB_CLIENTS)))
    return served


def simulated_point(rate: float, seconds: float, slo: float, quantum: float | None) -> dict:
    """Online Poisson load for ``seconds`` of virtual time; beside a job unless ``quantum`` is
    None (a fraction of the SLO; 0: the default)."""
    from prometheus_client import CollectorRegistry

    from batcher.engine import Batcher
    from batcher.metrics import BatcherMetrics
    from batcher.models.simulated import SimPayload, SimulatedModel
    from batcher.simulation import poisson_load, run_in_virtual_time, summarize

    async def main() -> dict:
        model = SimulatedModel(SIM_FIXED, SIM_PER_ITEM, jitter=0.1, seed=3)
        metrics = BatcherMetrics(CollectorRegistry(), "sim", slo, 32)
        batcher = Batcher(
            model,
            max_batch_size=32,
            slo_seconds=slo,
            best_effort_quantum_seconds=(quantum or 0.0) * slo,
            metrics=metrics,
        )
        await batcher.calibrate(lambda n: [SimPayload(-1, size=n)], (1, 2, 4, 8, 16, 32), 3)
        await batcher.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        job = asyncio.create_task(simulated_job(batcher, stop)) if quantum is not None else None
        busy_before = metrics.busy_seconds._value.get()
        best_before = metrics.class_busy_seconds.labels("sim", "best_effort")._value.get()
        start = loop.time()
        latencies, failures = await poisson_load(batcher, rate, int(rate * seconds), seed=11)
        elapsed = loop.time() - start
        busy = metrics.busy_seconds._value.get() - busy_before
        best = metrics.class_busy_seconds.labels("sim", "best_effort")._value.get() - best_before
        stop.set()
        served = await job if job is not None else 0
        await batcher.drain()
        point = summarize(rate, latencies, failures, elapsed, 0.0)
        return {
            "p99_seconds": point.p99,
            "online_failed": failures,
            "busy_share": busy / elapsed,
            "best_effort_busy_share": best / elapsed,
            "best_effort_items": served,
            "quantum_seconds": batcher.quantum,
        }

    return run_in_virtual_time(main)


def simulated_section(fractions: list[float], seconds: float, slo: float) -> list[dict]:
    print(
        f"== simulated: t(b) = {SIM_FIXED * 1000:.0f} ms + {SIM_PER_ITEM * 1000:.0f} ms*b, "
        f"SLO {slo * 1000:.0f} ms, {seconds:.0f} s of virtual time per point",
        flush=True,
    )
    peak = 32 / (SIM_FIXED + SIM_PER_ITEM * 32)
    print(
        f"{'fraction':>8} {'quantum':>18} {'p99 alone':>10} {'p99 job':>9} {'ratio':>6} "
        f"{'busy alone':>10} {'busy job':>9} {'be busy':>8}"
    )
    rows = []
    for fraction in fractions:
        alone = simulated_point(fraction * peak, seconds, slo, None)
        for name, quantum in SIM_QUANTA.items():
            mixed = simulated_point(fraction * peak, seconds, slo, quantum)
            row = {
                "fraction": fraction,
                "rate": fraction * peak,
                "quantum": name,
                "alone": alone,
                "with_job": mixed,
                "p99_ratio": mixed["p99_seconds"] / alone["p99_seconds"],
            }
            rows.append(row)
            print(
                f"{fraction:8.2f} {name:>18} {alone['p99_seconds'] * 1000:8.1f}ms "
                f"{mixed['p99_seconds'] * 1000:7.1f}ms {row['p99_ratio']:6.2f} "
                f"{alone['busy_share']:10.2f} {mixed['busy_share']:9.2f} "
                f"{mixed['best_effort_busy_share']:8.2f}",
                flush=True,
            )
    return rows


# --- section 2: HTTP, the server's own counters ------------------------------------------------


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """Every sample of the server's /metrics, keyed by (name, labels without ``model``)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model"))
            found[(sample.name, labels)] = sample.value
    return found


def delta(before: dict, after: dict, name: str, **labels: str) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


# --- phases ------------------------------------------------------------------------------------


def phase(
    server: object, rate: float, seconds: float, seed: int, job: Job | None, timeout: float
) -> dict:
    """One open-loop online phase; the server's counters are read around it."""
    url = f"http://127.0.0.1:{server.port}/v2/models/demo/infer"
    load_before = bench.loadavg()
    before = scrape(server.port)
    started = time.monotonic()
    latencies, errors, _ = asyncio.run(
        bench.open_loop(url, rate, max(20, int(rate * seconds)), seed, timeout)
    )
    wall = time.monotonic() - started
    after = scrape(server.port)
    point = bench.summarize(rate, latencies, errors, wall, 0.0)
    busy = delta(before, after, "autoglm_batcher_device_busy_seconds_total")
    online = delta(before, after, "autoglm_batcher_class_busy_seconds_total", **{"class": "online"})
    best = delta(
        before, after, "autoglm_batcher_class_busy_seconds_total", **{"class": "best_effort"}
    )
    served = delta(
        before,
        after,
        "autoglm_batcher_class_requests_total",
        **{"class": "best_effort", "outcome": "ok"},
    )
    refusals = {
        reason: delta(before, after, "autoglm_batcher_best_effort_refusals_total", reason=reason)
        for reason in ("throttled", "queue_full")
    }
    return {
        "job": job is not None,
        "rate": rate,
        "sent": point.sent,
        "online_failed": errors,
        "online_p50_seconds": point.p50,
        "online_p99_seconds": point.p99,
        "wall_seconds": wall,
        "busy_share": busy / wall,
        "online_busy_share": online / wall,
        "best_effort_busy_share": best / wall,
        "best_effort_served": served,
        "best_effort_refusals": refusals,
        "share_at_end": after.get(("autoglm_batcher_best_effort_share", ()), float("nan")),
        "quantum_seconds": after.get(
            ("autoglm_batcher_best_effort_quantum_seconds", ()), float("nan")
        ),
        "loadavg": [load_before, bench.loadavg()],
    }


def print_phase(row: dict) -> None:
    name = "with job" if row["job"] else "alone"
    print(
        f"  {name:<9} p50 {row['online_p50_seconds'] * 1000:7.1f} ms  "
        f"p99 {row['online_p99_seconds'] * 1000:7.1f} ms  fail {row['online_failed']:3d}  "
        f"busy {row['busy_share']:5.2f} (online {row['online_busy_share']:4.2f}, "
        f"best-effort {row['best_effort_busy_share']:4.2f})  "
        f"be ok {row['best_effort_served']:5.0f}  "
        f"refused {sum(row['best_effort_refusals'].values()):4.0f}"
        f"  share {row['share_at_end']:4.2f}  load {row['loadavg'][1]}",
        flush=True,
    )


def summarize_rate(rows: list[dict], one_item_seconds: float) -> dict:
    """Medians over rounds and the paired p99 ratios (with job / alone, per round)."""
    alone = [r for r in rows if not r["job"]]
    mixed = [r for r in rows if r["job"]]
    pairs = zip(alone, mixed, strict=True)
    ratios = [m["online_p99_seconds"] / a["online_p99_seconds"] for a, m in pairs]
    p99_alone = statistics.median(r["online_p99_seconds"] for r in alone)
    return {
        "rate": rows[0]["rate"],
        "p99_alone_seconds": p99_alone,
        "p99_with_job_seconds": statistics.median(r["online_p99_seconds"] for r in mixed),
        "p99_ratio_median": statistics.median(ratios),
        "p99_ratios": ratios,
        "busy_alone": statistics.median(r["busy_share"] for r in alone),
        "busy_with_job": statistics.median(r["busy_share"] for r in mixed),
        "best_effort_busy_with_job": statistics.median(r["best_effort_busy_share"] for r in mixed),
        "ratio_worst_case": 1.0 + one_item_seconds / p99_alone,
        "p99_goal_met": statistics.median(ratios) <= P99_GOAL,
        "busy_goal_met": statistics.median(r["busy_share"] for r in mixed) >= BUSY_GOAL,
    }


def plot_simulated(rows: list[dict], path: Path) -> None:
    """Online p99 and device busy share against the online load, alone and per quantum."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fractions = sorted({row["fraction"] for row in rows})
    figure, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    alone = {row["fraction"]: row["alone"] for row in rows}
    left.plot(fractions, [alone[f]["p99_seconds"] * 1000 for f in fractions], "k-o", label="alone")
    right.plot(fractions, [alone[f]["busy_share"] for f in fractions], "k-o", label="alone")
    for name in SIM_QUANTA:
        mine = {row["fraction"]: row["with_job"] for row in rows if row["quantum"] == name}
        label = f"with job, quantum {name}"
        left.plot(fractions, [mine[f]["p99_seconds"] * 1000 for f in fractions], "-o", label=label)
        right.plot(fractions, [mine[f]["busy_share"] for f in fractions], "-o", label=label)
    left.set(xlabel="online load (fraction of the peak)", ylabel="online p99 (ms)")
    right.set(xlabel="online load (fraction of the peak)", ylabel="device busy share")
    right.axhline(BUSY_GOAL, color="grey", linestyle=":", linewidth=1)
    right.set_ylim(0, 1.05)
    left.legend(fontsize=7)
    figure.suptitle("Best-effort backfill, simulated device (t(b) = 50 ms + 6 ms b, SLO 600 ms)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)


def http_section(args: argparse.Namespace, fractions: list[float]) -> dict:
    """Alone and with-job phases on one real server, per rate and round."""
    print(f"== HTTP: {bench.MODEL} on cpu, one torch thread, load {bench.loadavg()}", flush=True)
    server = bench.Server(
        [
            *("--slo-seconds", str(args.slo), "--model-name", "demo"),
            *("--default-timeout-seconds", str(args.request_timeout)),
            *("--warmup-repeats", str(args.warmup_repeats)),
        ]
    )
    try:
        peak, peak_size = server.peak
        one_item = server.warmup.get(1, float("nan"))
        print(
            f"offline peak {peak:.1f}/s at batch {peak_size}; t(1) {one_item * 1000:.1f} ms; "
            f"SLO {args.slo * 1000:.0f} ms",
            flush=True,
        )
        url = f"http://127.0.0.1:{server.port}/v2/models/demo/infer"
        rows, summary = [], []
        for fraction in fractions:
            rate = fraction * peak
            print(f"-- online {rate:.1f}/s ({fraction:.2f} of the peak)", flush=True)
            at_rate = []
            for round_index in range(args.rounds):
                order = (False, True) if round_index % 2 == 0 else (True, False)
                for with_job in order:
                    job = Job(url, args.job_clients, args.job_rows) if with_job else None
                    if job is not None:
                        time.sleep(1.0)  # the job's first requests are queued
                    seed = int(rate * 1000) + round_index
                    row = phase(server, rate, args.phase_seconds, seed, job, args.request_timeout)
                    row["round"] = round_index
                    row["fraction"] = fraction
                    if job is not None:
                        row["job_client_counts"] = job.stop()
                    print_phase(row)
                    at_rate.append(row)
            rows += at_rate
            summary.append(summarize_rate(at_rate, one_item))
    finally:
        server.stop()
    print("-- summary (medians over rounds; ratio = with job / alone, paired per round)")
    print(
        f"{'fraction':>8} {'rate/s':>7} {'p99 alone':>10} {'p99 job':>9} {'ratio':>6} "
        f"{'worst':>6} {'busy alone':>10} {'busy job':>9} {'be busy':>8}"
    )
    for fraction, line in zip(fractions, summary, strict=True):
        print(
            f"{fraction:8.2f} {line['rate']:7.1f} {line['p99_alone_seconds'] * 1000:8.1f}ms "
            f"{line['p99_with_job_seconds'] * 1000:7.1f}ms {line['p99_ratio_median']:6.2f} "
            f"{line['ratio_worst_case']:6.2f} {line['busy_alone']:10.2f} "
            f"{line['busy_with_job']:9.2f} {line['best_effort_busy_with_job']:8.2f}"
        )
    print(
        f"goals: p99 ratio <= {P99_GOAL} and busy >= {BUSY_GOAL} with the job; "
        f"'worst' is 1 + t(1)/p99 alone: every tail request behind a one-item best-effort batch; "
        f"load {bench.loadavg()}",
        flush=True,
    )
    return {
        "peak": peak,
        "peak_size": peak_size,
        "one_item_seconds": one_item,
        "phases": rows,
        "summary": summary,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=str(ROOT / "bench/results/batcher_backfill.json"))
    parser.add_argument("--only", choices=("sim", "http"), help="run one section")
    parser.add_argument("--slo", type=float, default=0.6, help="online p99 latency SLO, seconds")
    parser.add_argument(
        "--fractions", default="0.2,0.4,0.6", help="online rates, fractions of the offline peak"
    )
    parser.add_argument("--sim-seconds", type=float, default=120.0, help="sim: virtual s/point")
    parser.add_argument("--phase-seconds", type=float, default=25.0, help="HTTP: s per phase")
    parser.add_argument("--rounds", type=int, default=2, help="HTTP: alone/with-job pairs")
    parser.add_argument("--job-clients", type=int, default=8, help="HTTP: closed-loop clients")
    parser.add_argument("--job-rows", type=int, default=1, help="HTTP: rows per job request")
    parser.add_argument("--warmup-repeats", type=int, default=5, help="HTTP: server warm-up")
    parser.add_argument("--request-timeout", type=float, default=10.0, help="HTTP: per request")
    parser.add_argument("--plot", metavar="PNG", help="plot the simulated section to this file")
    parser.add_argument("--smoke", action="store_true", help="under a minute; figures meaningless")
    parser.add_argument("--job-client", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.job_client:
        asyncio.run(job_clients(args.job_client, args.job_clients, args.job_rows))
        return 0
    global bench
    bench = importlib.import_module("bench.batcher")
    if args.smoke:
        args.fractions, args.sim_seconds, args.phase_seconds = "0.3", 5.0, 3.0
        args.rounds, args.warmup_repeats = 1, 2
    fractions = [float(f) for f in args.fractions.split(",")]
    report: dict = {
        "settings": vars(args),
        "machine": {"cpus": os.cpu_count(), "loadavg_start": bench.loadavg()},
    }
    if args.only != "http":
        report["simulated"] = simulated_section(fractions, args.sim_seconds, args.slo)
        if args.plot:
            plot_simulated(report["simulated"], Path(args.plot))
    if args.only != "sim":
        report["http"] = http_section(args, fractions)
    report["machine"]["loadavg_end"] = bench.loadavg()
    bench.write_report(Path(args.json), report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
