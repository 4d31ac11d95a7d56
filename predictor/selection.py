"""Choose the model for a series by how it did in a rolling-origin backtest on that series.

Every candidate is backtested on the most recent part of the history, split into ``folds``
consecutive windows. At the start of each window the candidate is refitted on everything before
it (as the scheduled refit would have done) and then only updated through the window. One
window is a poor judge: it may be a quiet weekend, or follow a quiet first week that a learned
model cannot cope with yet. The windows' errors are pooled, each recent window counting more
(a weight that halves every ``half_life`` windows back), so the choice follows how models do
now without resting on one stretch. Only points before the selection are ever used.

The lowest pooled WAPE wins, per horizon (the best model one step ahead is often not the best
six steps ahead) and overall (mean WAPE over the horizons). Ties go to the candidate listed
first, so list simpler models first. A candidate that fails is left out and its error kept,
never fatal; one that cannot run on the older windows (too little history then) is scored on
the windows it can run on, provided the most recent is one of them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from predictor.backtest import BacktestResult, pool, rolling_origin
from predictor.models.base import ForecastModel

log = logging.getLogger(__name__)

FOLDS = 4
HALF_LIFE_FOLDS = 2.0


@dataclass
class Selection:
    """The winner per horizon and overall, with every candidate's scores and failures."""

    overall: str
    per_horizon: dict[int, str]
    results: dict[str, BacktestResult]
    failures: dict[str, str] = field(default_factory=dict)


def choose(results: Mapping[str, BacktestResult], horizons: Sequence[int]) -> Selection:
    """Pick the lowest-WAPE model per horizon and overall from ``results`` (in order)."""
    if not results:
        raise ValueError("no backtest results to choose from")

    def score(value: float) -> float:
        return value if math.isfinite(value) else math.inf

    names = list(results)
    per_h = {h: min(names, key=lambda n, h=h: score(results[n].wape[h])) for h in horizons}
    overall = min(
        names, key=lambda n: score(float(np.mean([results[n].wape[h] for h in horizons])))
    )
    return Selection(overall=overall, per_horizon=per_h, results=dict(results))


def validation_size(n_points: int, max_horizon: int, fraction: float = 0.25) -> int:
    """How many recent points to backtest on: a fraction of the history, at least enough
    origins for every horizon to be scored a few times."""
    return max(min(int(n_points * fraction), 2000), 4 * max_horizon)


def validation_folds(n_points: int, max_horizon: int, validation: int, folds: int) -> list[int]:
    """Start of each validation window (the last ends at ``n_points``); fewer windows when
    the validation is too short for each to score every horizon a few times."""
    folds = max(1, min(folds, validation // (2 * max_horizon)))
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
) -> Selection:
    """Backtest each candidate on the last ``validation`` points of ``series``, in ``folds``
    windows refitted at their start, and choose on the recency-weighted pooled WAPE."""
    v = validation or validation_size(len(series), max(horizons))
    starts = validation_folds(len(series), max(horizons), v, folds)
    ends = [*starts[1:], len(series)]
    weights = [0.5 ** ((len(starts) - 1 - i) / half_life) for i in range(len(starts))]
    results: dict[str, BacktestResult] = {}
    failures: dict[str, str] = {}
    for name, factory in factories.items():
        scored: list[tuple[BacktestResult, float]] = []
        error = ""
        for start, end, weight in zip(starts, ends, weights, strict=True):
            try:
                scored.append(
                    (rolling_origin(factory, series[:end], horizons, start, quantile), weight)
                )
            except (ValueError, RuntimeError, np.linalg.LinAlgError) as exc:
                error = str(exc)
                if end == len(series):
                    scored = []
        if scored:
            results[name] = pool([r for r, _ in scored], [w for _, w in scored])
        else:
            failures[name] = error
            log.info("candidate left out", extra={"model": name, "reason": error})
    if not results:
        raise ValueError(f"no model could be backtested: {failures}")
    selection = choose(results, horizons)
    selection.failures = failures
    return selection
