"""Daily and weekly seasonal copies, smoothed and rescaled to the current level, blended with
the recent mean.

Bursty bins make a single value one season ago a noisy guess: the copy here is the mean of the
``2s+1`` bins around that point. Each season's copy is multiplied by how much the recent window
differs from the same window one season earlier (raised to an exponent, as in
:mod:`predictor.models.seasonal_level`); the seasons are mixed with a weight, and each horizon
can lean on the mean of the last ``2s+1`` points (near horizons follow the present more than last
week). Smoothing, exponent, season weight and per-horizon lean are chosen on a small grid by
the recency-weighted absolute error of the forecasts they would have made on the points before
the calibration tail, so the tail stays unseen and the upper bound honest. A handful of
parameters, no optimiser: fitting takes milliseconds and cannot diverge.
"""

from __future__ import annotations

import itertools

import numpy as np

from predictor.models.base import ForecastModel

SMOOTHING = (0, 1, 2, 4)
EXPONENTS = (0.0, 0.25, 0.5, 0.75, 1.0)
SEASON_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
RECENT_SHARES = (0.0, 0.2, 0.4, 0.6, 0.8)
MAX_RATIO = 4.0
MIN_ORIGINS = 8


class SeasonalBlendModel(ForecastModel):
    """See the module docstring. ``seasons`` is ((period, level_window), ...), one or two."""

    name = "seasonal_blend"

    def __init__(
        self,
        seasons: tuple[tuple[int, int], ...],
        max_horizon: int,
        half_life: float | None = None,
        name: str | None = None,
        **kwargs,
    ) -> None:
        if not 1 <= len(seasons) <= 2:
            raise ValueError("seasonal_blend takes one or two seasons")
        for period, window in seasons:
            if period < 2 or not 1 <= window <= period:
                raise ValueError("need period >= 2 and 1 <= window <= period for every season")
        self.seasons = tuple((int(p), int(k)) for p, k in seasons)
        self.half_life = half_life or max(p for p, _ in self.seasons)
        self.smoothing = 0
        self.exponent = 0.5
        self.weights = np.full(len(self.seasons), 1.0 / len(self.seasons))
        self.recent_share = np.zeros(max_horizon)
        if name:
            self.name = name
        super().__init__(max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return max(p + k for p, k in self.seasons) + max(SMOOTHING)

    def history_capacity(self) -> int:
        return self.min_points + 1

    def _components(
        self, y: np.ndarray, origins: np.ndarray, smoothing: int, exponent: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per season, the rescaled smoothed copies (seasons x origins x horizons), and the
        recent mean (origins x horizons), for forecasts made after seeing ``y[:origin]``."""
        cum = np.concatenate([[0.0], np.cumsum(y)])
        targets = origins[:, None] + np.arange(self.max_horizon)
        copies = []
        for period, window in self.seasons:
            lo = np.maximum(targets - period - smoothing, 0)
            hi = np.minimum(targets - period + smoothing + 1, origins[:, None])
            copy = (cum[hi] - cum[lo]) / (hi - lo)
            recent = cum[origins] - cum[origins - window]
            before = cum[origins - period] - cum[origins - period - window]
            ratio = np.clip((recent + 1.0) / (before + 1.0), 1 / MAX_RATIO, MAX_RATIO)
            copies.append(copy * (ratio**exponent)[:, None])
        width = 2 * smoothing + 1
        recent_mean = (cum[origins] - cum[origins - width]) / width
        return np.stack(copies), np.repeat(recent_mean[:, None], self.max_horizon, axis=1)

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        if np.any(y < 0):
            self.exponent = 0.0  # a ratio of sums means nothing when values can be negative
            exponents: tuple[float, ...] = (0.0,)
        else:
            exponents = EXPONENTS
        y = y[:state_at]
        origins = np.arange(self.min_points, len(y) - self.max_horizon + 1)
        if len(origins) < MIN_ORIGINS:
            return  # keep the defaults: too few points to choose anything
        target = y[origins[:, None] + np.arange(self.max_horizon)]
        recency = 0.5 ** ((origins[-1] - origins) / self.half_life)
        shares = np.asarray(RECENT_SHARES)[:, None, None]
        mixes = (
            [np.array([1.0])]
            if len(self.seasons) == 1
            else [np.array([w, 1.0 - w]) for w in SEASON_WEIGHTS]
        )
        best = np.inf
        for smoothing, exponent in itertools.product(SMOOTHING, exponents):
            copies, recent = self._components(y, origins, smoothing, exponent)
            for mix in mixes:
                seasonal = np.tensordot(mix, copies, axes=1)
                forecast = (1 - shares) * seasonal + shares * recent
                # error per (share, horizon), weighted toward the latest origins
                error = np.einsum("snh,n->sh", np.abs(target - forecast), recency)
                total = error.min(axis=0).sum()
                if total < best:
                    best = total
                    self.smoothing, self.exponent, self.weights = smoothing, exponent, mix
                    self.recent_share = np.asarray(RECENT_SHARES)[error.argmin(axis=0)]

    def _forecast_path(self) -> np.ndarray:
        kept = self.history.values()
        return self._forecast_paths(kept, np.array([len(kept)]))[0]

    def _forecast_paths(self, y: np.ndarray, origins: np.ndarray) -> np.ndarray:
        copies, recent = self._components(y, origins, self.smoothing, self.exponent)
        seasonal = np.tensordot(self.weights, copies, axes=1)
        return (1 - self.recent_share) * seasonal + self.recent_share * recent
