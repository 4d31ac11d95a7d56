"""Seasonal naive, rescaled to the current level.

Load that grows, or a busier-than-usual day, makes last week's copy too low. This model takes
the value one season ago and multiplies it by how much the recent window differs from the same
window one season earlier, raised to an exponent fitted on the history (0 keeps the plain
seasonal copy, 1 applies the full ratio). Only meaningful for non-negative series; on others the
exponent is 0.
"""

from __future__ import annotations

import numpy as np

from predictor.models.base import ForecastModel

EXPONENTS = (0.0, 0.25, 0.5, 0.75, 1.0)
MAX_RATIO = 4.0


class SeasonalLevelModel(ForecastModel):
    """``y[t+h-period] * ratio**exponent``; ratio of the last ``window`` points to a season ago."""

    def __init__(
        self, period: int, window: int, max_horizon: int, name: str | None = None, **kwargs
    ) -> None:
        if period < 2 or not 1 <= window <= period:
            raise ValueError("need period >= 2 and 1 <= window <= period")
        self.period = period
        self.window = window
        self.exponent = 0.5
        self.name = name or f"seasonal_level_{period}"
        super().__init__(max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return self.period + self.window

    def history_capacity(self) -> int:
        return self.period + self.window

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        if np.any(y < 0):
            self.exponent = 0.0
            return
        m, k = self.period, self.window
        origins = np.arange(m + k, len(y) - self.max_horizon + 1)
        if len(origins) == 0:
            self.exponent = 0.5
            return
        cum = np.concatenate([[0.0], np.cumsum(y)])
        recent = cum[origins] - cum[origins - k]
        before = cum[origins - m] - cum[origins - m - k]
        ratio = np.clip((recent + 1.0) / (before + 1.0), 1 / MAX_RATIO, MAX_RATIO)
        best, best_err = 0.5, np.inf
        for exponent in EXPONENTS:
            scale = ratio**exponent
            err = 0.0
            for h in range(1, self.max_horizon + 1):
                err += np.abs(y[origins + h - 1] - y[origins + h - 1 - m] * scale).sum()
            if err < best_err:
                best, best_err = exponent, err
        self.exponent = best

    def _forecast_path(self) -> np.ndarray:
        m, k = self.period, self.window
        kept = self.history.values()
        recent = kept[-k:].sum()
        before = kept[-m - k : -m].sum()
        ratio = np.clip((recent + 1.0) / (before + 1.0), 1 / MAX_RATIO, MAX_RATIO)
        season = kept[-m:]
        return season[np.arange(self.max_horizon) % m] * ratio**self.exponent
