"""Gradient-boosted trees on recent and seasonal lags and the calendar: a candidate that is not
linear.

Every other learned candidate adds its inputs up: the autoregression and the calendar regression
are linear in the lags and in Fourier terms, the seasonal models rescale a copy or a mean of past
cycles. None can say "at 9 in the morning the load follows last week's, at night yesterday's",
or "after a burst the next hours fall back further than a straight line says": interactions of
the hour, the level and the lags. Trees split on them directly. This model fits, per horizon,
LightGBM's gradient-boosted trees on:

- the last few points and the means of recent windows (how the last hours went);
- per season, the (smoothed) value one season before the target and the last point and recent
  mean one season ago (the same time yesterday or last week, and how today differs);
- the target's phase in the shortest season (hour of the day) and its cycle within each longer
  one (day of the week), counted from the first fitted point as
  :class:`~predictor.models.calendar.CalendarRegressionModel` counts them;
- the recent level itself.

The target and every lag are taken on the square root of non-negative series (count noise about
even across levels, as in :mod:`predictor.models.autoregressive`) and **minus the recent level**:
trees cannot extrapolate, so they learn the shape around the level and the level carries any
drift beyond what the history saw. The loss is the absolute error (LightGBM's ``l1``: leaves set
to the median of their residuals), which aims at the median, the point that minimises absolute
error (what WAPE measures), and a burst cannot pull it as it pulls least squares.

Cost is bounded by construction, since selection refits every candidate several times: at most
``MAX_ROWS`` recent origins per horizon, ``ROUNDS`` trees of at most ``LEAVES`` leaves, one
thread. Between fits the state is the kept history, so updates and the calibration replay are one
batched tree evaluation per horizon. Trees were trained on the points before the calibration
tail only, so the tail's errors (the upper bound's) are out of sample.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from predictor.models.autoregressive import MIN_ORIGINS, LaggedFeaturesModel

if TYPE_CHECKING:  # imported by the first fit: lightgbm takes about a second to import
    import lightgbm as lgb

LAGS = 4
RECENT_WINDOWS = (4, 16)
MAX_ROWS = 2000
ROUNDS = 100
LEAVES = 8
LEARNING_RATE = 0.1
MIN_LEAF = 10
CEILING = 1.5


class BoostedTreesModel(LaggedFeaturesModel):
    """Gradient-boosted trees per horizon on lags, seasonal lags and the calendar; see the module
    docstring."""

    name = "boosted"
    season_margin = 1  # a point of margin per season, kept so fits stay as benched

    def __init__(
        self,
        max_horizon: int,
        periods: tuple[int, ...] = (),
        lags: int = LAGS,
        recent_windows: tuple[int, ...] = RECENT_WINDOWS,
        rounds: int = ROUNDS,
        leaves: int = LEAVES,
        learning_rate: float = LEARNING_RATE,
        min_leaf: int = MIN_LEAF,
        max_rows: int = MAX_ROWS,
        name: str | None = None,
        **kwargs,
    ) -> None:
        if lags < 1 or rounds < 1 or leaves < 2 or min_leaf < 1 or max_rows < MIN_ORIGINS:
            raise ValueError(
                "need lags >= 1, rounds >= 1, leaves >= 2, min_leaf >= 1 and "
                f"max_rows >= {MIN_ORIGINS}"
            )
        if not 0 < learning_rate <= 1:
            raise ValueError(f"learning_rate must be in (0, 1], got {learning_rate}")
        self.all_periods = tuple(sorted(p for p in periods if p > max_horizon + 1))
        self.periods: tuple[int, ...] = ()
        self.lags = lags
        self.recent_windows = tuple(sorted(w for w in recent_windows if w > 1)) or (max(2, lags),)
        self.rounds = rounds
        self.leaves = leaves
        self.learning_rate = learning_rate
        self.min_leaf = min_leaf
        self.max_rows = max_rows
        self.root = False
        self.boosters: list[lgb.Booster | float] = []
        self.ceiling = np.inf
        self.rows_fitted = 0
        self._offset = 0  # index of z[0] counted from the first fitted point
        if name:
            self.name = name
        super().__init__(max_horizon, **kwargs)

    def _transform(self, y: np.ndarray) -> np.ndarray:
        return np.sqrt(np.maximum(y, 0.0)) if self.root else np.asarray(y, dtype=float)

    def _features(
        self, z: np.ndarray, origins: np.ndarray, h: int
    ) -> tuple[np.ndarray, np.ndarray]:
        """Design rows for forecasts of ``z[origin + h - 1]`` made after seeing ``z[:origin]``,
        and the level each row is taken relative to."""
        cum = np.concatenate([[0.0], np.cumsum(z)])

        def mean(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
            return (cum[hi] - cum[lo]) / (hi - lo)

        level = mean(origins - self.recent_windows[-1], origins)
        columns = [level]
        columns += [z[origins - k] - level for k in range(1, self.lags + 1)]
        columns += [mean(origins - w, origins) - level for w in self.recent_windows[:-1]]
        target = origins + h - 1
        for m in self.periods:
            columns.append(z[target - m] - level)
            columns.append(mean(target - m - 1, np.minimum(target - m + 2, origins)) - level)
            columns.append(z[origins - 1 - m] - level)
            w = self.recent_windows[-1]
            columns.append(mean(origins - m - w, origins - m) - level)
        if self.periods:
            phase = self._offset + target
            shortest = self.periods[0]
            columns.append((phase % shortest).astype(float))
            for m in self.periods[1:]:
                columns.append(((phase % m) // shortest).astype(float))
        return np.stack(columns, axis=1), level

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        self.root = bool(np.all(y >= 0))
        self._offset = 0
        z = self._transform(y[:state_at])
        self.periods = self._affordable_periods(len(z))
        first = max(self._reach(self.periods), len(z) - self.max_horizon + 1 - self.max_rows)
        origins = np.arange(first, len(z) - self.max_horizon + 1)
        self.rows_fitted = len(origins)
        self.ceiling = CEILING * float(np.max(np.abs(z))) if len(z) else np.inf
        params = {
            "objective": "l1",
            "learning_rate": self.learning_rate,
            "num_leaves": self.leaves,
            "min_data_in_leaf": self.min_leaf,
            "lambda_l2": 1.0,
            "max_bin": 63,
            "num_threads": 1,
            "deterministic": True,
            "force_col_wise": True,
            "seed": 0,
            "verbosity": -1,
        }
        import lightgbm as lgb

        self.boosters = []
        for h in range(1, self.max_horizon + 1):
            x, level = self._features(z, origins, h)
            target = z[origins + h - 1] - level
            if len(origins) < 2 * self.min_leaf:  # too few rows to split: the median offset
                self.boosters.append(float(np.median(target)))
                continue
            data = lgb.Dataset(x, target, params={"max_bin": 63, "verbosity": -1})
            self.boosters.append(lgb.train(params, data, num_boost_round=self.rounds))

    def _forecast_path(self) -> np.ndarray:
        kept = self.history.values()
        return self._forecast_paths(kept, np.array([len(kept)]))[0]

    def _forecast_paths(self, y: np.ndarray, origins: np.ndarray) -> np.ndarray:
        self._offset = self.points_seen - len(self.history)
        z = self._transform(y)
        out = np.empty((len(origins), self.max_horizon))
        for h, booster in enumerate(self.boosters, start=1):
            x, level = self._features(z, origins, h)
            if isinstance(booster, float):
                offset = np.full(len(origins), booster)
            else:
                offset = np.asarray(booster.predict(x, num_threads=1), dtype=float)
            out[:, h - 1] = np.clip(level + offset, -self.ceiling, self.ceiling)
        return np.maximum(out, 0.0) ** 2 if self.root else out
