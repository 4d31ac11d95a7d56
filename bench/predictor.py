"""Predictor benchmark on the public traces (`autoglm datasets fetch`): a grid that is hard to
overfit by accident.

Series: from the Alibaba GenAI trace, the request count and the work (sum of execution seconds)
per hour and per 15 min; from the Azure LLM 2023 traces (one hour each, no daily season), the
request count and the tokens (context + generated) per 10 s of the conversation and code
traces. Test windows: each of the last three weeks (GenAI) or the last three 10-minute stretches
(Azure) whose history before it is long enough (a week for GenAI, 20 minutes for Azure).
Horizons 1-8 steps. A cell is (series, window, horizon).

In each window the service's behaviour is replayed: once a day (every 10 minutes on Azure)
selection runs on the history so far (predictor.selection, the previous choice as incumbent),
the chosen models are fitted and calibrated with the selection's out-of-sample errors, and then
only updated. Every candidate is also scored alone with the same refits. Per cell: the selected
WAPE as a ratio to the best baseline (naive or seasonal copy); the coverage of the 0.9 upper
bound with its Wilson 95 % interval (the binomial spread at that cell's number of points); and
bounds from hindsight (predictor.hindsight) on what selection among these candidates could do:
the best candidate of the cell, the best per re-selection block, the best fixed convex weights
over the cell and per block, and the best candidate per point. The summary gives the worst cell
and the geometric mean of the ratios, and the cells outside the coverage band both as measured
and beyond binomial noise (interval clear of the band), separately for the design windows (all
but the last of each series; the design was chosen on them) and the check windows (the last of
each series).

Also the cost on 2,000 15-min points: selection over every candidate and block (CPU seconds)
and one update plus forecast of the chosen models (CPU ms, mean of 100; and the median wall
time, which on a busy machine is mostly waiting for a core); median of three selections, with
the load average.

    nice -n 15 python bench/predictor.py [--smoke] [--json bench/results/predictor.json]
        [--extra-models tracking] [--rules]

``--rules`` replays, instead of the service, the combination rules tried for the geometric-mean
goal (weights per hour of the day and per horizon, shrunk toward the median ensemble, gated by
a Diebold-Mariano test, a residual correction; least-absolute-error convex weights fitted on the
past, the causal version of the per-block weights bound; the median with `seasonal_mean` counted
twice) from the candidates' own forecasts, on the design and check windows alike
(docs/predictor-accuracy.md, "Fifth round", "Seventh round", "Eighth round").
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

# One thread per numerical library: on a shared machine extra threads only wait for cores.
for _variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_variable, "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from scipy.stats import binom  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path[0] = str(ROOT)  # this file is named predictor.py: keep it from shadowing the package

from autoglm.datasets import expected_path, fetch_hint, traces_dir  # noqa: E402
from predictor.backtest import (  # noqa: E402
    coverage_interval,
    forecast_targets,
    replay_with_selection,
    wape,
)
from predictor.fitting import fit_chosen  # noqa: E402
from predictor.hindsight import (  # noqa: E402
    best_pick_wape,
    best_weights_wape,
    least_absolute_weights,
)
from predictor.models import (  # noqa: E402
    BASELINES,
    ON_REQUEST,
    Combination,
    ForecastModel,
    candidate_factories,
    shortest_cycle,
    usable_seasons,
)
from predictor.selection import (  # noqa: E402
    HALF_LIFE_BLOCKS,
    Selection,
    candidate_forecasts,
    select_model,
    significant_lead,
)
from predictor.series import bin_events  # noqa: E402

SEASONS = (86400.0, 604800.0)
QUANTILE = 0.9
HORIZONS = tuple(range(1, 9))
DAY, WEEK = 86400, 7 * 86400
GOAL_RATIO, GOAL_GEOMEAN, GOAL_COVERAGE = 0.85, 0.8, (85.0, 95.0)
TIMING_REPEATS = 3
# Bounds from hindsight (the cells' own actuals) on selection among the candidates, loosest last.
ORACLES = {
    "oracle": "best candidate per cell",
    "block_oracle": "best candidate per re-selection block",
    "cell_weights_oracle": "best fixed convex weights per cell",
    "block_weights_oracle": "best convex weights per re-selection block",
    "point_oracle": "best candidate per point",
}


def series_specs(traces: Path, smoke: bool) -> list[dict]:
    """Every series of the grid with its step, test window length, re-selection interval and
    the least history a window needs."""
    genai = pd.read_csv(
        traces / "alibaba-genai-2026/lora_request_trace.csv",
        usecols=["gmt_create", "exec_time_seconds"],
    )
    work = genai["exec_time_seconds"].fillna(0.0)
    specs = []
    for freq, step in (("1h", 3600), ("15min", 900)):
        for kind, values, aggregate in (("requests", None, "count"), ("work", work, "sum")):
            y = bin_events(genai["gmt_create"], freq, values, aggregate).to_numpy()
            specs.append(
                dict(
                    name=f"genai_{kind}_{freq}",
                    y=y,
                    step=step,
                    test=WEEK // step,
                    reselect=DAY // step,
                    min_history=WEEK // step,
                )
            )
    if smoke:
        return specs[:1]
    for trace in ("conv", "code"):
        azure = pd.read_csv(traces / f"azure-llm-2023/AzureLLMInferenceTrace_{trace}.csv")
        tokens = azure["ContextTokens"] + azure["GeneratedTokens"]
        for kind, values, aggregate in (("requests", None, "count"), ("tokens", tokens, "sum")):
            y = bin_events(azure["TIMESTAMP"], "10s", values, aggregate).to_numpy()
            specs.append(
                dict(
                    name=f"azure_{trace}_{kind}_10s",
                    y=y,
                    step=10,
                    test=60,
                    reselect=60,
                    min_history=120,
                )
            )
    return specs


def windows(spec: dict, smoke: bool) -> list[int]:
    """Test window starts: the last three whose history is long enough, oldest first."""
    n, test = len(spec["y"]), spec["test"]
    starts = [n - k * test for k in (3, 2, 1) if n - k * test >= spec["min_history"]]
    return starts[-1:] if smoke else starts


def factories_with(
    step: float, max_h: int, n_points: int, extra: tuple[str, ...]
) -> dict[str, Callable[[], ForecastModel]]:
    """The default candidates, plus the models offered only on request that ``extra`` names
    (named with the defaults, as a target would name them, so those that join the median
    ensemble do)."""
    factories = candidate_factories(step, SEASONS, max_h, n_points)
    if extra:
        named = (*factories, *extra)
        factories = candidate_factories(step, SEASONS, max_h, n_points, include=named)
    return factories


def run_window(spec: dict, start: int, smoke: bool, extra: tuple[str, ...] = ()) -> dict:
    """Every candidate alone and the replayed service on one test window (see module doc)."""
    y, step = spec["y"][: start + spec["test"]], spec["step"]
    max_h = max(HORIZONS)
    reselect = 0 if smoke else spec["reselect"]
    # Every candidate alone, refitted where the service re-selects.
    refits = list(range(start, len(y), reselect or len(y)))
    factories = factories_with(step, max_h, start, extra)
    forecasts, _, _ = candidate_forecasts(factories, y, start, refits, max_h)
    actual = forecast_targets(y, start, max_h)
    alone = {}
    for name, f in forecasts.items():
        if name in factories and np.isfinite(f.point).all():
            alone[name] = {h: _wape(actual[:, h - 1], f.point[:, h - 1]) for h in HORIZONS}
    baselines = [n for n in alone if n in BASELINES]
    best_baseline = {h: min(alone[n][h] for n in baselines) for h in HORIZONS}
    oracle = {h: min(alone, key=lambda n, h=h: alone[n][h]) for h in HORIZONS}
    # Bounds from hindsight on any selection among these candidates (predictor.hindsight): the
    # best one per re-selection block (what a rule that picks one model a day could at most
    # reach), the best fixed convex weights over the window (any fixed stack) and per block (a
    # combination chosen a day), and the best one per point.
    blocks = [r - start for r in refits]
    every_point = list(range(len(actual)))
    bounds = {}
    for label, bound, starts in (
        ("block_oracle", best_pick_wape, blocks),
        ("cell_weights_oracle", best_weights_wape, [0]),
        ("block_weights_oracle", best_weights_wape, blocks),
        ("point_oracle", best_pick_wape, every_point),
    ):
        bounds[label] = {
            h: bound(actual[:, h - 1], {n: forecasts[n].point[:, h - 1] for n in alone}, starts)
            for h in HORIZONS
        }

    selections: list[Selection] = []
    seconds: list[float] = []

    def select(history: np.ndarray):
        fs = factories_with(step, max_h, len(history), extra)
        started = time.process_time()
        selection = select_model(
            fs,
            history,
            HORIZONS,
            QUANTILE,
            previous=selections[-1] if selections else None,
            cycle=shortest_cycle(step, SEASONS, len(history)),
        )
        seconds.append(time.process_time() - started)
        selections.append(selection)
        fitted = fit_chosen(selection, fs, history)
        return {h: fitted[name] for h, name in selection.per_horizon.items()}

    replay = replay_with_selection(select, y, HORIZONS, start, reselect, QUANTILE)
    covered = {h: int((replay.actual[h] <= replay.upper[h]).sum()) for h in HORIZONS}
    points = {h: len(replay.actual[h]) for h in HORIZONS}
    return {
        "start": start,
        "history_points": start,
        "test_points": len(y) - start,
        "models": {n: _rounded(v) for n, v in alone.items()},
        "best_baseline": _rounded(best_baseline),
        "selected": _rounded(replay.wape),
        "coverage": _rounded(replay.coverage),
        "coverage_points": {str(h): points[h] for h in HORIZONS},
        "coverage_interval": {
            str(h): [round(v, 1) for v in coverage_interval(covered[h], points[h])]
            for h in HORIZONS
        },
        "ratio": {str(h): round(replay.wape[h] / best_baseline[h], 3) for h in HORIZONS},
        "oracle_model": {str(h): oracle[h] for h in HORIZONS},
        "oracle_ratio": {
            str(h): round(alone[oracle[h]][h] / best_baseline[h], 3) for h in HORIZONS
        },
        **{
            f"{label}_ratio": {str(h): round(wapes[h] / best_baseline[h], 3) for h in HORIZONS}
            for label, wapes in bounds.items()
        },
        "chosen": [{str(h): s.per_horizon[h] for h in HORIZONS} for s in selections],
        "selection_cpu_seconds_mean": round(float(np.mean(seconds)), 2),
    }


def _wape(actual: np.ndarray, point: np.ndarray) -> float:
    ok = np.isfinite(actual)
    return wape(actual[ok], point[ok])


def _rounded(values: dict) -> dict:
    return {str(k): round(float(v), 2) for k, v in values.items()}


def summarise(cells: list[dict]) -> dict:
    """Worst cell and geometric mean of the ratios and of the three oracles' (see
    :func:`run_window`), the coverage range and the cells outside the goal band: as measured,
    and beyond the binomial spread of their window (Wilson interval clear of the band)."""
    if not cells:
        return {}
    ratios = np.array([c["ratio"] for c in cells])
    cover = np.array([c["coverage"] for c in cells])
    low, high = np.array([c["coverage_interval"] for c in cells]).T
    worst = cells[int(np.argmax(ratios))]
    summary = {
        "cells": len(cells),
        "geomean_ratio": round(float(np.exp(np.mean(np.log(ratios)))), 3),
        "worst_ratio": round(float(ratios.max()), 3),
        "worst_cell": f"{worst['series']} window {worst['window']} h{worst['h']}",
        "cells_over_goal_ratio": int((ratios > GOAL_RATIO).sum()),
    }
    for oracle in ORACLES:
        r = np.array([c[f"{oracle}_ratio"] for c in cells])
        summary[f"{oracle}_geomean_ratio"] = round(float(np.exp(np.mean(np.log(r)))), 3)
        summary[f"{oracle}_worst_ratio"] = round(float(r.max()), 3)
        summary[f"{oracle}_cells_over_goal_ratio"] = int((r > GOAL_RATIO).sum())
    summary["coverage_min"] = round(float(cover.min()), 1)
    summary["coverage_max"] = round(float(cover.max()), 1)
    summary["cells_outside_coverage_goal"] = int(
        ((cover < GOAL_COVERAGE[0]) | (cover > GOAL_COVERAGE[1])).sum()
    )
    summary["cells_outside_coverage_goal_beyond_noise"] = int(
        ((high < GOAL_COVERAGE[0]) | (low > GOAL_COVERAGE[1])).sum()
    )
    chances = [_chance_outside_band(c["coverage_points"]) for c in cells]
    summary["cells_outside_coverage_goal_if_calibrated"] = round(sum(chances), 1)
    summary["chance_every_cell_inside_if_calibrated"] = float(
        f"{np.prod(1.0 - np.array(chances)):.2g}"
    )
    return summary


def _chance_outside_band(points: int) -> float:
    """How likely a bound that covers exactly QUANTILE of the time measures a coverage outside
    the goal band on ``points`` points (binomial): summed over cells, how many cells outside
    the band a perfectly calibrated bound would leave."""
    covered = np.arange(points + 1)
    rate = 100.0 * covered / points
    outside = (rate < GOAL_COVERAGE[0]) | (rate > GOAL_COVERAGE[1])
    return float(binom.pmf(covered[outside], points, QUANTILE).sum())


def timing_2000(traces: Path, extra: tuple[str, ...] = ()) -> dict:
    """Selection over every candidate and block on 2,000 15-min GenAI points (CPU seconds), and
    one update plus forecast of each model it chose (CPU ms per update over 100 of them, and
    the median wall time of one); median of a few selections."""
    genai = pd.read_csv(
        traces / "alibaba-genai-2026/lora_request_trace.csv", usecols=["gmt_create"]
    )
    full = bin_events(genai["gmt_create"], "15min").to_numpy()
    y = full[:2000]
    max_h = max(HORIZONS)
    factories = factories_with(900, max_h, len(y), extra)
    cycle = shortest_cycle(900, SEASONS, len(y))
    cpus, walls = [], []
    for _ in range(TIMING_REPEATS):
        wall, cpu = time.perf_counter(), time.process_time()
        selection = select_model(factories, y, HORIZONS, QUANTILE, cycle=cycle)
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    fitted = fit_chosen(selection, factories, y)
    updates, update_walls = {}, {}
    for name, model in fitted.items():
        per = []
        cpu = time.process_time()
        for v in full[2000:2100]:
            started = time.perf_counter()
            model.update(v)
            model.predict(HORIZONS, QUANTILE)
            per.append(time.perf_counter() - started)
        updates[name] = round((time.process_time() - cpu) / len(per) * 1000, 3)
        update_walls[name] = round(float(np.median(per)) * 1000, 3)
    return {
        "selection_cpu_seconds": round(float(np.median(cpus)), 2),
        "selection_wall_seconds": round(float(np.median(walls)), 2),
        "update_ms": updates,
        "update_wall_ms": update_walls,
        "candidates": list(factories),
        "repeats": TIMING_REPEATS,
    }


# -- Offline replay of combination rules (--rules) ---------------------------------------------
# Rules that weigh the candidates by their past out-of-sample errors, replayed from the
# candidates' own forecasts (every single model refitted every re-selection interval from the
# first quarter of the history on, so each rule has as long a record to learn from as the
# selection's backtest; in the test window the refits are the service's). A rule sets its
# weights at each refit from the errors whose targets came before it, and keeps them through
# the interval. Point forecasts only: these rules were tried for issue 19's geometric-mean goal
# (docs/predictor-accuracy.md, "Fifth round" and "Seventh round"), and none is a model of the
# service.
COMBINED = ("ensemble", "ensemble_trimmed", "combination")
RULE_TOP, RULE_POWER = 3, 2.0  # inverse-squared error over the three best, as `combination`
RULE_SHRINK = 0.5  # the rule's share of the forecast; the rest is the median ensemble's
RULE_HALF_LIFE = 14.0  # in re-selection intervals (days on GenAI)
RULE_PHASE_HOURS = 1.0  # the Gaussian kernel's width over the target's time of day
RULE_SWITCH_Z = 1.645  # one-sided 5 %: one rival (the median) for the gated rule
RULE_WARMUP = 3  # intervals of errors before the gated rule scores itself
# The least-absolute-error convex weights (seventh round), chosen on the design windows.
RULE_LP_HALF_LIFE = 7.0  # in re-selection intervals (days on GenAI)
RULE_LP_SHRINK = 0.1  # the weights' share of the forecast; the rest is the median ensemble's
RULE_LP_WINDOW: int | None = 2  # re-selection intervals of past origins; None: all


def rule_inputs(spec: dict, start: int, extra: tuple[str, ...] = ()) -> dict:
    """Every single candidate's forecasts from the first quarter of the history to the end of
    the window (refitted every ``reselect`` points, on the window's own refit points), the
    median ensemble of them (and its members' names), and what each forecast was for. Each
    single model of ``extra`` (one offered on request) joins the singles, and
    ``ensemble_with_<name>`` is the median of the ensemble's members and it."""
    y, step, every = spec["y"][: start + spec["test"]], spec["step"], spec["reselect"]
    first = start - ((start - int(start * 0.25)) // every) * every
    factories = factories_with(step, max(HORIZONS), start, extra)
    # The default median ensemble, whatever ``extra`` adds to the one a target names.
    ensemble = candidate_factories(step, SEASONS, max(HORIZONS), start)["ensemble"]()
    assert isinstance(ensemble, Combination)
    singles = {n: f for n, f in factories.items() if n not in (*COMBINED, "tracking")}
    refits = list(range(first, len(y), every))
    forecasts, _, _ = candidate_forecasts(singles, y, first, refits, max(HORIZONS))
    points = {n: f.point for n, f in forecasts.items() if n in singles}
    # NaN wherever a member could not run (a weekly model before two weeks of history), as the
    # selection leaves a combination unscored where a member has no forecast.
    points["ensemble"] = np.median(np.stack([points[m] for m in ensemble.voters()]), axis=0)
    for name in extra:
        if name in points and name not in ensemble.member_names():
            members = [points[m] for m in ensemble.voters()] + [points[name]]
            points[f"ensemble_with_{name}"] = np.median(np.stack(members), axis=0)
    # Phases of the day only where a daily season is usable (not on the hour-long Azure traces).
    day = round(DAY / step) if usable_seasons(step, SEASONS, start) else 0
    return dict(
        first=first,
        start=start,
        every=every,
        step=step,
        day=day,
        points=points,
        members=ensemble.voters(),
        actual=forecast_targets(y, first, max(HORIZONS)),
    )


def phase_scores(
    errors: np.ndarray,
    actual: np.ndarray,
    ages: np.ndarray,
    target_phases: np.ndarray | None,
    day: int,
    step: float,
    half_life: float = RULE_HALF_LIFE,
    phase_hours: float | None = RULE_PHASE_HOURS,
) -> np.ndarray:
    """Each expert's recency-weighted WAPE (experts x phases of the day, or experts x 1 without
    phases) from its absolute ``errors`` (experts x past points) on ``actual``: a point ``ages``
    re-selection intervals old weighs ``0.5 ** (age / half_life)``, and for the score at phase
    p a Gaussian of its target's distance in hours from p (``phase_hours`` wide; ``None`` or no
    ``target_phases``: every phase alike). Points with a non-finite error weigh nothing."""
    ok = np.isfinite(errors).all(axis=0) & np.isfinite(actual)
    w = 0.5 ** (ages / half_life) * ok
    e, a = np.where(ok, errors, 0.0), np.where(ok, np.abs(actual), 0.0)
    if target_phases is None or phase_hours is None or not day:
        return ((e @ w) / max(float(a @ w), 1e-12))[:, None]
    distance = np.abs(np.arange(day)[:, None] - target_phases[None, :])
    hours = np.minimum(distance, day - distance) * step / 3600.0
    kernel = np.exp(-0.5 * (hours / phase_hours) ** 2) * w[None, :]  # phases x points
    return (e @ kernel.T) / np.maximum(kernel @ a, 1e-12)[None, :]


def rule_weights(scores: np.ndarray, mode: str) -> np.ndarray:
    """Weights over the experts (experts x columns) from their scores: ``inverse``, the top
    ``RULE_TOP`` by inverse-squared score; ``leader``, the lowest alone."""
    if mode == "leader":
        w = (scores == scores.min(axis=0, keepdims=True)).astype(float)
    else:
        w = np.zeros_like(scores)
        top = np.argsort(scores, axis=0, kind="stable")[:RULE_TOP]
        np.put_along_axis(
            w, top, np.take_along_axis(scores, top, axis=0).clip(1e-12) ** -RULE_POWER, axis=0
        )
    return w / w.sum(axis=0, keepdims=True)


def weighted_rule(
    inputs: dict,
    rows: slice,
    mode: str = "inverse",
    shrink: float | None = None,
    phases: bool = True,
    seasonal_only: bool = True,
) -> np.ndarray:
    """The forecasts (rows x horizons) of a weighting rule for the interval ``rows`` (origins
    after ``first``): per horizon, weights over every single model and the median ensemble
    from their errors on targets before the interval, per phase of the target's day when
    ``phases``; the result mixed with the median ensemble (``shrink`` of it the rule's, default
    ``RULE_SHRINK``). With ``seasonal_only``, a series without a daily season gets the median
    ensemble."""
    points, actual, day = inputs["points"], inputs["actual"], inputs["day"]
    shrink = RULE_SHRINK if shrink is None else shrink
    median = points["ensemble"][rows]
    if seasonal_only and not day:
        return median
    names = [n for n in points if np.isfinite(points[n][rows]).all()]
    out = np.empty_like(median)
    first, begin = inputs["first"], rows.start
    origins = np.arange(rows.start, rows.stop)
    for h in HORIZONS:
        known = np.arange(max(0, begin - h + 1))  # targets seen before the interval
        errors = np.stack([np.abs(points[n][known, h - 1] - actual[known, h - 1]) for n in names])
        ages = (begin - known) / inputs["every"]
        target = (first + known + h - 1) % day if (phases and day) else None
        scores = phase_scores(
            errors,
            actual[known, h - 1],
            ages,
            target,
            day,
            inputs["step"],
            half_life=RULE_HALF_LIFE,
            phase_hours=RULE_PHASE_HOURS if phases else None,
        )
        column = (first + origins + h - 1) % day if scores.shape[1] > 1 else 0 * origins
        weights = rule_weights(scores, mode)[:, column]  # experts x rows
        forecast = (weights * np.stack([points[n][rows, h - 1] for n in names])).sum(axis=0)
        out[:, h - 1] = shrink * forecast + (1.0 - shrink) * median[:, h - 1]
    return out


def gated_rule(inputs: dict, rows: slice, cache: dict) -> np.ndarray:
    """``weighted_rule`` at a horizon only where its past intervals beat the median ensemble
    by a significant margin (the selection's one-sided Diebold-Mariano test on per-interval
    WAPE differences, recency-weighted), else the median ensemble."""
    points, actual, every = inputs["points"], inputs["actual"], inputs["every"]
    if "all" not in cache:
        rule = np.full_like(points["ensemble"], np.nan)
        for b in range(RULE_WARMUP * every, len(rule), every):
            block = slice(b, min(len(rule), b + every))
            rule[block] = weighted_rule(inputs, block)
        cache["all"] = rule
    rule, out = cache["all"], points["ensemble"][rows].copy()
    for h in HORIZONS:
        diffs, weights = [], []
        for b in range(RULE_WARMUP * every, rows.start - every + 1, every):
            past = np.arange(b, b + every)
            past = past[past + h - 1 < rows.start]
            if len(past) < every // 2:
                continue
            a = actual[past, h - 1]
            diffs.append(wape(a, points["ensemble"][past, h - 1]) - wape(a, rule[past, h - 1]))
            weights.append(0.5 ** ((rows.start - b) / every / HALF_LIFE_BLOCKS))
        if len(diffs) >= 2 and significant_lead(np.array(diffs), np.array(weights), RULE_SWITCH_Z):
            out[:, h - 1] = rule[rows, h - 1]
    return out


def residual_rule(inputs: dict, rows: slice) -> np.ndarray:
    """The median ensemble plus half of ``beta_h`` times its last one-step error, ``beta_h``
    fitted by recency-weighted least squares on the errors before the interval: a level
    correction the seasonal members are slow to make."""
    point, actual = inputs["points"]["ensemble"], inputs["actual"]
    last = np.concatenate([[0.0], (actual[:, 0] - point[:, 0])[:-1]])
    last = np.where(np.isfinite(last), last, 0.0)
    out = point[rows].copy()
    for h in HORIZONS:
        known = np.arange(1, max(1, rows.start - h + 1))
        target = actual[known, h - 1] - point[known, h - 1]
        ok = np.isfinite(target)
        w = 0.5 ** ((rows.start - known) / inputs["every"] / RULE_HALF_LIFE) * ok
        x, t = last[known], np.where(ok, target, 0.0)
        beta = float((w * x) @ t / max(float((w * x) @ x), 1e-12))
        out[:, h - 1] = np.maximum(point[rows, h - 1] + 0.5 * beta * last[rows], 0.0)
    return out


def one_vote_rule(inputs: dict, rows: slice) -> np.ndarray:
    """The median of the ensemble's members with one vote each: the default before the eighth
    round gave `seasonal_mean` a second one, kept as the control of that change."""
    points, members = inputs["points"], dict.fromkeys(inputs["members"])
    return np.median(np.stack([points[m][rows] for m in members]), axis=0)


def lp_weights_rule(
    inputs: dict,
    rows: slice,
    half_life: float = RULE_LP_HALF_LIFE,
    shrink: float = RULE_LP_SHRINK,
    window: int | None = RULE_LP_WINDOW,
) -> np.ndarray:
    """The causal version of the per-block weights bound: per horizon, the convex weights over
    every single model (the seasonal copies among them) and the median ensemble with the least
    recency-weighted sum of absolute errors on targets before the interval (the last ``window``
    intervals of origins, or all; a point ``half_life`` intervals old weighs half), found by the
    hindsight module's linear programme; ``shrink`` of the forecast theirs, the rest the median
    ensemble's. Candidates without a forecast in the interval are left out, and past points
    where a remaining one has none."""
    points, actual, every = inputs["points"], inputs["actual"], inputs["every"]
    median = points["ensemble"][rows]
    names = [n for n in points if np.isfinite(points[n][rows]).all()]
    begin = rows.start
    oldest = 0 if window is None else max(0, begin - window * every)
    out = median.copy()
    for h in HORIZONS:
        known = np.arange(oldest, max(oldest, begin - h + 1))  # targets seen before the interval
        past = np.column_stack([points[n][known, h - 1] for n in names])
        ok = np.isfinite(actual[known, h - 1]) & np.isfinite(past).all(axis=1)
        if not ok.any():
            continue
        ages = (begin - known[ok]) / every
        weights, _ = least_absolute_weights(
            actual[known[ok], h - 1], past[ok], 0.5 ** (ages / half_life)
        )
        forecast = np.column_stack([points[n][rows, h - 1] for n in names]) @ weights
        out[:, h - 1] = shrink * forecast + (1.0 - shrink) * median[:, h - 1]
    return out


RULES: dict[str, tuple[str, Callable[[dict, slice, dict], np.ndarray]]] = {
    "median": (
        "the median ensemble (the first incumbent today)",
        lambda i, r, c: i["points"]["ensemble"][r],
    ),
    "phase_inverse": (
        "per horizon and hour of the target's day (+-1 h kernel): inverse-squared error over "
        "the best 3 of every single model and the median, half-life 14 intervals, half of it "
        "mixed with the median; no daily season: the median",
        lambda i, r, c: weighted_rule(i, r),
    ),
    "phase_inverse_everywhere": (
        "phase_inverse, also without a daily season (errors pooled over the interval)",
        lambda i, r, c: weighted_rule(i, r, seasonal_only=False),
    ),
    "horizon_inverse": (
        "phase_inverse without phases: weights per horizon only",
        lambda i, r, c: weighted_rule(i, r, phases=False),
    ),
    "phase_leader": (
        "the leader per horizon and hour alone (no mixing); no daily season: the median",
        lambda i, r, c: weighted_rule(i, r, mode="leader", shrink=1.0),
    ),
    "phase_inverse_gated": (
        "phase_inverse only where it beat the median on past intervals (Diebold-Mariano, 5 %)",
        gated_rule,
    ),
    "residual_correction": (
        "the median plus half a least-squares correction from its last one-step error",
        lambda i, r, c: residual_rule(i, r),
    ),
    "lp_weights": (
        f"per horizon, the convex weights over every single model and the median with the "
        f"least absolute error on the past {RULE_LP_WINDOW or 'all'} intervals (half-life "
        f"{RULE_LP_HALF_LIFE:g}), {RULE_LP_SHRINK:g} of it mixed with the median",
        lambda i, r, c: lp_weights_rule(i, r),
    ),
    "one_vote_each": (
        "the median ensemble with one vote for every member (the default before the eighth "
        "round's second vote for seasonal_mean)",
        lambda i, r, c: one_vote_rule(i, r),
    ),
}


def extra_rules(extra: tuple[str, ...]) -> dict:
    """For each single model of ``extra``: it alone, and the median ensemble with it as one
    more member (points only, as every rule here); on a series where it is not offered (a
    model that needs a season), the median ensemble."""
    rules: dict[str, tuple[str, Callable[[dict, slice, dict], np.ndarray]]] = {}
    for name in extra:
        if name == "tracking":  # a combination, not a single model
            continue
        rules[name] = (
            f"{name} alone (the median ensemble where it is not offered)",
            lambda i, r, c, n=name: i["points"].get(n, i["points"]["ensemble"])[r],
        )
        rules[f"median_with_{name}"] = (
            f"the median of the ensemble's members and {name}",
            lambda i, r, c, n=name: i["points"].get(f"ensemble_with_{n}", i["points"]["ensemble"])[
                r
            ],
        )
    return rules


def run_rules(specs: list[dict], smoke: bool, extra: tuple[str, ...] = ()) -> dict:
    """Every rule's ratio to the best baseline per cell, design and check (see RULES); with
    ``extra``, also each of those models alone and as a member of the median (extra_rules)."""
    rules = RULES | extra_rules(extra)
    cells: dict[str, dict[str, list[dict]]] = {r: {"design": [], "check": []} for r in rules}
    seconds: dict[str, list[float]] = {r: [] for r in rules}
    for spec in specs:
        starts = windows(spec, smoke)
        for k, start in enumerate(starts):
            group = "check" if k == len(starts) - 1 else "design"
            inputs = rule_inputs(spec, start, extra)
            points, actual = inputs["points"], inputs["actual"]
            window = slice(start - inputs["first"], len(actual))
            best = {
                h: min(
                    _wape(actual[window, h - 1], points[b][window, h - 1])
                    for b in BASELINES
                    if b in points and np.isfinite(points[b][window, h - 1]).all()
                )
                for h in HORIZONS
            }
            for rule, (_, forecast) in rules.items():
                out = np.full_like(actual[window], np.nan)
                cache: dict = {}
                for b in range(window.start, window.stop, inputs["every"]):
                    rows = slice(b, min(window.stop, b + inputs["every"]))
                    started = time.process_time()
                    out[rows.start - window.start : rows.stop - window.start] = forecast(
                        inputs, rows, cache
                    )
                    seconds[rule].append(time.process_time() - started)
                for h in HORIZONS:
                    ratio = _wape(actual[window, h - 1], out[:, h - 1]) / best[h]
                    cells[rule][group].append(dict(series=spec["name"], window=k, h=h, ratio=ratio))
        print(f"{spec['name']} rules done", file=sys.stderr)
    summary: dict[str, dict] = {}
    for rule, groups in cells.items():
        summary[rule] = {"cpu_ms_per_interval": round(1000 * float(np.mean(seconds[rule])), 2)}
        for group, group_cells in groups.items():
            if not group_cells:
                continue
            ratios = np.array([c["ratio"] for c in group_cells])
            worst = group_cells[int(np.argmax(ratios))]
            summary[rule][group] = {
                "cells": len(ratios),
                "geomean_ratio": round(float(np.exp(np.mean(np.log(ratios)))), 3),
                "worst_ratio": round(float(ratios.max()), 3),
                "worst_cell": f"{worst['series']} window {worst['window']} h{worst['h']}",
                "cells_over_goal_ratio": int((ratios > GOAL_RATIO).sum()),
            }
            # Per trace: the rules act on the GenAI series' daily season, not on Azure's hour.
            for source in ("genai", "azure"):
                mine = [np.log(c["ratio"]) for c in group_cells if c["series"].startswith(source)]
                if mine:
                    summary[rule][group][f"{source}_geomean_ratio"] = round(
                        float(np.exp(np.mean(mine))), 3
                    )
    for groups in cells.values():
        for group_cells in groups.values():
            for c in group_cells:
                c["ratio"] = round(c["ratio"], 3)
    return {"rules": {r: d for r, (d, _) in rules.items()}, "summary": summary, "cells": cells}


def print_rules(report: dict) -> None:
    print("\n== combination rules replayed offline (point forecasts; ratio to the best baseline)")
    print(
        f"{'rule':<26}{'design: geomean (GenAI, Azure) / worst / cells > 0.85':<56}"
        f"{'check: the same':<56}CPU-ms per interval"
    )
    for rule, s in report["summary"].items():
        row = ""
        for group in ("design", "check"):
            g = s.get(group)
            text = "-"
            if g:
                parts = [
                    f"{g[f'{t}_geomean_ratio']:.3f}"
                    for t in ("genai", "azure")
                    if f"{t}_geomean_ratio" in g
                ]
                text = (
                    f"{g['geomean_ratio']:.3f} ({', '.join(parts)}) / {g['worst_ratio']:.3f} / "
                    f"{g['cells_over_goal_ratio']}"
                )
            row += text.ljust(56)
        print(f"{rule:<26}{row}{s['cpu_ms_per_interval']:.2f}")
    for rule, description in report["rules"].items():
        print(f"  {rule}: {description}")


def print_report(report: dict) -> None:
    hs = [str(h) for h in HORIZONS]
    for name, series in report["series"].items():
        for k, w in enumerate(series["windows"]):
            role = "check" if k == len(series["windows"]) - 1 else "design"
            print(
                f"\n== {name}, window {k} ({role}): history {w['history_points']} bins, "
                f"test {w['test_points']}  (WAPE %, per horizon)"
            )
            print(f"{'model':<26}" + "".join(f"{'h' + h:>7}" for h in hs))
            for model, v in w["models"].items():
                print(f"{model:<26}" + "".join(f"{v[h]:>7.1f}" for h in hs))
            rows = (
                ("selected (daily reselect)", w["selected"], ".1f"),
                ("  ratio to best baseline", w["ratio"], ".2f"),
                ("  oracle ratio", w["oracle_ratio"], ".2f"),
                ("  block oracle ratio", w["block_oracle_ratio"], ".2f"),
                ("  cell weights oracle", w["cell_weights_oracle_ratio"], ".2f"),
                ("  block weights oracle", w["block_weights_oracle_ratio"], ".2f"),
                ("  point oracle ratio", w["point_oracle_ratio"], ".2f"),
                ("  coverage of 0.9 upper", w["coverage"], ".1f"),
            )
            for label, v, fmt in rows:
                print(f"{label:<26}" + "".join(f"{format(v[h], fmt):>7}" for h in hs))
            print(
                f"{'  coverage 95 % interval':<26}"
                + "".join(f"{lo:>4.0f}-{hi:<2.0f}" for lo, hi in w["coverage_interval"].values())
            )
            print(
                "  chosen at first selection: "
                + ", ".join(f"h{h}={m}" for h, m in w["chosen"][0].items())
            )
    for group, s in report["summary"].items():
        if not s:
            continue
        print(f"\n== summary, {group} windows ({s['cells']} cells)")
        print(
            f"  selected/best baseline: geomean {s['geomean_ratio']:.3f} (goal <= "
            f"{GOAL_GEOMEAN}), worst {s['worst_ratio']:.3f} at {s['worst_cell']} (goal <= "
            f"{GOAL_RATIO}), cells over {GOAL_RATIO}: {s['cells_over_goal_ratio']}"
        )
        for oracle, label in ORACLES.items():
            print(
                f"  oracle, {label} in hindsight: geomean "
                f"{s[f'{oracle}_geomean_ratio']:.3f}, worst {s[f'{oracle}_worst_ratio']:.3f}, "
                f"cells over {GOAL_RATIO}: {s[f'{oracle}_cells_over_goal_ratio']}"
            )
        print(
            f"  coverage of the 0.9 upper bound: {s['coverage_min']:.1f}-"
            f"{s['coverage_max']:.1f} %, cells outside 85-95 %: "
            f"{s['cells_outside_coverage_goal']} as measured, "
            f"{s['cells_outside_coverage_goal_beyond_noise']} beyond binomial noise (Wilson "
            f"95 % interval clear of the band); a bound covering exactly {QUANTILE:.0%} would "
            f"leave {s['cells_outside_coverage_goal_if_calibrated']} outside on average, and "
            f"have them all inside with a chance of "
            f"{s['chance_every_cell_inside_if_calibrated']:.2g}"
        )
    t = report.get("timing_2000_points")
    if t:
        print(
            f"\n== cost on 2,000 15-min points ({len(t['candidates'])} candidates), median of "
            f"{t['repeats']}: selection {t['selection_cpu_seconds']:.2f} CPU-s "
            f"({t['selection_wall_seconds']:.2f} s wall; goal <= 5 CPU-s); update + forecast "
            + ", ".join(
                f"{n} {ms:.2f} CPU-ms ({t['update_wall_ms'][n]:.2f} ms wall, median)"
                for n, ms in t["update_ms"].items()
            )
            + " (goal <= 5 ms)"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=str(ROOT / "bench/results/predictor.json"))
    parser.add_argument(
        "--traces",
        help="folder holding the whole traces (default: $AUTOGLM_TRACES_DIR, else the cache "
        "`autoglm datasets fetch` fills)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="one series, its last window, one selection, no timing (under a minute)",
    )
    parser.add_argument(
        "--extra-models",
        nargs="+",
        default=[],
        metavar="NAME",
        help="models offered only when a target names them (gru, tracking, boosted, hierarchy) to "
        "add to the candidates, alone and in the selection",
    )
    parser.add_argument(
        "--rules",
        action="store_true",
        help="instead of the service replay, replay the combination rules tried for the "
        "geometric-mean goal from the candidates' own forecasts (design and check)",
    )
    args = parser.parse_args(argv)
    extra = tuple(args.extra_models)
    unknown = sorted(set(extra) - set(ON_REQUEST))
    if unknown:
        print(
            f"bench/predictor.py: --extra-models {unknown[0]} is not offered on request; "
            f"choose from: {', '.join(ON_REQUEST)}",
            file=sys.stderr,
        )
        return 2
    traces = traces_dir(args.traces)
    needed = (
        ("genai-requests",)
        if args.smoke
        else ("genai-requests", "azure-llm-conv", "azure-llm-code")
    )
    for name in needed:
        if not expected_path(name, traces).is_file():
            print(
                f"bench/predictor.py: {name} is not in {traces}: {fetch_hint(name)}",
                file=sys.stderr,
            )
            return 2
    started = time.perf_counter()
    if args.rules:
        loads = [round(x, 2) for x in os.getloadavg()]
        rules = run_rules(series_specs(traces, args.smoke), args.smoke, extra)
        rules |= {
            "cpus": os.cpu_count(),
            "load_average_at_start": loads,
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
            "total_seconds": round(time.perf_counter() - started, 1),
        }
        print_rules(rules)
        print(
            f"\nmachine: {rules['cpus']} CPUs, load average {loads} at start, "
            f"{rules['load_average_at_end']} at end"
        )
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rules, indent=2) + "\n")
        print(f"\nwrote {args.json} ({rules['total_seconds']} s)")
        return 0
    report: dict = {
        "quantile": QUANTILE,
        "horizons": list(HORIZONS),
        "smoke": args.smoke,
        "extra_models": list(extra),
        "cpus": os.cpu_count(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "series": {},
    }
    cells = {"design": [], "check": []}
    for spec in series_specs(traces, args.smoke):
        starts = windows(spec, args.smoke)
        runs = [run_window(spec, s, args.smoke, extra) for s in starts]
        report["series"][spec["name"]] = {"points": len(spec["y"]), "windows": runs}
        for k, w in enumerate(runs):
            group = "check" if k == len(runs) - 1 else "design"
            for h in map(str, HORIZONS):
                cells[group].append(
                    dict(
                        series=spec["name"],
                        window=k,
                        h=h,
                        ratio=w["ratio"][h],
                        oracle_ratio=w["oracle_ratio"][h],
                        block_oracle_ratio=w["block_oracle_ratio"][h],
                        cell_weights_oracle_ratio=w["cell_weights_oracle_ratio"][h],
                        block_weights_oracle_ratio=w["block_weights_oracle_ratio"][h],
                        point_oracle_ratio=w["point_oracle_ratio"][h],
                        coverage=w["coverage"][h],
                        coverage_interval=w["coverage_interval"][h],
                        coverage_points=w["coverage_points"][h],
                    )
                )
        print(f"{spec['name']} done after {time.perf_counter() - started:.0f} s", file=sys.stderr)
    report["summary"] = {
        "design": summarise(cells["design"]),
        "check": summarise(cells["check"]),
        "all": summarise(cells["design"] + cells["check"]),
    }
    if not args.smoke:
        report["timing_2000_points"] = timing_2000(traces, extra)
    report["total_seconds"] = round(time.perf_counter() - started, 1)
    report["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print_report(report)
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
