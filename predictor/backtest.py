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
from collections.abc import Callable, Sequence
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
    results = rolling_origin_with_parts(
        factory, series, horizons, test_start, quantile, refit_every, clock
    )
    return next(iter(results.values()))


def rolling_origin_with_parts(
    factory: Callable[[], ForecastModel],
    series: Sequence[float] | np.ndarray,
    horizons: Sequence[int],
    test_start: int,
    quantile: float = 0.9,
    refit_every: int = 0,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, BacktestResult]:
    """:func:`rolling_origin` for the model (first key) and, from the same pass, for each of
    its :meth:`~predictor.models.base.ForecastModel.parts` (an ensemble's members, fitted and
    updated exactly as they would be alone). Parts are fitted inside the model, so their own
    fit and update times are not known (NaN)."""
    y = as_series(series)
    hs = tuple(sorted(set(int(h) for h in horizons)))
    if not 0 < test_start < len(y):
        raise ValueError(f"test_start must be inside the series (1..{len(y) - 1})")
    model = factory()
    scored = {model.name: model, **model.parts()}
    fit_times = []
    started = clock()
    model.fit(y[:test_start])
    fit_times.append(clock() - started)
    pred_point = {name: {h: [] for h in hs} for name in scored}
    pred_upper = {name: {h: [] for h in hs} for name in scored}
    update_time = 0.0
    updates = 0
    for origin in range(test_start, len(y)):
        if refit_every and origin > test_start and (origin - test_start) % refit_every == 0:
            started = clock()
            model.fit(y[:origin])
            fit_times.append(clock() - started)
        for name, each in scored.items():
            prediction = each.predict(hs, quantile)
            for i, h in enumerate(hs):
                if origin + h - 1 < len(y):
                    pred_point[name][h].append(prediction.point[i])
                    pred_upper[name][h].append(prediction.upper[i])
        started = clock()
        model.update(y[origin])
        update_time += clock() - started
        updates += 1
    nan = float("nan")
    return {
        name: _scored(
            name,
            y,
            hs,
            test_start,
            pred_point[name],
            pred_upper[name],
            fit_times if each is model else [nan],
            update_time / max(updates, 1) if each is model else nan,
        )
        for name, each in scored.items()
    }


def replay_with_selection(
    select: Callable[[np.ndarray], tuple[dict[int, str], dict[str, Callable[[], ForecastModel]]]],
    series: Sequence[float] | np.ndarray,
    horizons: Sequence[int],
    test_start: int,
    reselect_every: int,
    quantile: float = 0.9,
    clock: Callable[[], float] = time.perf_counter,
) -> BacktestResult:
    """Backtest what the service does: every ``reselect_every`` origins, ``select`` (given the
    history so far) names the model per horizon and the factories; the winners are fitted on
    that history, updated point by point, and each horizon is forecast by its own winner."""
    y = as_series(series)
    hs = tuple(sorted(set(int(h) for h in horizons)))
    pred_point = {h: [] for h in hs}
    pred_upper = {h: [] for h in hs}
    fit_times, update_time, updates = [], 0.0, 0
    models: dict[str, ForecastModel] = {}
    chosen: dict[int, str] = {}
    for origin in range(test_start, len(y)):
        if (origin - test_start) % max(reselect_every, 1) == 0 and (
            reselect_every or origin == test_start
        ):
            started = clock()
            chosen, factories = select(y[:origin])
            models = {name: factories[name]() for name in set(chosen.values())}
            for model in models.values():
                model.fit(y[:origin])
            fit_times.append(clock() - started)
        for h in hs:
            if origin + h - 1 < len(y):
                p = models[chosen[h]].predict([h], quantile)
                pred_point[h].append(p.point[0])
                pred_upper[h].append(p.upper[0])
        started = clock()
        for model in models.values():
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


def pool(results: Sequence[BacktestResult], weights: Sequence[float]) -> BacktestResult:
    """One result from backtests of the same model on several windows, each window's points
    counting ``weights[i]`` times (recent windows more). WAPE pools absolute errors and actuals,
    so a quiet window weighs as little as its load, as in a single long backtest."""
    if not results or len(results) != len(weights):
        raise ValueError("pool needs one weight per result, and at least one result")
    hs = results[0].horizons
    actual = {h: np.concatenate([r.actual[h] for r in results]) for h in hs}
    point = {h: np.concatenate([r.point[h] for r in results]) for h in hs}
    upper = {h: np.concatenate([r.upper[h] for r in results]) for h in hs}
    w = {
        h: np.concatenate(
            [np.full(len(r.actual[h]), wt) for r, wt in zip(results, weights, strict=True)]
        )
        for h in hs
    }
    return BacktestResult(
        model=results[0].model,
        horizons=hs,
        wape={h: wape(actual[h], point[h], w[h]) for h in hs},
        smape={h: smape(actual[h], point[h], w[h]) for h in hs},
        under_rate={h: under_rate(actual[h], point[h], w[h]) for h in hs},
        coverage={h: coverage(actual[h], upper[h], w[h]) for h in hs},
        fit_seconds=float(np.mean([r.fit_seconds for r in results])),
        update_seconds=float(np.mean([r.update_seconds for r in results])),
        origins=sum(r.origins for r in results),
        actual=actual,
        point=point,
        upper=upper,
    )
