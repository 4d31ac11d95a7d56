"""Multi-seasonal decomposition (statsmodels' MSTL) with a damped-trend smoother on the rest.

Load carries a daily and a weekly cycle at once; a Holt-Winters model holds only one season,
and a seasonal copy carries last cycle's noise. MSTL splits the series (on the square-root
scale of non-negative series, where count noise is about even) into one smooth seasonal
component per period, estimated by repeated STL over every cycle seen, plus what is left. The
seasonal components are carried forward as their last cycle; the rest (trend plus remainder) is
forecast by the damped-trend exponential smoothing of :class:`~predictor.models.ets.ETSModel`,
which between refits is advanced point by point on the new value minus its seasonal part.

A season is decomposed only with two full cycles of history. STL smooths with its interpolation
"jumps" (a fit every few points, linear in between), which costs little accuracy on seasons of
dozens to hundreds of steps and spares most of the decomposition's work; selection refits every
candidate several times.
"""

from __future__ import annotations

import warnings

import numpy as np

from predictor.models.base import ForecastModel
from predictor.models.ets import ETSModel

JUMP = 5
MIN_REST = 10


class MSTLModel(ForecastModel):
    """Seasonal components of MSTL carried forward, plus damped-trend ETS on the rest."""

    name = "mstl"

    def __init__(
        self, max_horizon: int, periods: tuple[int, ...] = (), name: str | None = None, **kwargs
    ) -> None:
        self.all_periods = tuple(sorted(p for p in periods if p >= 2))
        self.periods: tuple[int, ...] = ()
        self.rest = ETSModel(max_horizon, periods=(), log=False, name="mstl_rest")
        self._cycles: list[np.ndarray] = []
        self._position = 0
        self._root = False
        if name:
            self.name = name
        super().__init__(max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return MIN_REST

    def _transform(self, y: np.ndarray | float) -> np.ndarray | float:
        return np.sqrt(np.maximum(y, 0.0)) if self._root else y

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        from statsmodels.tsa.seasonal import MSTL  # seconds to import: see ETSModel._fit

        self._root = bool(np.all(y >= 0))
        z = np.asarray(self._transform(y[:state_at]), dtype=float)
        self.periods = tuple(p for p in self.all_periods if len(z) >= 2 * p)
        if self.periods:
            jumps = {f"{k}_jump": JUMP for k in ("seasonal", "trend", "low_pass")}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                result = MSTL(z, periods=self.periods, stl_kwargs=jumps).fit()
            seasonal = np.asarray(result.seasonal, dtype=float).reshape(len(z), -1)
            self._cycles = [seasonal[-p:, i].copy() for i, p in enumerate(self.periods)]
            rest = z - seasonal.sum(axis=1)
        else:
            self._cycles = []
            rest = z
        self._position = 0
        self.rest.fit_until(rest, len(rest))

    def _season_ahead(self, steps: np.ndarray) -> np.ndarray:
        """The seasonal part ``steps`` (1 = the next point) ahead of the current position."""
        total = np.zeros(len(steps))
        for cycle in self._cycles:
            total += cycle[(self._position + steps - 1) % len(cycle)]
        return total

    def _advance(self, value: float) -> None:
        season = float(self._season_ahead(np.array([1]))[0])
        self.rest.update(float(self._transform(value)) - season)
        self._position += 1

    def _forecast_path(self) -> np.ndarray:
        steps = np.arange(1, self.max_horizon + 1)
        z = self.rest.latest_path() + self._season_ahead(steps)
        return np.maximum(z, 0.0) ** 2 if self._root else z
