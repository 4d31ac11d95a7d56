"""Rolling-origin backtest: how a model would have done had it run live on a series.

The model is fitted on the points before ``test_start``; then, at each later origin, it
forecasts the configured horizons, is shown the next point through its cheap ``update`` and,
every ``refit_every`` origins, refitted on everything seen so far, as the service would do on its
schedule. Errors are scored per horizon with measures that survive zero-valued bins: WAPE (sum of
absolute errors over sum of actuals), sMAPE (with 0/0 counted as a perfect 0), the share of
points under-forecast, and the coverage of the upper bound. MAPE is not used: bins can be zero.
All percentages are 0-100. Timing uses an injected clock so the core stays testable.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from predictor.models.base import ForecastModel, as_series


def _weights(actual: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    return np.ones(len(actual)) if weights is None else np.asarray(weights, dtype=float)


def wape(actual: np.ndarray, point: np.ndarray, weights: np.ndarray | None = None) -> float:
    """100 * sum w|actual - point| / sum w|actual|; NaN when every actual is zero.
    ``weights`` (one per point, default 1) let recent points count more."""
    w = _weights(actual, weights)
    denom = (w * np.abs(actual)).sum()
    return float(100.0 * (w * np.abs(actual - point)).sum() / denom) if denom > 0 else float("nan")


def smape(actual: np.ndarray, point: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Mean of 200 * |actual - point| / (|actual| + |point|), with 0/0 counted as 0."""
    denom = np.abs(actual) + np.abs(point)
    ratio = np.divide(
        np.abs(actual - point), denom, out=np.zeros(len(actual), dtype=float), where=denom > 0
    )
    return (
        float(200.0 * np.average(ratio, weights=_weights(actual, weights)))
        if len(actual)
        else float("nan")
    )


def under_rate(actual: np.ndarray, point: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Percentage of points where the point forecast was below the actual value."""
    if not len(actual):
        return float("nan")
    return float(100.0 * np.average(point < actual, weights=_weights(actual, weights)))


def coverage(actual: np.ndarray, upper: np.ndarray, weights: np.ndarray | None = None) -> float:
    """Percentage of actual values at or below the upper bound."""
    if not len(actual):
        return float("nan")
    return float(100.0 * np.average(actual <= upper, weights=_weights(actual, weights)))


def coverage_interval(covered: int, n: int, confidence_z: float = 1.96) -> tuple[float, float]:
    """Wilson score interval (percent) for a coverage of ``covered`` out of ``n`` points: the
    true coverage levels that a score test at that z would not reject. A bound that covers 90 %
    on average still lands anywhere in a few points of it on a short window (the binomial
    spread); a figure whose whole interval lies outside a goal band is off by more than that."""
    if n <= 0:
        return float("nan"), float("nan")
    p = covered / n
    z2 = confidence_z**2
    centre = (p + z2 / (2 * n)) / (1 + z2 / n)
    half = confidence_z / (1 + z2 / n) * np.sqrt(p * (1 - p) / n + z2 / (4 * n * n))
    return float(100.0 * (centre - half)), float(100.0 * (centre + half))


@dataclass
class BacktestResult:
    """Scores of one model per horizon (percent), and what fitting and updating cost."""

    model: str
    horizons: tuple[int, ...]
    wape: dict[int, float]
    smape: dict[int, float]
    under_rate: dict[int, float]
    coverage: dict[int, float]
    fit_seconds: float
    update_seconds: float
    origins: int
    actual: dict[int, np.ndarray] = field(repr=False, default_factory=dict)
    point: dict[int, np.ndarray] = field(repr=False, default_factory=dict)
    upper: dict[int, np.ndarray] = field(repr=False, default_factory=dict)

    def mean_wape(self) -> float:
        return float(np.mean([self.wape[h] for h in self.horizons]))

    def as_json(self) -> dict:
        """The shape ``autoglm-predictor backtest --json`` writes for one model."""

        def per_h(values: dict[int, float]) -> dict[str, float | None]:
            return {str(h): _finite(values[h]) for h in self.horizons}

        return {
            "wape": per_h(self.wape),
            "smape": per_h(self.smape),
            "under_rate": per_h(self.under_rate),
            "coverage": per_h(self.coverage),
            "fit_seconds": _seconds(self.fit_seconds),
            "update_seconds": _seconds(self.update_seconds),
        }


def _seconds(value: float) -> float | None:
    return value if np.isfinite(value) else None


def _finite(value: float) -> float | None:
    return round(value, 4) if np.isfinite(value) else None


def rolling_origin(
    factory: Callable[[], ForecastModel],
    series: Sequence[float] | np.ndarray,
    horizons: Sequence[int],
    test_start: int,
    quantile: float = 0.9,
    refit_every: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> BacktestResult:
    """Backtest a fresh model from ``factory`` over ``series[test_start:]`` (see module doc).

    A forecast issued after seeing ``series[:origin]`` at horizon h is scored against
    ``series[origin + h - 1]``; only targets inside the series count.
    """
    y = as_series(series)
    hs = tuple(sorted(set(int(h) for h in horizons)))
    if not 0 < test_start < len(y):
        raise ValueError(f"test_start must be inside the series (1..{len(y) - 1})")
    model = factory()
    fit_times = []
    started = clock()
    model.fit(y[:test_start])
    fit_times.append(clock() - started)
    pred_point: dict[int, list[float]] = {h: [] for h in hs}
    pred_upper: dict[int, list[float]] = {h: [] for h in hs}
    update_time = 0.0
    updates = 0
    for origin in range(test_start, len(y)):
        if refit_every and origin > test_start and (origin - test_start) % refit_every == 0:
            started = clock()
            model.fit(y[:origin])
            fit_times.append(clock() - started)
        prediction = model.predict(hs, quantile)
        for i, h in enumerate(hs):
            if origin + h - 1 < len(y):
                pred_point[h].append(prediction.point[i])
                pred_upper[h].append(prediction.upper[i])
        started = clock()
        model.update(y[origin])
        update_time += clock() - started
        updates += 1
    return _scored(
        model.name,
        y,
        hs,
        test_start,
        pred_point,
        pred_upper,
        fit_times,
        update_time / max(updates, 1),
    )


def replay_with_selection(
    select: Callable[[np.ndarray], Mapping[int, ForecastModel]],
    series: Sequence[float] | np.ndarray,
    horizons: Sequence[int],
    test_start: int,
    reselect_every: int,
    quantile: float = 0.9,
    clock: Callable[[], float] = time.perf_counter,
) -> BacktestResult:
    """Backtest what the service does: every ``reselect_every`` origins (0: once), ``select``
    (given the history so far) returns the fitted model per horizon; they are updated point by
    point, and each horizon is forecast by its own model."""
    y = as_series(series)
    hs = tuple(sorted(set(int(h) for h in horizons)))
    pred_point: dict[int, list[float]] = {h: [] for h in hs}
    pred_upper: dict[int, list[float]] = {h: [] for h in hs}
    fit_times: list[float] = []
    update_time, updates = 0.0, 0
    chosen: Mapping[int, ForecastModel] = {}
    for origin in range(test_start, len(y)):
        if origin == test_start or (reselect_every and (origin - test_start) % reselect_every == 0):
            started = clock()
            chosen = select(y[:origin])
            fit_times.append(clock() - started)
        for h in hs:
            if origin + h - 1 < len(y):
                p = chosen[h].predict([h], quantile)
                pred_point[h].append(p.point[0])
                pred_upper[h].append(p.upper[0])
        started = clock()
        for model in {id(m): m for m in chosen.values()}.values():
            model.update(y[origin])
        update_time += clock() - started
        updates += 1
    return _scored(
        "selected",
        y,
        hs,
        test_start,
        pred_point,
        pred_upper,
        fit_times,
        update_time / max(updates, 1),
    )


def forecast_targets(y: np.ndarray, first: int, max_horizon: int) -> np.ndarray:
    """What each forecast issued at origins ``first..len(y)-1`` (after seeing ``y[:origin]``)
    is scored against, per horizon 1..max_horizon (NaN past the end of ``y``)."""
    n = len(y)
    out = np.full((n - first, max_horizon), np.nan)
    for h in range(1, max_horizon + 1):
        out[: max(0, n - first - h + 1), h - 1] = y[first + h - 1 :]
    return out


@dataclass
class OriginForecasts:
    """A model's point forecasts at every origin from ``first`` on (origins x horizons; NaN
    where it could not run), and, per refit start, the errors on its calibration tail then
    (one array per horizon: what a combination weighs its members by)."""

    point: np.ndarray
    tails: dict[int, list[np.ndarray]] = field(default_factory=dict)
    error: str | None = None


FAILURES = (ValueError, RuntimeError, np.linalg.LinAlgError)


def expanding_origin(
    factory: Callable[[], ForecastModel],
    y: np.ndarray,
    first: int,
    starts: Sequence[int],
    max_horizon: int,
) -> OriginForecasts:
    """Fit a fresh model on ``y[:start]`` at each of ``starts`` (the first is ``first``) and
    replay it in bulk up to the next start: its forecasts at every origin as the scheduled
    refit would have made them, at the cost of one fit per start. A fit that fails leaves its
    stretch NaN and its error in ``error``."""
    n = len(y)
    result = OriginForecasts(np.full((n - first, max_horizon), np.nan))
    for start, end in zip(starts, [*starts[1:], n], strict=True):
        try:
            model = factory()
            model.fit(y[:start])
            before = model.latest_path().copy()
            tails = [model.residuals.errors(h) for h in range(1, max_horizon + 1)]
            paths = model.replay(y[start:end])
        except FAILURES as exc:
            result.error = str(exc)
            continue
        result.point[start - first] = before
        result.point[start - first + 1 : end - first] = paths[:-1]
        result.tails[start] = tails
    return result


def _scored(
    model: str,
    y: np.ndarray,
    hs: tuple[int, ...],
    test_start: int,
    pred_point: dict[int, list[float]],
    pred_upper: dict[int, list[float]],
    fit_times: list[float],
    update_seconds: float,
) -> BacktestResult:
    """Score the forecasts issued from ``test_start`` on against what ``y`` then did."""
    actual = {h: y[test_start + h - 1 :] for h in hs}
    point = {h: np.asarray(pred_point[h]) for h in hs}
    upper = {h: np.asarray(pred_upper[h]) for h in hs}
    return BacktestResult(
        model=model,
        horizons=hs,
        wape={h: wape(actual[h], point[h]) for h in hs},
        smape={h: smape(actual[h], point[h]) for h in hs},
        under_rate={h: under_rate(actual[h], point[h]) for h in hs},
        coverage={h: coverage(actual[h], upper[h]) for h in hs},
        fit_seconds=float(np.mean(fit_times)),
        update_seconds=update_seconds,
        origins=len(y) - test_start,
        actual=actual,
        point=point,
        upper=upper,
    )
