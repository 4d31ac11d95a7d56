"""Turning raw observations into the regular series the models need.

Models want one finite value per step. Real inputs are event rows (one line per request), samples
at irregular times, Prometheus results with holes, and counters that reset when a process
restarts. Each function here does one of those conversions and says what it assumed.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import pandas as pd

Aggregate = Literal["count", "sum", "mean", "last"]


def bin_events(
    times: Sequence | pd.Series | pd.DatetimeIndex,
    freq: str,
    values: Sequence[float] | pd.Series | None = None,
    aggregate: Aggregate = "count",
) -> pd.Series:
    """Aggregate rows at ``times`` into bins of ``freq`` (a pandas offset such as "15min").

    Every bin from the first to the last row is present. Empty bins are 0 for ``count`` and
    ``sum`` (nothing happened) and NaN for ``mean`` and ``last`` (nothing was measured; see
    :func:`fill_gaps`).
    """
    index = pd.DatetimeIndex(pd.to_datetime(times))
    if len(index) == 0:
        raise ValueError("no rows to bin")
    if aggregate == "count":
        data = pd.Series(1.0, index=index)
    else:
        if values is None:
            raise ValueError(f"aggregate {aggregate!r} needs a value column")
        data = pd.Series(pd.to_numeric(np.asarray(values), errors="coerce"), index=index)
    try:
        grouped = data.sort_index().resample(freq)
    except ValueError as exc:
        raise ValueError(
            f"bad frequency {freq!r}: use a pandas offset like 10s, 15min, 1h"
        ) from exc
    if aggregate in ("count", "sum"):
        return grouped.sum(min_count=0).astype(float)
    if aggregate == "mean":
        return grouped.mean()
    if aggregate == "last":
        return grouped.last()
    raise ValueError(f"unknown aggregate {aggregate!r}; use count, sum, mean or last")


def fill_gaps(values: np.ndarray, max_interpolate: int = 5) -> np.ndarray:
    """Fill NaN: short runs (up to ``max_interpolate``) linearly, longer ones with the last
    value before them; leading NaN take the first finite value. Raises when all are NaN."""
    y = np.asarray(values, dtype=float).copy()
    finite = np.isfinite(y)
    if not finite.any():
        raise ValueError("the series has no finite value at all")
    idx = np.arange(len(y))
    interpolated = np.interp(idx, idx[finite], y[finite])
    filled = pd.Series(np.where(finite, y, np.nan)).ffill().bfill().to_numpy()
    run_start = 0
    i = 0
    while i < len(y):
        if finite[i]:
            i += 1
            continue
        run_start = i
        while i < len(y) and not finite[i]:
            i += 1
        run = slice(run_start, i)
        inside = run_start > 0 and i < len(y)
        y[run] = interpolated[run] if inside and i - run_start <= max_interpolate else filled[run]
    return y


def counter_increase(values: np.ndarray) -> np.ndarray:
    """Per-step increase of a cumulative counter, treating any drop as a reset to zero (as
    Prometheus' ``increase``/``rate`` do). The first step has no increase and is NaN."""
    y = np.asarray(values, dtype=float)
    diff = np.diff(y)
    reset = diff < 0
    diff[reset] = y[1:][reset]
    return np.concatenate([[np.nan], diff])


def align_to_grid(
    timestamps: Sequence[float] | np.ndarray,
    values: Sequence[float] | np.ndarray,
    step: float,
    start: float,
    end: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Place samples on the grid ``start, start+step, ... <= end`` (seconds); missing grid
    points are NaN, a sample lands on the nearest grid point."""
    grid = start + step * np.arange(int(np.floor((end - start) / step + 1e-9)) + 1)
    out = np.full(len(grid), np.nan)
    ts = np.asarray(timestamps, dtype=float)
    vs = np.asarray(values, dtype=float)
    pos = np.rint((ts - start) / step).astype(int)
    ok = (pos >= 0) & (pos < len(grid))
    out[pos[ok]] = vs[ok]
    return grid, out
