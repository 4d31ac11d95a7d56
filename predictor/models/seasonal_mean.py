"""The same phase averaged over several past cycles, rescaled to the current level.

A copy of yesterday (or last week) carries that one cycle's noise into the forecast: on bursty
hourly load the same hour differs from one day to the next almost as much as from the mean.
The mean, or the median, of the same phase over the last ``k`` cycles keeps the shape and
averages the noise away; its cost is a slower answer to a change of level, which the ratio of
the recent window to the same window in those ``k`` cycles (raised to an exponent, as in
:mod:`predictor.models.seasonal_level`) puts back. With two seasons (day and week) the two
averages are mixed, and each horizon can lean on the mean of the last few points, as near
horizons follow the present more than any past cycle.

Per season, the number of cycles, mean or median, the level window and the exponent are chosen
on a small grid by the recency-weighted absolute error (what WAPE measures) of the forecasts
they would have made before the calibration tail; then the mix of the seasons and the lean of
each horizon on the present. Everything is a few array operations over the kept history: a
fit takes milliseconds and cannot diverge, and the tail (the upper bound's errors) stays
unseen.
"""

from __future__ import annotations

import itertools

import numpy as np

from predictor.models.base import ForecastModel

CYCLES = (1, 2, 3, 5, 8)
STATISTICS = ("mean", "median")
EXPONENTS = (0.0, 0.5, 1.0)
# Level windows as fractions of the shortest season.
WINDOW_FRACTIONS = (0.125, 0.25, 0.5, 1.0)
SEASON_WEIGHTS = (0.0, 0.25, 0.5, 0.75, 1.0)
RECENT_SHARES = (0.0, 0.2, 0.4, 0.6)
RECENT_POINTS = 2
MAX_RATIO = 4.0
MIN_ORIGINS = 8


class SeasonalMeanModel(ForecastModel):
    """See the module docstring. ``periods``: one or two seasons in steps, each longer than the
    deepest horizon."""

    name = "seasonal_mean"

    def __init__(
        self,
        periods: tuple[int, ...],
        max_horizon: int,
        cycles: tuple[int, ...] = CYCLES,
        half_life: float | None = None,
        name: str | None = None,
        **kwargs,
    ) -> None:
        periods = tuple(sorted(int(p) for p in periods))
        if not 1 <= len(periods) <= 2 or periods[0] <= max_horizon:
            raise ValueError("seasonal_mean takes one or two seasons longer than max_horizon")
        if not cycles or min(cycles) < 1:
            raise ValueError("cycles must be positive")
        self.periods = periods
        self.cycles = tuple(sorted(set(cycles)))
        self.windows = tuple(sorted({max(1, round(f * periods[0])) for f in WINDOW_FRACTIONS}))
        self.half_life = half_life or periods[-1]
        # per season: (cycles, statistic, level window, exponent)
        self.choices = [(1, "mean", self.windows[0], 0.0) for _ in periods]
        self.weights = np.full(len(periods), 1.0 / len(periods))
        self.recent_share = np.zeros(max_horizon)
        if name:
            self.name = name
        super().__init__(max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return self.periods[-1] + max(self.windows)

    def history_capacity(self) -> int:
        return max(p * max(self.cycles) for p in self.periods) + max(self.windows)

    def _average(
        self, y: np.ndarray, origins: np.ndarray, period: int, cycles: int, statistic: str
    ) -> np.ndarray:
        """The mean or median over the last ``cycles`` cycles (those the history holds) of
        the target's phase (origins x horizons)."""
        targets = origins[:, None] + np.arange(self.max_horizon)
        back = targets[None] - period * np.arange(1, cycles + 1)[:, None, None]
        values = np.where(back >= 0, y[np.maximum(back, 0)], np.nan)
        if statistic == "median":
            return np.nanmedian(values, axis=0) if cycles > 1 else values[0]
        return np.nanmean(values, axis=0)

    def _ratio(
        self, cum: np.ndarray, origins: np.ndarray, period: int, cycles: int, window: int
    ) -> np.ndarray:
        """The last ``window`` points' sum over the mean of the same window's sums one to
        ``cycles`` cycles back (those the history holds), kept within ``MAX_RATIO``."""
        recent = cum[origins] - cum[origins - window]
        ends = origins[None] - period * np.arange(1, cycles + 1)[:, None]
        ok = ends - window >= 0
        sums = np.where(ok, cum[np.maximum(ends, 0)] - cum[np.maximum(ends - window, 0)], 0.0)
        before = sums.sum(axis=0) / np.maximum(ok.sum(axis=0), 1)
        floor = self.interval_floor * window
        return np.clip((recent + floor) / (before + floor), 1 / MAX_RATIO, MAX_RATIO)

    def _season(self, y: np.ndarray, cum: np.ndarray, origins: np.ndarray, i: int) -> np.ndarray:
        cycles, statistic, window, exponent = self.choices[i]
        average = self._average(y, origins, self.periods[i], cycles, statistic)
        if exponent == 0.0:
            return average
        ratio = self._ratio(cum, origins, self.periods[i], cycles, window)
        return average * (ratio**exponent)[:, None]

    def _recent(self, cum: np.ndarray, origins: np.ndarray) -> np.ndarray:
        return ((cum[origins] - cum[origins - RECENT_POINTS]) / RECENT_POINTS)[:, None]

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        y = y[:state_at]
        origins = np.arange(self.min_points, len(y) - self.max_horizon + 1)
        if len(origins) < MIN_ORIGINS:
            return  # keep the defaults (yesterday's copy): too few points to choose anything
        exponents = EXPONENTS if np.all(y >= 0) else (0.0,)
        target = y[origins[:, None] + np.arange(self.max_horizon)]
        recency = 0.5 ** ((origins[-1] - origins) / self.half_life)
        cum = np.concatenate([[0.0], np.cumsum(y)])

        def loss(forecast: np.ndarray) -> float:
            return float(recency @ np.abs(target - forecast).sum(axis=1))

        seasons = []
        for i, period in enumerate(self.periods):
            available = max(1, (origins[-1] - 1) // period)
            best = np.inf
            for cycles, statistic in itertools.product(self.cycles, STATISTICS):
                if cycles > available or (cycles == 1 and statistic == "median"):
                    continue
                average = self._average(y, origins, period, cycles, statistic)
                for exponent, window in itertools.product(exponents, self.windows):
                    if exponent == 0.0 and window != self.windows[0]:
                        continue
                    scaled = average
                    if exponent:
                        ratio = self._ratio(cum, origins, period, cycles, window)
                        scaled = average * (ratio**exponent)[:, None]
                    score = loss(scaled)
                    if score < best:
                        best = score
                        self.choices[i] = (cycles, statistic, window, exponent)
            seasons.append(self._season(y, cum, origins, i))
        copies = np.stack(seasons)
        recent = self._recent(cum, origins)
        shares = np.asarray(RECENT_SHARES)[:, None, None]
        mixes = (
            [np.array([1.0])]
            if len(self.periods) == 1
            else [np.array([1.0 - w, w]) for w in SEASON_WEIGHTS]
        )
        best = np.inf
        for mix in mixes:
            seasonal = np.tensordot(mix, copies, axes=1)
            forecast = (1 - shares) * seasonal + shares * recent
            error = np.einsum("snh,n->sh", np.abs(target - forecast), recency)
            total = float(error.min(axis=0).sum())
            if total < best:
                best = total
                self.weights = mix
                self.recent_share = np.asarray(RECENT_SHARES)[error.argmin(axis=0)]

    def _forecast_path(self) -> np.ndarray:
        kept = self.history.values()
        return self._forecast_paths(kept, np.array([len(kept)]))[0]

    def _forecast_paths(self, y: np.ndarray, origins: np.ndarray) -> np.ndarray:
        cum = np.concatenate([[0.0], np.cumsum(y)])
        copies = np.stack([self._season(y, cum, origins, i) for i in range(len(self.periods))])
        seasonal = np.tensordot(self.weights, copies, axes=1)
        return (1 - self.recent_share) * seasonal + self.recent_share * self._recent(cum, origins)
