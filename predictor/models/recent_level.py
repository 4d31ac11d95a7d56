"""The level of the last few points, as a mean or a median, per horizon.

On bursty series without a usable season (seconds-scale bins, a fresh target) the best guess of
the next bins is the current level, and how long a window to measure it over depends on the
horizon and on how bursty the series is: a short window follows a change sooner, a long one
averages more noise away. A burst drags a mean up for as long as it stays in the window; the
median, the point that minimises the absolute error (what WAPE measures), ignores it. Per
horizon the window and the statistic are chosen on a small grid by the recency-weighted
absolute error of the forecasts they would have made before the calibration tail, so the tail
(the upper bound's errors) stays unseen. No parameters to estimate beyond that choice: a fit
costs milliseconds and cannot diverge.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from predictor.models.base import ForecastModel

WINDOWS = (2, 4, 8, 16, 32, 64)
STATISTICS = ("mean", "median")
MIN_ORIGINS = 16
HALF_LIFE = 200.0


class RecentLevelModel(ForecastModel):
    """Mean or median of the last ``window`` points, both chosen per horizon."""

    name = "recent_level"

    def __init__(
        self,
        max_horizon: int,
        windows: tuple[int, ...] = WINDOWS,
        half_life: float = HALF_LIFE,
        name: str | None = None,
        **kwargs,
    ) -> None:
        if not windows or min(windows) < 1:
            raise ValueError("windows must be positive")
        self.windows = tuple(sorted(set(windows)))
        self.half_life = half_life
        self.window = np.full(max_horizon, self.windows[0])
        self.statistic = np.zeros(max_horizon, dtype=int)  # index into STATISTICS
        if name:
            self.name = name
        super().__init__(max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return self.windows[0]

    def history_capacity(self) -> int:
        return max(self.windows)

    @staticmethod
    def _levels(y: np.ndarray, origins: np.ndarray, window: int) -> np.ndarray:
        """(mean, median) of ``y[origin - window:origin]`` for each origin (2 x origins)."""
        view = sliding_window_view(y, window)[origins - window]
        return np.stack([view.mean(axis=1), np.median(view, axis=1)])

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        y = y[:state_at]
        usable = tuple(w for w in self.windows if w <= len(y) - self.max_horizon - MIN_ORIGINS)
        if not usable:
            return  # keep the defaults: too few points to choose anything
        origins = np.arange(max(usable), len(y) - self.max_horizon + 1)
        target = y[origins[:, None] + np.arange(self.max_horizon)]
        recency = 0.5 ** ((origins[-1] - origins) / self.half_life)
        best = np.full(self.max_horizon, np.inf)
        for window in usable:
            levels = self._levels(y, origins, window)
            for s in range(len(STATISTICS)):
                error = recency @ np.abs(target - levels[s][:, None])
                better = error < best
                best[better] = error[better]
                self.window[better] = window
                self.statistic[better] = s

    def _forecast_path(self) -> np.ndarray:
        kept = self.history.values()
        return self._forecast_paths(kept, np.array([len(kept)]))[0]

    def _forecast_paths(self, y: np.ndarray, origins: np.ndarray) -> np.ndarray:
        out = np.empty((len(origins), self.max_horizon))
        reach = np.minimum(self.window, origins.min())  # a short history reads what it has
        for window in np.unique(reach):
            levels = self._levels(y, origins, int(window))
            for i in np.flatnonzero(reach == window):
                out[:, i] = levels[self.statistic[i]]
        return out
