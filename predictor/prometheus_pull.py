"""The target's series from Prometheus, on the target's grid: what pull mode reads."""

from __future__ import annotations

import numpy as np

from autoglm.prometheus_api import PrometheusClient, PrometheusError, RangeSeries
from predictor.config import TargetConfig
from predictor.series import align_to_grid, counter_increase


def fetch_grid(
    source: PrometheusClient, config: TargetConfig, start: float, end: float
) -> tuple[float, np.ndarray]:
    """Grid-aligned values of the target's query on start..end (NaN where missing)."""
    t, v = one_series(source.query_range(config.query, start, end, config.step))
    grid, values = align_to_grid(t, v, config.step, start, end)
    if config.counter:
        values = counter_increase(values)
    return float(grid[-1]) if len(grid) else start, values


def one_series(series: tuple[RangeSeries, ...]) -> tuple[np.ndarray, np.ndarray]:
    """The points of a target's query, which must yield at most one series; none means no
    points yet, and an infinite value counts as missing."""
    if len(series) > 1:
        raise PrometheusError(
            "query", f"query returned {len(series)} series; aggregate it to one, e.g. sum(...)"
        )
    if not series:
        return np.array([]), np.array([])
    values = series[0].values
    return series[0].timestamps, np.where(np.isfinite(values), values, np.nan)
