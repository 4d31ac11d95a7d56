"""Static peak provisioning vs reactive HPA vs predictive, replayed on two public traces.

    python bench/autoscaler.py [--json FILE] [--plot FILE.png] [--speed 8]

All policies run the real decision core at the same utilization target on the same fleet model.

* Alibaba GenAI 2026 (Stable Diffusion, 23 days): the service time is calibrated from the trace
  itself: a least-squares fit of ``exec_time_seconds`` against ``num_images_per_prompt`` gives
  ``t = c + a * images`` (about 22 s + 2.5 s per image), so a replica batches prompts and a
  request's work is its image count. The trace is time-compressed 8x (a day lasts 3 h, the load
  per second is 8x) so that the peak needs several replicas; the forecaster's season is
  compressed with it. The SLO bounds the queueing delay (60 s): the service time is the
  request's own and no autoscaler can change it.
* Azure LLM conversation 2023 (one hour, about 5 req/s): a replica serves batches of up to 8
  requests in ``1.5 + 0.4 * b`` seconds; the SLO bounds end-to-end latency (8 s). One hour
  gives the forecaster no season, so it runs on its non-seasonal model.

Policies: ``static`` (replicas for the peak 5-minute rate), ``hpa`` (Kubernetes defaults: 300 s
scale-down stabilization), ``hpa-60s`` (the HPA with the predictive policy's 60 s window, to show
what the shorter window alone does) and ``predictive`` (forecast upper bound of the 5-minute
request rate over the next cold start plus one tick, 60 s scale-down window).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
# The script's own folder holds bench/predictor.py, which would shadow the predictor package.
sys.path[0] = str(ROOT)

from autoscaler.simulator.engine import SimulationConfig, simulate  # noqa: E402
from autoscaler.simulator.fleet import ServiceModel  # noqa: E402
from autoscaler.simulator.report import plot, summarise, write_json  # noqa: E402
from autoscaler.simulator.trace import load_trace  # noqa: E402

TRACES = ROOT.parent / "shared" / "autoscaling-traces"
ALIBABA = TRACES / "alibaba-genai-2026" / "lora_request_trace.csv"
AZURE = TRACES / "azure-llm-2023" / "AzureLLMInferenceTrace_conv.csv"
SHORT_WINDOW = {"scaleDown": {"stabilizationWindowSeconds": 60}}


def alibaba_setup(speed: float) -> tuple:
    frame = pd.read_csv(
        ALIBABA, usecols=["predict_status", "num_images_per_prompt", "exec_time_seconds"]
    )
    ok = frame[frame.predict_status == "SUCCEED"].dropna()
    per_image = ServiceModel.calibrate(ok.num_images_per_prompt, ok.exec_time_seconds, 8)
    trace = load_trace(
        ALIBABA, time_column="gmt_create", work_column="num_images_per_prompt", speed=speed
    )
    # work is normalised to a mean of 1 request, so a is per average request
    service = ServiceModel(c=per_image.c, a=per_image.a * trace.mean_work_raw, max_batch=8)
    config = SimulationConfig(
        service=service,
        cold_start=120.0,
        target_utilization=0.7,
        slo_seconds=60.0,
        slo_on="queueing",
        max_replicas=64,
        forecast_step=300.0,
        season_seconds=86400.0 / speed,
    )
    note = (
        f"t(b) = {per_image.c:.1f} s + {per_image.a:.2f} s/image (fit on {len(ok)} requests), "
        f"speed {speed:g}x"
    )
    return trace, config, note


def azure_setup() -> tuple:
    trace = load_trace(AZURE, time_column="TIMESTAMP")
    config = SimulationConfig(
        service=ServiceModel(c=1.5, a=0.4, max_batch=8),
        cold_start=120.0,
        target_utilization=0.7,
        slo_seconds=8.0,
        slo_on="latency",
        max_replicas=64,
        forecast_step=60.0,
    )
    return trace, config, "t(b) = 1.5 s + 0.4 s * b, b <= 8"


def run_trace(name: str, trace, config: SimulationConfig, note: str) -> tuple[list, list]:
    runs = [
        ("static", "static", config),
        ("hpa", "hpa", config),
        ("hpa-60s", "hpa", replace(config, behavior=SHORT_WINDOW)),
        ("predictive", "predictive", replace(config, behavior=SHORT_WINDOW)),
    ]
    rows, results = [], []
    for label, policy, cfg in runs:
        started = time.perf_counter()
        result = simulate(trace, cfg, policy)
        row = summarise(result)
        row.update(trace=name, label=label, wall_seconds=time.perf_counter() - started, setup=note)
        rows.append(row)
        result.policy = label
        results.append(result)
    static = rows[0]["gpu_hours"]
    hpa = rows[1]
    for row in rows:
        row["gpu_hours_vs_static"] = row["gpu_hours"] / static
        row["gpu_hours_vs_hpa"] = row["gpu_hours"] / hpa["gpu_hours"]
    pred = rows[3]
    pred["goals"] = {
        "slo_minutes_at_least_0.99": bool(pred["slo_minutes"] >= 0.99),
        "fewer_breach_minutes_than_hpa": bool(pred["breach_minutes"] < hpa["breach_minutes"]),
        "gpu_hours_at_most_hpa": bool(pred["gpu_hours"] <= hpa["gpu_hours"]),
        "gpu_hours_at_most_0.6_static": bool(pred["gpu_hours_vs_static"] <= 0.6),
        "utilization_at_least_0.8_target": bool(
            pred["mean_utilization"] >= 0.8 * pred["target_utilization"]
        ),
    }
    return rows, results


def print_table(rows: list[dict]) -> None:
    head = (
        f"{'trace':<8} {'policy':<11} {'SLO req':>8} {'SLO min':>8} {'breach':>6} "
        f"{'GPU-h':>8} {'/static':>7} {'/hpa':>6} {'util':>6} {'busy':>6} {'ups':>5} "
        f"{'downs':>5} {'wall s':>6}"
    )
    print(head)
    print("-" * len(head))
    for r in rows:
        print(
            f"{r['trace']:<8} {r['label']:<11} {r['slo_requests']:>8.4f} {r['slo_minutes']:>8.4f} "
            f"{r['breach_minutes']:>6d} {r['gpu_hours']:>8.1f} {r['gpu_hours_vs_static']:>7.2f} "
            f"{r['gpu_hours_vs_hpa']:>6.2f} {r['mean_utilization']:>6.3f} "
            f"{r['busy_fraction']:>6.3f} "
            f"{r['scale_ups']:>5d} {r['scale_downs']:>5d} {r['wall_seconds']:>6.1f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=str(ROOT / "bench/results/autoscaler.json"))
    parser.add_argument("--plot", default=str(ROOT / "bench/results/autoscaler.png"))
    parser.add_argument("--speed", type=float, default=8.0, help="Alibaba time compression")
    args = parser.parse_args(argv)
    rows: list[dict] = []
    plots = {}
    for name, (trace, config, note) in (
        ("alibaba", alibaba_setup(args.speed)),
        ("azure", azure_setup()),
    ):
        print(
            f"{name}: {len(trace)} requests over {trace.duration / 3600:.1f} h; {note}; "
            f"target {config.target_utilization} of {config.service.capacity_rps:.3f} req/s "
            f"per replica; cold start {config.cold_start:g} s",
            flush=True,
        )
        trace_rows, results = run_trace(name, trace, config, note)
        rows += trace_rows
        plots[name] = results
    print()
    print_table(rows)
    for r in rows:
        if "goals" in r:
            print(f"{r['trace']} predictive goals: " + json.dumps(r["goals"]))
    write_json(args.json, {"rows": rows})
    plot_path = Path(args.plot)
    for name, results in plots.items():
        target = (
            plot_path
            if name == "alibaba"
            else plot_path.with_name(plot_path.stem + f"-{name}" + plot_path.suffix)
        )
        plot(results, target, title=f"{name}: static vs hpa vs predictive")
    print(f"wrote {args.json} and {plot_path} (+ {plot_path.stem}-azure{plot_path.suffix})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
