"""A linear autoregression on the square root of the load, one least-squares fit per horizon.

Bursty bins defeat smoothing models one step ahead: the last value is informative but noisy,
and the same time yesterday or last week tells what level to expect. A direct linear model per
horizon weighs both: the last few points, the means of recent windows, and for each season the
(smoothed) values one season before the target together with the last point and the recent
means one season ago, so the model can learn "as last week, plus how today differs from last
week".

On non-negative series it works on the square root of the values: count noise grows with the
level (Poisson: variance = mean), and the root makes it about even, so busy and quiet bins weigh
alike in the fit; forecasts stay non-negative. (``log1p`` is offered too; on the bench's bursty
bins, with many zeros, it over-weights the quiet ones.) Least squares on that scale aims near
the median, the point that minimises absolute error (what WAPE measures).

A few dozen coefficients, solved in closed form: ridge, recent origins weighted more, with the
penalty per horizon that minimises the closed-form leave-one-out error (strong on a short
history, weak on a long one). A fit takes milliseconds and cannot diverge; between fits the
forecast is one dot product per horizon over the kept history, so updates cost microseconds.
Coefficients come from the points before the calibration tail only, so the tail's errors (the
upper bound's) are out of sample. A linear model extrapolates without limit, so forecasts are
capped at 1.5 times the largest (transformed) value seen.
"""

from __future__ import annotations

import numpy as np

from predictor.models.base import ForecastModel

LAGS = 4
RECENT_WINDOWS = (4, 16)
SEASON_SMOOTHINGS = (0, 1)
RIDGES = (0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)
MIN_ORIGINS = 48
TRANSFORMS = ("sqrt", "log", "none")
CEILING = 1.5


class LaggedFeaturesModel(ForecastModel):
    """A model whose features at an origin read the last ``lags`` points and the means of
    ``recent_windows``, and per season the same again one season back. How far back they read
    sets the history a fit needs and the history kept between fits, and which seasons a short
    history can afford; this model and :class:`~predictor.models.boosted.BoostedTreesModel`
    read alike."""

    lags: int
    recent_windows: tuple[int, ...]
    all_periods: tuple[int, ...]
    # Points a season's features may read beyond the season plus the longest lag or window.
    season_margin = 0

    @property
    def min_points(self) -> int:
        return self._reach(()) + MIN_ORIGINS + self.max_horizon

    def history_capacity(self) -> int:
        return self._reach(self.all_periods)

    def _reach(self, periods: tuple[int, ...]) -> int:
        """How many past points the features of one origin read."""
        longest = max(self.lags, *self.recent_windows, 1)
        return max((longest, *(p + longest + self.season_margin for p in periods)))

    def _affordable_periods(self, points: int) -> tuple[int, ...]:
        """The seasons whose features a fit on ``points`` points can read for ``MIN_ORIGINS``
        origins at every horizon."""
        spare = points - self.max_horizon - MIN_ORIGINS
        return tuple(m for m in self.all_periods if self._reach((m,)) <= spare)


class AutoregressiveModel(LaggedFeaturesModel):
    """Direct linear autoregression per horizon; see the module docstring."""

    name = "autoregressive"

    def __init__(
        self,
        max_horizon: int,
        periods: tuple[int, ...] = (),
        lags: int = LAGS,
        recent_windows: tuple[int, ...] = RECENT_WINDOWS,
        smoothings: tuple[int, ...] = SEASON_SMOOTHINGS,
        ridges: tuple[float, ...] = RIDGES,
        half_life: float | None = None,
        transform: str = "sqrt",
        name: str | None = None,
        **kwargs,
    ) -> None:
        if lags < 1 or not smoothings or min(smoothings) < 0 or not ridges or min(ridges) < 0:
            raise ValueError("need lags >= 1, smoothing >= 0 and ridge penalties >= 0")
        if transform not in TRANSFORMS:
            raise ValueError(f"transform must be one of {', '.join(TRANSFORMS)}")
        self.all_periods = tuple(sorted(p for p in periods if p > max_horizon + max(smoothings)))
        self.periods: tuple[int, ...] = ()
        self.lags = lags
        self.recent_windows = tuple(sorted(w for w in recent_windows if w > 1))
        self.smoothings = tuple(smoothings)
        self.ridges = tuple(ridges)
        self.half_life = half_life
        self.transform = transform
        self.transformed = False
        self.coef = np.zeros((max_horizon, 1))
        self.ceiling = np.inf
        if name:
            self.name = name
        super().__init__(max_horizon, **kwargs)

    def _transform(self, y: np.ndarray) -> np.ndarray:
        if not self.transformed:
            return np.asarray(y, dtype=float)
        y = np.maximum(y, 0.0)
        return np.sqrt(y) if self.transform == "sqrt" else np.log1p(y)

    def _inverse(self, z: np.ndarray) -> np.ndarray:
        if not self.transformed:
            return z
        if self.transform == "sqrt":
            return np.maximum(z, 0.0) ** 2
        return np.expm1(np.minimum(z, 50.0))

    def _features(self, z: np.ndarray, origins: np.ndarray, h: int | np.ndarray) -> np.ndarray:
        """Design rows for forecasts of ``z[origin + h - 1]`` made after seeing ``z[:origin]``
        (``h`` one horizon for every origin, or one per origin)."""
        cum = np.concatenate([[0.0], np.cumsum(z)])
        columns = [np.ones(len(origins))]
        columns += [z[origins - k] for k in range(1, self.lags + 1)]
        columns += [(cum[origins] - cum[origins - w]) / w for w in self.recent_windows]
        target = origins + h - 1
        for m in self.periods:
            for width in self.smoothings:
                lo = target - m - width
                hi = np.minimum(target - m + width + 1, origins)
                columns.append((cum[hi] - cum[lo]) / (hi - lo))
            columns.append(z[origins - 1 - m])
            columns += [(cum[origins - m] - cum[origins - m - w]) / w for w in self.recent_windows]
        return np.stack(columns, axis=1)

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        self.transformed = self.transform != "none" and bool(np.all(y >= 0))
        z = self._transform(y[:state_at])
        self.periods = self._affordable_periods(len(z))
        origins = np.arange(self._reach(self.periods), len(z) - self.max_horizon + 1)
        self.ceiling = CEILING * float(np.max(np.abs(z))) if len(z) else np.inf
        half_life = self.half_life or max((*self.periods, 4 * MIN_ORIGINS))
        weights = np.sqrt(0.5 ** ((origins[-1] - origins) / half_life))
        coefs = []
        for h in range(1, self.max_horizon + 1):
            x = self._features(z, origins, h)
            coefs.append(_ridge_by_loo(x, z[origins + h - 1], weights, self.ridges))
        self.coef = np.stack(coefs)

    def _forecast_path(self) -> np.ndarray:
        kept = self.history.values()
        return self._forecast_paths(kept, np.array([len(kept)]))[0]

    def _forecast_paths(self, y: np.ndarray, origins: np.ndarray) -> np.ndarray:
        z = self._transform(y)
        horizons = np.tile(np.arange(1, self.max_horizon + 1), len(origins))
        rows = self._features(z, np.repeat(origins, self.max_horizon), horizons)
        path = np.einsum("nf,nf->n", rows, self.coef[horizons - 1])
        path = self._inverse(np.clip(path, -self.ceiling, self.ceiling))
        return path.reshape(len(origins), self.max_horizon)


def _ridge_by_loo(
    x: np.ndarray, target: np.ndarray, weights: np.ndarray, ridges: tuple[float, ...]
) -> np.ndarray:
    """Weighted ridge coefficients (intercept unpenalised, columns standardised), with the
    penalty that gives the lowest leave-one-out error, which ridge has in closed form. Short
    histories get a strong penalty, long ones almost plain least squares."""
    scale = np.maximum(x.std(axis=0), 1e-9)
    scale[0] = 1.0
    a = x / scale * weights[:, None]
    b = target * weights
    gram, moment = a.T @ a, a.T @ b
    best, best_error = None, np.inf
    for ridge in ridges:
        penalty = ridge * np.eye(len(gram))
        penalty[0, 0] = 0.0
        inverse = np.linalg.pinv(gram + penalty)
        coef = inverse @ moment
        leverage = np.einsum("ij,jk,ik->i", a, inverse, a)
        loo = (b - a @ coef) / np.maximum(1.0 - leverage, 1e-6)
        error = float(loo @ loo)
        if error < best_error:
            best, best_error = coef, error
    return best / scale
