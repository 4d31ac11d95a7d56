"""The autoscaling bench's analysis: policies compared on one trace, the goals, the limits no
forecast moves, and the sweeps over targets and quantiles placed against the HPA's frontier.

``bench/autoscaler.py`` is the command line around it (the traces' setups, the tables, the JSON
and the plots); the numbers it reports are computed here, where the tests reach them.
"""

from __future__ import annotations

import math
import time
from dataclasses import replace
from typing import Literal

from autoscaler.simulator.engine import Policy, SimulationConfig, SimulationResult, simulate
from autoscaler.simulator.forecast import ClairvoyantForecaster, LoadForecaster, SharedForecaster
from autoscaler.simulator.frontier import FrontierPoint, compare
from autoscaler.simulator.report import summarise, window_scores
from autoscaler.simulator.trace import Trace
from autoscaler.spec import DEFAULT_TOLERANCE

Series = Literal["peak", "mean"]


def down_window(seconds: float) -> dict:
    """A behavior whose only change from the defaults is the scale-down window."""
    return {"scaleDown": {"stabilizationWindowSeconds": int(seconds)}}


def run_trace(
    name: str,
    trace: Trace,
    config: SimulationConfig,
    note: str,
    forecaster: LoadForecaster | None = None,
) -> tuple[list[dict], list[SimulationResult]]:
    """Every policy, the controls and the clairvoyant bound on one trace: a row each (with the
    goals for the predictive runs), and the results for the plots."""
    warmup = config.warmup_seconds  # the predictive policy's scale-down window and horizon
    runs: list[tuple[str, Policy, SimulationConfig]] = [
        ("static", "static", config),
        ("hpa", "hpa", config),
        (f"hpa-{warmup:g}s", "hpa", replace(config, behavior=down_window(warmup))),
        ("predictive", "predictive", replace(config, behavior=down_window(warmup))),
        # A control, not a competitor: the HPA with as much headroom as prediction buys.
        ("hpa@0.6", "hpa", replace(config, target_utilization=0.6)),
        # A bound, not a competitor: the predictive rule fed the exact future rate.
        ("clairvoyant", "predictive", replace(config, behavior=down_window(warmup))),
    ]
    bound = ClairvoyantForecaster(trace.arrivals, config.metric_window, config.tick)
    rows, results = [], []
    for label, policy, cfg in runs:
        started = time.perf_counter()
        result = simulate(trace, cfg, policy, bound if label == "clairvoyant" else forecaster)
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
    for row in rows:
        if row["label"] in ("predictive", "clairvoyant"):
            row["goals"] = goals(row, hpa)
    return rows, results


def run_quantile_sweep(
    trace: Trace,
    config: SimulationConfig,
    quantiles: list[float],
    shared: SharedForecaster,
    known: dict[float, SimulationResult],
    hpa: SimulationResult,
    split: float,
) -> dict:
    """The predictive policy at each forecast quantile, chosen in one window, judged in another.

    A lower quantile buys fewer GPU-hours with more breaches; which one, if any, beats the HPA
    at the same target (fewer breach minutes, no more GPU-hours) must not be read off the data
    it is judged on. The trace is cut at ``split`` of its duration: the quantile is chosen on
    the first part (among those beating the HPA there, the one with the fewest breach minutes)
    and that choice alone is judged on the second part against the HPA's own second part.
    Every quantile runs the whole trace (one shared forecast pass answers them all: the fits do
    not depend on the quantile); ``known`` holds runs already made, by quantile.
    """
    cut = math.floor(trace.duration * split / 60.0) * 60.0  # whole minutes on either side
    windows = {"choose": (0.0, cut), "judge": (cut, trace.duration)}
    hpa_scores = {name: window_scores(hpa, *w) for name, w in windows.items()}
    hpa_gpu_hours = summarise(hpa)["gpu_hours"]
    rows = []
    for q in quantiles:
        started = time.perf_counter()
        result = known.get(q)
        reused = result is not None
        if result is None:
            cfg = replace(
                config,
                forecast_quantile=q,
                behavior=down_window(config.warmup_seconds),
            )
            result = simulate(trace, cfg, "predictive", shared.at_quantile(q))
        whole = summarise(result)
        row = {
            "quantile": q,
            "target_utilization": config.target_utilization,
            "breach_minutes": whole["breach_minutes"],
            "slo_minutes": whole["slo_minutes"],
            "gpu_hours": whole["gpu_hours"],
            "gpu_hours_vs_hpa": whole["gpu_hours"] / hpa_gpu_hours,
            "mean_utilization": whole["mean_utilization"],
            "reused_from_headline": reused,
            "wall_seconds": 0.0 if reused else time.perf_counter() - started,
        }
        for name, window in windows.items():
            scores = window_scores(result, *window)
            scores["beats_hpa"] = beats(scores, hpa_scores[name])
            row[name] = scores
        rows.append(row)
    winners = [r for r in rows if r["choose"]["beats_hpa"]]
    chosen = min(
        winners, key=lambda r: (r["choose"]["breach_minutes"], r["quantile"]), default=None
    )
    return {
        "split_seconds": cut,
        "hpa": hpa_scores,
        "rows": rows,
        "chosen_quantile": None if chosen is None else chosen["quantile"],
        "chosen_beats_hpa_out_of_sample": None if chosen is None else chosen["judge"]["beats_hpa"],
    }


def beats(candidate: dict, hpa: dict) -> bool:
    """The issue's comparison: fewer breach minutes than the HPA at no more GPU-hours."""
    return bool(
        candidate["breach_minutes"] < hpa["breach_minutes"]
        and candidate["gpu_hours"] <= hpa["gpu_hours"]
    )


def reachability(rows: list[dict]) -> dict[str, dict]:
    """Per trace: which goals the predictive policy meets, which a perfect forecast would meet,
    and the arithmetic limits that no forecast moves.

    * ``fewer_breaches_possible``: false when the HPA has no breach minute to improve on;
    * ``static_share_floor``: the lowest share of static GPU-hours a fleet can reach while its
      mean utilization stays at the target (the work served is the same for every policy, so
      GPU-hours are at least work / target); ``..._with_tolerance`` lets the utilization sit at
      the HPA's tolerance edge (target x (1 + tolerance)) the whole time, which no fleet that
      must scale up ahead of load does.
    """
    out: dict[str, dict] = {}
    for trace in dict.fromkeys(r["trace"] for r in rows):
        by_label = {r["label"]: r for r in rows if r["trace"] == trace}
        static, hpa = by_label["static"], by_label["hpa"]
        target = static["target_utilization"]
        floor = static["mean_utilization"] / target
        out[trace] = {
            "predictive": by_label["predictive"].get("goals"),
            "clairvoyant": by_label["clairvoyant"].get("goals"),
            "hpa_breach_minutes": hpa["breach_minutes"],
            "fewer_breaches_possible": hpa["breach_minutes"] > 0,
            "static_share_floor": floor,
            "static_share_floor_with_tolerance": floor / (1 + DEFAULT_TOLERANCE),
        }
    return out


def goals(row: dict, hpa: dict) -> dict[str, bool]:
    """The issue's goals for a predictive run, against the HPA at the same target."""
    return {
        "slo_minutes_at_least_0.99": bool(row["slo_minutes"] >= 0.99),
        "fewer_breach_minutes_than_hpa": bool(row["breach_minutes"] < hpa["breach_minutes"]),
        "gpu_hours_at_most_hpa": bool(row["gpu_hours"] <= hpa["gpu_hours"]),
        "gpu_hours_at_most_0.6_static": bool(row["gpu_hours_vs_static"] <= 0.6),
        "utilization_at_least_0.8_target": bool(
            row["mean_utilization"] >= 0.8 * row["target_utilization"]
        ),
    }


def run_frontier(
    trace: Trace,
    config: SimulationConfig,
    targets: list[float],
    forecasters: dict[Series, SharedForecaster],
    known: dict[tuple[str, float], dict],
    hpa_targets: list[float] | None = None,
) -> list[dict]:
    """HPA and predictive (each forecast series) at several targets, placed on HPA's frontier.

    ``hpa_targets`` (default: ``targets``) may reach further, as HPA runs are cheap and a
    candidate point beyond the HPA points' GPU-hours cannot be judged.

    ``known`` holds rows already run in the headline table, keyed by (variant, target), which
    are reused rather than run again; the forecasters are shared across targets (the forecast
    depends on the load only), so each series costs one forecast pass.
    """
    warmup = config.warmup_seconds
    variants: list[tuple[str, Policy, Series, dict | None, list[float]]] = [
        ("hpa", "hpa", config.forecast_series, None, hpa_targets or targets)
    ]
    for series in forecasters:
        variants.append(
            (f"predictive-{series}", "predictive", series, down_window(warmup), targets)
        )
    rows = []
    for label, policy, series, behavior, variant_targets in variants:
        for target in variant_targets:
            row = known.get((label, target))
            reused = row is not None
            started = time.perf_counter()
            if row is None:
                cfg = replace(
                    config, target_utilization=target, behavior=behavior, forecast_series=series
                )
                row = summarise(simulate(trace, cfg, policy, forecasters.get(series)))
            rows.append(
                {
                    "label": label,
                    "target_utilization": target,
                    "gpu_hours": row["gpu_hours"],
                    "breach_minutes": row["breach_minutes"],
                    "slo_minutes": row["slo_minutes"],
                    "mean_utilization": row["mean_utilization"],
                    "reused_from_headline": reused,
                    "wall_seconds": 0.0 if reused else time.perf_counter() - started,
                }
            )
    reference = [frontier_point(r) for r in rows if r["label"] == "hpa"]
    for r in rows:
        if r["label"] != "hpa":
            placed = compare(reference, frontier_point(r))
            r.update(
                vs_hpa_frontier=placed.verdict,
                hpa_breaches_at_same_gpu_hours=placed.reference_breaches,
                hpa_gpu_hours_at_same_breaches=placed.reference_gpu_hours,
            )
    return rows


def frontier_point(row: dict) -> FrontierPoint:
    """A frontier-section row as a point: labelled by its variant and target."""
    return FrontierPoint(
        row["label"], row["target_utilization"], row["gpu_hours"], row["breach_minutes"]
    )


def sweep_point(row: dict) -> FrontierPoint:
    """A quantile-sweep run on the frontier plot: labelled by its quantile, not its target."""
    return FrontierPoint(
        "predictive-peak by quantile", row["quantile"], row["gpu_hours"], row["breach_minutes"]
    )


def frontier_verdicts(rows: list[dict]) -> dict[str, dict[str, int]]:
    """Per predictive variant: how many of its points lie below, on/above or outside HPA's."""
    counts: dict[str, dict[str, int]] = {}
    for r in rows:
        if "vs_hpa_frontier" in r:
            tally = counts.setdefault(r["label"], {"below": 0, "on_or_above": 0, "outside": 0})
            tally[r["vs_hpa_frontier"]] += 1
    return counts


def place_sweep(sweep: dict, reference: list[FrontierPoint]) -> None:
    """Add to each quantile-sweep row where its whole-trace point lies against HPA's frontier."""
    for r in sweep["rows"]:
        placed = compare(reference, sweep_point(r))
        r.update(
            vs_hpa_frontier=placed.verdict,
            hpa_breaches_at_same_gpu_hours=placed.reference_breaches,
        )
