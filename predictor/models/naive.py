"""The baselines every other model must beat: the last value, and the value one season ago."""

from __future__ import annotations

import numpy as np

from predictor.models.base import ForecastModel


class NaiveModel(ForecastModel):
    """Tomorrow looks like now: every horizon gets the last observed value."""

    name = "naive"

    @property
    def min_points(self) -> int:
        return 1

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        return None

    def _forecast_path(self) -> np.ndarray:
        return np.full(self.max_horizon, self.history.ago(1))


class SeasonalNaiveModel(ForecastModel):
    """Each horizon gets the value exactly one season (``period`` steps) before it."""

    def __init__(self, period: int, max_horizon: int, name: str | None = None, **kwargs) -> None:
        if period < 2:
            raise ValueError("a seasonal period must be >= 2 steps")
        self.period = period
        self.name = name or f"seasonal_naive_{period}"
        super().__init__(max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return self.period

    def history_capacity(self) -> int:
        return self.period

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        return None

    def _forecast_path(self) -> np.ndarray:
        season = self.history.last(self.period)
        return season[np.arange(self.max_horizon) % self.period]
