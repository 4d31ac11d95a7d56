"""Choose the model for a series by how it did in a rolling-origin backtest on that series.

Every candidate is backtested on the most recent part of the history, split into ``folds``
consecutive windows. At the start of each window the candidate is refitted on everything before
it (as the scheduled refit would have done) and then only updated through the window. One
window is a poor judge: it may be a quiet weekend, or follow a quiet first week that a learned
model cannot cope with yet. The windows' errors are pooled, each recent window counting more
(a weight that halves every ``half_life`` windows back), so the choice follows how models do
now without resting on one stretch. Only points before the selection are ever used.

Choosing the lowest pooled WAPE outright makes the choice swing between near-tied candidates
from one refit to the next, and each swing picks whichever was luckier on the last few days. So
one candidate per horizon is the *incumbent*: the model chosen at the previous selection, or,
the first time, the median ensemble (a combination of models of different kinds, the a-priori
safest choice). A challenger (the lowest pooled WAPE) replaces it only when its pooled WAPE is
lower by more than the standard error of the paired per-window differences between the two
(the "one-standard-error rule" of cross-validation): a lead smaller than the window-to-window
noise is no evidence. With fewer than two windows in common the noise cannot be measured and
the lowest pooled WAPE wins. The same rule picks the overall model on the mean WAPE over the
horizons. A candidate that fails is left out and its error kept, never fatal; one that cannot
run on the older windows (too little history then) is scored on the windows it can run on,
provided the most recent is one of them.

An ensemble's members (and its other combinations of them) are scored from the ensemble's own
pass (they are fitted and updated inside it exactly as they would be alone), so the costly
members are fitted once per window, not twice. Each candidate is one instance, refitted at the
start of every window as the scheduled refit would refit it: a model that can start from its
previous fit (the GRU) does so.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from predictor.backtest import BacktestResult, pool, rolling_origin_with_parts
from predictor.models.base import ForecastModel

log = logging.getLogger(__name__)

FOLDS = 4
HALF_LIFE_FOLDS = 2.0
PREFERRED = "ensemble"

# per candidate: window index -> horizon -> WAPE on that window alone
FoldScores = Mapping[str, Mapping[int, Mapping[int, float]]]


@dataclass
class Selection:
    """The winner per horizon and overall, with every candidate's scores and failures."""

    overall: str
    per_horizon: dict[int, str]
    results: dict[str, BacktestResult]
    failures: dict[str, str] = field(default_factory=dict)
    fold_wape: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)


def _finite(value: float) -> float:
    return value if math.isfinite(value) else math.inf


def _keep_or_switch(
    names: list[str],
    pooled: Callable[[str], float],
    per_fold: Callable[[str], dict[int, float]],
    incumbent: str | None,
) -> str:
    """The lowest pooled score, unless the incumbent trails it by no more than one standard
    error of their paired per-window differences (see the module doc)."""
    best = min(names, key=lambda n: _finite(pooled(n)))
    if incumbent not in names or incumbent == best or not math.isfinite(pooled(incumbent)):
        return best
    best_folds, incumbent_folds = per_fold(best), per_fold(incumbent)
    diffs = [
        best_folds[k] - incumbent_folds[k]
        for k in best_folds.keys() & incumbent_folds.keys()
        if math.isfinite(best_folds[k]) and math.isfinite(incumbent_folds[k])
    ]
    if len(diffs) < 2:
        return best
    standard_error = float(np.std(diffs, ddof=1)) / math.sqrt(len(diffs))
    return best if pooled(incumbent) - pooled(best) > standard_error else incumbent


def choose(
    results: Mapping[str, BacktestResult],
    horizons: Sequence[int],
    fold_wape: FoldScores | None = None,
    previous: Selection | None = None,
) -> Selection:
    """Pick the model per horizon and overall from ``results`` (in order; ties to the first).

    Without ``fold_wape`` (per-window scores) the lowest WAPE wins; with them, the incumbent
    (``previous``'s choice, else the ensemble) stays unless beaten by more than one standard
    error.
    """
    if not results:
        raise ValueError("no backtest results to choose from")
    names = list(results)
    folds = fold_wape or {}

    def fold_scores(name: str, h: int | None) -> dict[int, float]:
        by_fold = folds.get(name, {})
        if h is not None:
            return {k: v[h] for k, v in by_fold.items()}
        return {k: float(np.mean([v[x] for x in horizons])) for k, v in by_fold.items()}

    def incumbent(h: int | None) -> str | None:
        if previous is not None:
            chosen = previous.overall if h is None else previous.per_horizon.get(h)
            if chosen in results:
                return chosen
        return PREFERRED if PREFERRED in results else None

    per_h = {
        h: _keep_or_switch(
            names,
            lambda n, h=h: results[n].wape[h],
            lambda n, h=h: fold_scores(n, h),
            incumbent(h),
        )
        for h in horizons
    }
    overall = _keep_or_switch(
        names,
        lambda n: float(np.mean([results[n].wape[h] for h in horizons])),
        lambda n: fold_scores(n, None),
        incumbent(None),
    )
    return Selection(
        overall=overall,
        per_horizon=per_h,
        results=dict(results),
        fold_wape={n: {k: dict(v) for k, v in f.items()} for n, f in folds.items()},
    )


def validation_size(n_points: int, max_horizon: int, fraction: float = 0.25) -> int:
    """How many recent points to backtest on: a fraction of the history, at least enough
    origins for every horizon to be scored a few times."""
    return max(min(int(n_points * fraction), 2000), 4 * max_horizon)


def minimum_history(max_horizon: int) -> int:
    """The fewest points on which selection can backtest every horizon and still fit on two."""
    n = 2
    while n - validation_size(n, max_horizon) < 2:
        n += 1
    return n


def validation_folds(
    n_points: int, max_horizon: int, validation: int, folds: int, cycle: int = 0
) -> list[int]:
    """Start of each validation window (the last ends at ``n_points``); fewer windows when
    the validation is too short for each to score every horizon a few times, or to span one
    ``cycle`` (the shortest season, in steps). A window shorter than a day scores only some
    hours of it: its errors are not comparable with another window's, and the spread of the
    differences between windows (the one-standard-error rule's noise) measures the hours
    they happened to cover, not the models."""
    folds = max(1, min(folds, validation // max(2 * max_horizon, cycle)))
    start = n_points - validation
    return [start + (validation * i) // folds for i in range(folds)]


def select_model(
    factories: Mapping[str, Callable[[], ForecastModel]],
    series: np.ndarray,
    horizons: Sequence[int],
    quantile: float = 0.9,
    validation: int | None = None,
    folds: int = FOLDS,
    half_life: float = HALF_LIFE_FOLDS,
    previous: Selection | None = None,
    cycle: int = 0,
) -> Selection:
    """Backtest each candidate on the last ``validation`` points of ``series``, in ``folds``
    windows refitted at their start (each spanning at least ``cycle`` points, the shortest
    season), and choose on the recency-weighted pooled WAPE, keeping ``previous``'s choice (or
    the ensemble) unless clearly beaten (see the module doc)."""
    v = validation or validation_size(len(series), max(horizons))
    starts = validation_folds(len(series), max(horizons), v, folds, cycle)
    ends = [*starts[1:], len(series)]
    weights = [0.5 ** ((len(starts) - 1 - i) / half_life) for i in range(len(starts))]
    scored: dict[str, dict[int, BacktestResult]] = {name: {} for name in factories}
    errors: dict[str, str] = {}
    # One instance per candidate, refitted at each window's start as the service refits on its
    # schedule: a model that can start from its previous fit (the GRU) does so.
    instances: dict[str, ForecastModel] = {}
    for name, factory in factories.items():
        try:
            instances[name] = factory()
        except (ValueError, RuntimeError) as exc:
            errors[name] = str(exc)
    # Models that hold others run first, so their members are scored from their pass.
    order = sorted(instances, key=lambda n: not instances[n].parts())
    for k, (start, end) in enumerate(zip(starts, ends, strict=True)):
        for name in order:
            if k in scored[name]:
                continue
            try:
                results = rolling_origin_with_parts(
                    lambda model=instances[name]: model, series[:end], horizons, start, quantile
                )
            except (ValueError, RuntimeError, np.linalg.LinAlgError) as exc:
                errors[name] = str(exc)
                continue
            scored[name][k] = next(iter(results.values()))
            for part, result in list(results.items())[1:]:
                if part in scored and k not in scored[part]:
                    scored[part][k] = result
    last = len(starts) - 1
    pooled: dict[str, BacktestResult] = {}
    failures: dict[str, str] = {}
    for name in factories:
        windows = scored[name]
        if last in windows:
            ks = sorted(windows)
            pooled[name] = pool([windows[k] for k in ks], [weights[k] for k in ks])
        else:
            failures[name] = errors.get(name, "not scored on the most recent window")
            log.info("candidate left out", extra={"model": name, "reason": failures[name]})
    if not pooled:
        raise ValueError(f"no model could be backtested: {failures}")
    fold_wape = {
        name: {k: dict(scored[name][k].wape) for k in sorted(scored[name])} for name in pooled
    }
    selection = choose(pooled, horizons, fold_wape, previous)
    selection.failures = failures
    return selection
