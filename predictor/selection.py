"""Choose the model for a series by how it did in a rolling-origin backtest on that series.

Every candidate is backtested on the most recent part of the history; the one with the lowest
WAPE wins, per horizon (the best model one step ahead is often not the best six steps ahead) and
overall (mean WAPE over the horizons). Ties go to the candidate listed first, so list simpler
models first. A candidate that fails is left out and its error kept, never fatal.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from predictor.backtest import BacktestResult, rolling_origin
from predictor.models.base import ForecastModel

log = logging.getLogger(__name__)


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


def select_model(
    factories: Mapping[str, Callable[[], ForecastModel]],
    series: np.ndarray,
    horizons: Sequence[int],
    quantile: float = 0.9,
    validation: int | None = None,
) -> Selection:
    """Backtest each candidate on the last ``validation`` points of ``series`` and choose."""
    v = validation or validation_size(len(series), max(horizons))
    test_start = len(series) - v
    results: dict[str, BacktestResult] = {}
    failures: dict[str, str] = {}
    for name, factory in factories.items():
        try:
            results[name] = rolling_origin(factory, series, horizons, test_start, quantile)
        except (ValueError, RuntimeError, np.linalg.LinAlgError) as exc:
            failures[name] = str(exc)
            log.info("candidate left out", extra={"model": name, "reason": str(exc)})
    if not results:
        raise ValueError(f"no model could be backtested: {failures}")
    selection = choose(results, horizons)
    selection.failures = failures
    return selection
