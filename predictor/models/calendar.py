"""A regression on the calendar and on recent lags: the average shape of the day and the week,
moved by how the last hours went.

A copy of yesterday or of last week carries that day's noise into the forecast; the average
shape over the whole history does not. This model fits, per horizon, a ridge regression of the
target on Fourier terms of its phase in each season (a few harmonics of the daily and weekly
cycles: a smooth profile estimated from every cycle seen) and on the recent lags and means of
:class:`~predictor.models.autoregressive.AutoregressiveModel` (which say how far today runs
above or below the profile). It works on the square root of non-negative series, as that model
does, with the same penalty chosen by leave-one-out error, so it shares its cost: a closed-form
fit, a dot product per horizon to update.

The phase is counted from the first point the model was fitted on; the service refits on a
window that slides, and each refit counts afresh, so the profile stays aligned with the clock
as long as the series has no gaps (the service fills them).
"""

from __future__ import annotations

import numpy as np

from predictor.models.autoregressive import AutoregressiveModel

HARMONICS = 4


class CalendarRegressionModel(AutoregressiveModel):
    """Ridge per horizon on Fourier terms of each season's phase plus recent lags."""

    name = "calendar"

    def __init__(
        self,
        max_horizon: int,
        periods: tuple[int, ...] = (),
        harmonics: int = HARMONICS,
        name: str | None = None,
        **kwargs,
    ) -> None:
        if harmonics < 1:
            raise ValueError("need at least one harmonic per season")
        self.calendar_periods = tuple(sorted(p for p in periods if p >= 2))
        self.harmonics = harmonics
        self.used_periods: tuple[int, ...] = ()
        self._offset = 0  # index of z[0] counted from the first fitted point
        super().__init__(max_horizon, periods=(), name=name, **kwargs)

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        # One full cycle at least, or the profile of that season is extrapolation.
        self.used_periods = tuple(p for p in self.calendar_periods if state_at >= p)
        self._offset = 0
        super()._fit(y, state_at)

    def _forecast_paths(self, y: np.ndarray, origins: np.ndarray) -> np.ndarray:
        self._offset = self.points_seen - len(self.history)
        return super()._forecast_paths(y, origins)

    def _features(self, z: np.ndarray, origins: np.ndarray, h: int | np.ndarray) -> np.ndarray:
        base = super()._features(z, origins, h)
        phase_of = self._offset + origins + h - 1
        columns = []
        for period in self.used_periods:
            angle = 2 * np.pi * (phase_of % period) / period
            for k in range(1, min(self.harmonics, period // 2) + 1):
                columns += [np.cos(k * angle), np.sin(k * angle)]
        if not columns:
            return base
        return np.concatenate([base, np.stack(columns, axis=1)], axis=1)
