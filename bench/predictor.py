"""Predictor benchmark on the real traces in shared/autoscaling-traces/.

Series: Alibaba GenAI requests binned hourly (test: last 7 days, horizons 1-6) and per 15 min
(test: last 7 days, horizons 1-4), and the Azure LLM conversation trace per 10 s (test: last 20 %,
horizons 1-6). The GenAI series are also scored on the week before the test week, with only the
history before it ("earlier week"): a second, independent check that a change to the models
helps out of sample and was not fitted to the test week. For each: every model's WAPE per
horizon on the test window (fitted once before it, then only updated), the model selection
chosen before the test window ("selected@start"), and the service's behaviour of re-selecting
and refitting once a day (or every 60 bins for Azure) on the history so far ("selected").
Selection only ever sees points before its origin: four rolling-origin windows at the end of
that history, refitted at each window's start, pooled with recent windows weighted more; the
previous choice (at first the ensemble) is kept unless a challenger leads by more than one
standard error across the windows (predictor.selection).
Goals from the issue: selected WAPE <= 0.9x the best baseline at every horizon on the GenAI
series, 0.9 upper bound covering 85-95 %, update < 20 ms and refit < 2 s on 2,000 points. The
refit is timed three ways on 2,000 15-min points, each as a ratio to the 2 s goal: the full
selection (every candidate, four windows), the refit of the models it chose, and both (what the
scheduled refit does); wall and CPU seconds, median of three, with the machine's load average.

    python bench/predictor.py [--json bench/results/predictor.json] [--traces DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# One thread per numerical library, as torch below: a refit runs beside other targets' work,
# and on a shared machine extra threads only wait for cores (set them to override).
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # this file is named predictor.py: keep it from shadowing the package

from predictor.backtest import replay_with_selection, rolling_origin  # noqa: E402
from predictor.models import BASELINES, candidate_factories, shortest_cycle  # noqa: E402
from predictor.selection import Selection, select_model  # noqa: E402
from predictor.series import bin_events  # noqa: E402

SEASONS = (86400.0, 604800.0)
QUANTILE = 0.9


def series_specs(traces: Path) -> list[dict]:
    genai = pd.read_csv(
        traces / "alibaba-genai-2026/lora_request_trace.csv", usecols=["gmt_create"]
    )
    azure = pd.read_csv(traces / "azure-llm-2023/AzureLLMInferenceTrace_conv.csv")
    hourly = bin_events(genai["gmt_create"], "1h").to_numpy()
    quarter = bin_events(genai["gmt_create"], "15min").to_numpy()
    conv = bin_events(azure["TIMESTAMP"], "10s").to_numpy()
    genai = (("genai_1h", hourly, 3600, 6), ("genai_15min", quarter, 900, 4))
    weeks = {
        name: dict(step=step, horizons=h, test=7 * 86400 // step, reselect=86400 // step)
        for name, _, step, h in genai
    }
    specs = [dict(name=name, y=y, goal=True, **weeks[name]) for name, y, _, _ in genai]
    # The week before each test week, with only the history before it: an out-of-sample check.
    specs += [
        dict(name=f"{name}_earlier_week", y=y[: -weeks[name]["test"]], goal=False, **weeks[name])
        for name, y, _, _ in genai
    ]
    azure_spec = dict(step=10, horizons=6, test=len(conv) // 5, reselect=60, goal=False)
    return [*specs, dict(name="azure_conv_10s", y=conv, **azure_spec)]


def run_series(spec: dict) -> dict:
    y, step, H = spec["y"], spec["step"], spec["horizons"]
    hs = list(range(1, H + 1))
    test_start = len(y) - spec["test"]
    factories = candidate_factories(step, SEASONS, H, test_start)
    results = {
        name: rolling_origin(f, y, hs, test_start, QUANTILE) for name, f in factories.items()
    }
    choices: list[dict[int, str]] = []
    selections: list[Selection] = []
    selection_seconds: list[float] = []

    def select(history: np.ndarray):
        fs = candidate_factories(step, SEASONS, H, len(history))
        started = time.perf_counter()
        chosen = select_model(
            fs,
            history,
            hs,
            QUANTILE,
            previous=selections[-1] if selections else None,
            cycle=shortest_cycle(step, SEASONS, len(history)),
        )
        selection_seconds.append(time.perf_counter() - started)
        selections.append(chosen)
        choices.append(chosen.per_horizon)
        return chosen.per_horizon, fs

    started = time.perf_counter()
    replay = replay_with_selection(select, y, hs, test_start, spec["reselect"], QUANTILE)
    replay_seconds = time.perf_counter() - started
    at_start = choices[0]  # the first re-selection sees exactly the history before the test
    baselines = [n for n in results if n in BASELINES]
    best_baseline = {h: min(results[n].wape[h] for n in baselines) for h in hs}
    at_start_wape = {h: results[at_start[h]].wape[h] for h in hs}
    return {
        "points": len(y),
        "test_points": spec["test"],
        "step_seconds": step,
        "models": {n: r.as_json() for n, r in results.items()},
        "selected_at_start": {str(h): at_start[h] for h in hs},
        "selected_at_start_wape": {str(h): round(at_start_wape[h], 2) for h in hs},
        "selected": replay.as_json(),
        "selected_per_reselection": [{str(h): c[h] for h in hs} for c in choices],
        "best_baseline_wape": {str(h): round(best_baseline[h], 2) for h in hs},
        "ratio_selected_to_best_baseline": {
            str(h): round(replay.wape[h] / best_baseline[h], 3) for h in hs
        },
        "ratio_selected_at_start_to_best_baseline": {
            str(h): round(at_start_wape[h] / best_baseline[h], 3) for h in hs
        },
        "replay_seconds": round(replay_seconds, 2),
        "selection_seconds_mean": round(float(np.mean(selection_seconds)), 2),
        "goal_applies": spec["goal"],
    }


REFIT_GOAL_SECONDS = 2.0
TIMING_REPEATS = 3


def _timed(action) -> tuple[float, float]:
    """Median wall and CPU seconds of ``action`` over a few runs: the machine may be shared,
    and CPU time shows how much of the wall time was waiting for a core."""
    walls, cpus = [], []
    for _ in range(TIMING_REPEATS):
        wall, cpu = time.perf_counter(), time.process_time()
        action()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return float(np.median(walls)), float(np.median(cpus))


def timing_2000(traces: Path) -> dict:
    """Fit and update cost of each model on 2,000 points of the 15-min GenAI series, and of
    what the scheduled refit does: select among every candidate, then fit the chosen models."""
    genai = pd.read_csv(
        traces / "alibaba-genai-2026/lora_request_trace.csv", usecols=["gmt_create"]
    )
    y = bin_events(genai["gmt_create"], "15min").to_numpy()[:2000]
    hs = [1, 2, 3, 4]
    factories = candidate_factories(900, SEASONS, 4, len(y))
    cycle = shortest_cycle(900, SEASONS, len(y))
    models = {}
    for name, factory in factories.items():
        model = factory()
        started = time.perf_counter()
        model.fit(y[:1900])
        fit_s = time.perf_counter() - started
        started = time.perf_counter()
        for v in y[1900:]:
            model.update(v)
            model.predict(hs, QUANTILE)
        update_s = (time.perf_counter() - started) / 100
        refit_wall, refit_cpu = _timed(lambda f=factory: f().fit(y))  # fresh, as the service
        models[name] = {
            "refit_seconds": round(refit_wall, 3),
            "refit_cpu_seconds": round(refit_cpu, 3),
            "first_fit_seconds": round(fit_s, 3),
            "update_seconds": round(update_s, 6),
        }
    selection = select_model(factories, y, hs, QUANTILE, cycle=cycle)
    chosen = list(dict.fromkeys(selection.per_horizon.values()))

    def fit_chosen() -> None:
        for name in chosen:
            factories[name]().fit(y)

    def scheduled_refit() -> None:
        select_model(factories, y, hs, QUANTILE, cycle=cycle)
        fit_chosen()

    steps = {
        "selection (every candidate, 4 windows)": lambda: select_model(
            factories, y, hs, QUANTILE, cycle=cycle
        ),
        f"refit of the chosen ({', '.join(chosen)})": fit_chosen,
        "scheduled refit (selection + chosen)": scheduled_refit,
    }
    refit = {}
    for label, action in steps.items():
        wall, cpu = _timed(action)
        refit[label] = {
            "seconds": round(wall, 3),
            "cpu_seconds": round(cpu, 3),
            "ratio_to_goal": round(wall / REFIT_GOAL_SECONDS, 2),
        }
    return {"models": models, "refit": refit, "chosen": chosen, "repeats": TIMING_REPEATS}


def print_tables(report: dict) -> None:
    for name, r in report["series"].items():
        hs = list(r["best_baseline_wape"])
        print(f"\n== {name}: {r['points']} bins, test {r['test_points']}  (WAPE %, per horizon)")
        print(f"{'model':<24}" + "".join(f"{'h' + h:>8}" for h in hs))
        for model, m in r["models"].items():
            print(f"{model:<24}" + "".join(f"{m['wape'][h]:>8.1f}" for h in hs))
        sel = r["selected"]
        print(f"{'selected (daily reselect)':<24}" + "".join(f"{sel['wape'][h]:>8.1f}" for h in hs))
        print(
            f"{'  ratio to best baseline':<24}"
            + "".join(f"{r['ratio_selected_to_best_baseline'][h]:>8.2f}" for h in hs)
        )
        print(
            f"{'  coverage of 0.9 upper':<24}" + "".join(f"{sel['coverage'][h]:>8.1f}" for h in hs)
        )
        print(
            f"{'selected@start':<24}"
            + "".join(f"{r['selected_at_start_wape'][h]:>8.1f}" for h in hs)
        )
        print(
            f"{'  ratio to best baseline':<24}"
            + "".join(f"{r['ratio_selected_at_start_to_best_baseline'][h]:>8.2f}" for h in hs)
        )
        print(
            "  chosen@start: " + ", ".join(f"h{h}={m}" for h, m in r["selected_at_start"].items())
        )
        print(
            f"  selection (every candidate, 4 windows): {r['selection_seconds_mean']:.1f} s "
            f"mean over {len(r['selected_per_reselection'])} re-selections"
        )
        if r["goal_applies"]:
            missed = [h for h, v in r["ratio_selected_to_best_baseline"].items() if v > 0.9]
            verdict = "met" if not missed else "missed at h" + ",".join(missed)
            print(f"  goal <= 0.90x best baseline: {verdict}")
        cover = [h for h, v in sel["coverage"].items() if not 85 <= v <= 95]
        print(f"  coverage goal 85-95 %: {'met' if not cover else 'missed at h' + ','.join(cover)}")
    timing = report["timing_2000_points"]
    print(
        "\n== cost on 2,000 points (15-min GenAI), per model (median of "
        f"{timing['repeats']} refits; CPU seconds show the waiting on a shared machine)"
    )
    print(f"{'model':<28}{'refit s':>10}{'cpu s':>8}{'update ms':>11}")
    for model, t in timing["models"].items():
        print(
            f"{model:<28}{t['refit_seconds']:>10.3f}{t['refit_cpu_seconds']:>8.3f}"
            f"{t['update_seconds'] * 1000:>11.3f}"
        )
    print(f"\n== refit on 2,000 points against the {REFIT_GOAL_SECONDS:.0f} s goal")
    print(f"{'step':<56}{'wall s':>8}{'cpu s':>8}{'x goal':>8}")
    for label, t in timing["refit"].items():
        print(f"{label:<56}{t['seconds']:>8.2f}{t['cpu_seconds']:>8.2f}{t['ratio_to_goal']:>8.2f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=str(ROOT / "bench/results/predictor.json"))
    parser.add_argument("--traces", default=str(ROOT.parent / "shared/autoscaling-traces"))
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    traces = Path(args.traces)
    if not traces.exists():
        traces = Path("/work/shared/autoscaling-traces")
    started = time.perf_counter()
    report = {
        "quantile": QUANTILE,
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "series": {},
    }
    for spec in series_specs(traces):
        report["series"][spec["name"]] = run_series(spec)
        print(f"{spec['name']} done after {time.perf_counter() - started:.0f} s", file=sys.stderr)
    report["timing_2000_points"] = timing_2000(traces)
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print_tables(report)
    print(
        f"\nmachine: {report['cpus']} CPUs, load average (1, 5, 15 min) "
        f"{report['load_average_at_start']} at start, {report['load_average_at_end']} at end"
    )
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.json} ({report['total_seconds']} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
