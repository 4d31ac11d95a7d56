"""Holt-Winters / ETS: damped additive trend and additive season, fitted by statsmodels.

Smoothing and damping parameters are always estimated, within bounds that keep the recursion
stable (fixed, untuned constants diverge on real traces). On non-negative series the model can
work on ``log1p`` of the values, which turns multiplicative, bursty load into additive structure
and keeps forecasts positive. statsmodels does the (slow) estimation at fit time; between refits
the same recursion is advanced here point by point, which costs microseconds.
"""

from __future__ import annotations

import warnings

import numpy as np

from predictor.models.base import ForecastModel

BOUNDS = {
    "smoothing_level": (0.01, 0.99),
    "smoothing_trend": (0.0, 0.5),
    "smoothing_seasonal": (0.0, 0.99),
    "damping_trend": (0.8, 0.98),
}


class ETSModel(ForecastModel):
    """Additive damped-trend Holt-Winters.

    The season is the longest of ``periods`` with two full cycles (plus a margin) in the
    series being fitted, which statsmodels needs to initialise it; none qualifies, no season.
    """

    def __init__(
        self,
        max_horizon: int,
        periods: tuple[int, ...] = (),
        log: bool = True,
        name: str | None = None,
        **kwargs,
    ) -> None:
        self.periods = tuple(sorted(p for p in periods if p >= 2))
        self.period: int | None = None
        self.log = log
        self.name = name or ("ets_log" if log else "ets")
        self.params: dict[str, float] = {}
        self._level = 0.0
        self._trend = 0.0
        self._season = np.zeros(1)
        self._season_pos = 0
        self._use_log = False
        super().__init__(max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return 10

    def history_capacity(self) -> int:
        return 1

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        # statsmodels costs seconds of CPU to import: paid by a process that fits, not by one
        # that only names the models (a simulator's configuration check, the CLI's --help).
        from statsmodels.tools.sm_exceptions import ConvergenceWarning
        from statsmodels.tsa.holtwinters import ExponentialSmoothing

        self._use_log = self.log and bool(np.all(y >= 0))
        z = np.log1p(y) if self._use_log else y
        # Four parameters hardly overfit: estimate on all of y, start from y[:state_at].
        fitting = [p for p in self.periods if len(z) >= 2 * p + 10 and state_at >= p]
        period = fitting[-1] if fitting else None
        self.period = period
        seasonal = period is not None
        init = "heuristic" if seasonal else "estimated"
        model = ExponentialSmoothing(
            z,
            trend="add",
            damped_trend=True,
            seasonal="add" if seasonal else None,
            seasonal_periods=self.period,
            initialization_method=init,
            bounds={k: v for k, v in BOUNDS.items() if seasonal or k != "smoothing_seasonal"},
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ConvergenceWarning)
            warnings.simplefilter("ignore", RuntimeWarning)
            # The optimiser from statsmodels' default start finds the same optimum on the
            # bench traces as after its brute-force grid of starts, at a tenth of the cost.
            result = model.fit(use_brute=False)
        p = result.params
        self.params = {
            "alpha": float(p["smoothing_level"]),
            "beta": float(p["smoothing_trend"]),
            "gamma": float(p["smoothing_seasonal"]) if seasonal else 0.0,
            "phi": float(p["damping_trend"]),
        }
        last = state_at - 1
        self._level = float(result.level[last])
        self._trend = float(result.trend[last])
        if period is not None:
            self._season = np.array(result.season[state_at - period : state_at], dtype=np.float64)
        else:
            self._season = np.zeros(1)
        self._season_pos = 0

    def _advance(self, value: float) -> None:
        a, b, g, phi = (self.params[k] for k in ("alpha", "beta", "gamma", "phi"))
        z = np.log1p(max(value, 0.0)) if self._use_log else value
        s_old = self._season[self._season_pos] if self.period else 0.0
        level = a * (z - s_old) + (1 - a) * (self._level + phi * self._trend)
        trend = b * (level - self._level) + (1 - b) * phi * self._trend
        if self.period:
            self._season[self._season_pos] = (
                g * (z - self._level - phi * self._trend) + (1 - g) * s_old
            )
            self._season_pos = (self._season_pos + 1) % self.period
        self._level, self._trend = level, trend

    def _forecast_path(self) -> np.ndarray:
        phi = self.params["phi"]
        steps = np.arange(1, self.max_horizon + 1)
        damp = np.cumsum(phi**steps)
        z = self._level + damp * self._trend
        if self.period:
            z = z + self._season[(self._season_pos + steps - 1) % self.period]
        if self._use_log:
            return np.expm1(np.minimum(z, 50.0))
        return z
