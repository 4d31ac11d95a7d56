"""Prediction intervals from recent out-of-sample errors (split conformal), scaled to the level.

A model's upper bound at quantile q for horizon h is its point forecast plus a margin: the
q-quantile of the errors it made at that same horizon on points it had not seen. The errors come
first from the calibration tail held out at fit time and then from every new point, in a bounded
window, so the bound follows the series as its noise changes and its coverage can be checked in a
backtest. No distribution is assumed: real load is skewed and bursty.

Load noise grows with the load: a margin measured in absolute units, mostly on busy hours, is far
too wide on quiet ones (and a little too narrow at peaks). So each error is divided by a scale
``max(level, floor) ** power`` of the point forecast it belonged to, the quantile is taken of those
ratios, and the margin is that quantile times the scale of the current forecast. ``power`` 0 is the
plain absolute margin, 1 a margin proportional to the level (multiplicative noise), 0.5 one that
grows like the square root (Poisson-like counts). The floor (a fraction of the series' mean
magnitude) keeps near-zero forecasts from dividing by zero. Whatever the scale, the conformal rank
keeps marginal coverage at q for exchangeable errors; the scale only decides *where* the width
goes. Each model picks its power after its calibration replay by the pinball (quantile) loss of the
bounds each power would have given there: a proper score for a quantile, rewarding the narrowest
bound that still covers.

Errors need not come from one regime: a model is calibrated on its backtest's errors (fits on
less history, older load) and then on its live ones. A window with a ``half_life`` weighs each
error by ``0.5 ** (age / half_life)`` (newest age 0) and takes the weighted quantile with the
next point's own weight put at +inf (nonexchangeable conformal prediction, Barber, Candes,
Ramdas and Tibshirani 2023), read between neighbouring errors so that it covers ``q`` on average
rather than at least ``q`` (:func:`weighted_conformal_quantiles`): the bound follows the recent
errors, and the finite-sample correction is the weight of one new point against the effective
number of errors, never a whole rank of a short window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

POWERS = (0.0, 0.5, 1.0)
FLOOR_FRACTION = 0.1
MIN_ERRORS_TO_CHOOSE = 20
# Errors older than this many half-lives (weight under 0.4 %) are left out of the quantile.
RECENCY_REACH = 8.0


@dataclass(frozen=True)
class LevelScaling:
    """How a forecast error is scaled by the level it was made at: ``max(level, floor)**power``."""

    power: float = 0.0
    floor: float = 1.0

    def __post_init__(self) -> None:
        if self.power < 0 or self.floor <= 0:
            raise ValueError("need power >= 0 and floor > 0")

    def scale(self, level: np.ndarray | float) -> np.ndarray:
        if self.power == 0.0:
            return np.ones_like(np.asarray(level, dtype=float))
        scaled: np.ndarray = np.maximum(np.asarray(level, dtype=float), self.floor) ** self.power
        return scaled

    @staticmethod
    def floor_for(series: np.ndarray) -> float:
        """A floor in the series' own units: a tenth of its mean magnitude (1.0 if all zero)."""
        magnitude = float(np.mean(np.abs(series))) if len(series) else 0.0
        return FLOOR_FRACTION * magnitude if magnitude > 0 else 1.0


def conformal_quantile(values: np.ndarray, q: float) -> float:
    """The finite-sample conformal quantile: rank ceil((n+1)q) of n values keeps coverage >= q
    (the largest value when that rank is past n). A partial sort: called on every forecast."""
    n = len(values)
    rank = min(n, math.ceil((n + 1) * q))
    return float(np.partition(values, rank - 1)[rank - 1])


def pinball_loss(residual: np.ndarray, q: float) -> float:
    """Mean quantile loss of an upper bound at q, given actual - bound."""
    return float(np.mean(np.maximum(q * residual, (q - 1.0) * residual)))


def weighted_conformal_quantiles(
    values: np.ndarray, weights: np.ndarray, q: np.ndarray
) -> np.ndarray:
    """Per row, the value at share ``q`` of the row's weight, counting one more point of weight
    1 at +inf (the row's largest value past its last share). Rows hold +inf (weight 0) where
    they have no error; ``q`` has one level per row.

    The k-th smallest of n exchangeable errors covers a new one with probability k/(n+1):
    each value sits at its cumulative share, and a level between two shares is read between
    their values (linearly). The bound then covers q on average, where the next rank up
    (plain split conformal) covers up to 1/(n+1) more: on a short window, a whole point of
    coverage or more."""
    order = np.argsort(values, axis=1)
    ordered = np.take_along_axis(values, order, axis=1)
    share = np.cumsum(np.take_along_axis(weights, order, axis=1), axis=1)
    share /= share[:, -1:] + 1.0
    rows = np.arange(len(values))
    last = (weights > 0).sum(axis=1) - 1
    above = np.minimum((share < q[:, None]).sum(axis=1), last)  # first value at or past q
    below = np.maximum(above - 1, 0)
    low, high = share[rows, below], share[rows, above]
    fraction = np.clip((q - low) / np.where(high > low, high - low, 1.0), 0.0, 1.0)
    quantiles: np.ndarray = ordered[rows, below] + fraction * (
        ordered[rows, above] - ordered[rows, below]
    )
    return quantiles


class ResidualWindow:
    """The last ``size`` forecast errors (actual - point) per horizon 1..max_horizon, each with
    the point forecast (the level) it was made at; with ``half_life`` (in errors), recent
    errors weigh more in the quantiles (see the module doc)."""

    def __init__(self, max_horizon: int, size: int = 500, half_life: float | None = None) -> None:
        if max_horizon < 1 or size < 1:
            raise ValueError("max_horizon and size must be >= 1")
        if half_life is not None and half_life <= 0:
            raise ValueError("half_life must be > 0")
        self.max_horizon = max_horizon
        self.size = size
        self.half_life = half_life
        self._decay = 0.5 ** (np.arange(size) / half_life) if half_life else np.ones(size)
        self._values = np.zeros((max_horizon, size))
        self._levels = np.zeros((max_horizon, size))
        self._count = np.zeros(max_horizon, dtype=int)
        self._next = np.zeros(max_horizon, dtype=int)

    def add(self, horizon: int, error: float, level: float = 0.0) -> None:
        i = horizon - 1
        self._values[i, self._next[i]] = error
        self._levels[i, self._next[i]] = level
        self._next[i] = (self._next[i] + 1) % self.size
        self._count[i] = min(self._count[i] + 1, self.size)

    def add_many(self, horizon: int, errors: np.ndarray, levels: np.ndarray) -> None:
        """:meth:`add` for each error (oldest first) with its level, in one write."""
        i = horizon - 1
        errors, levels = errors[-self.size :], levels[-self.size :]
        slots = (self._next[i] + np.arange(len(errors))) % self.size
        self._values[i, slots] = errors
        self._levels[i, slots] = levels
        self._next[i] = (self._next[i] + len(errors)) % self.size
        self._count[i] = min(self._count[i] + len(errors), self.size)

    def count(self, horizon: int) -> int:
        return int(self._count[horizon - 1])

    def errors(self, horizon: int) -> np.ndarray:
        """Errors at ``horizon``, oldest first."""
        return self._ordered(self._values, horizon)

    def levels(self, horizon: int) -> np.ndarray:
        """The point forecasts those errors were made at, oldest first."""
        return self._ordered(self._levels, horizon)

    def _ordered(self, table: np.ndarray, horizon: int) -> np.ndarray:
        i = horizon - 1
        n = self._count[i]
        if n < self.size:
            return table[i, :n].copy()
        return np.roll(table[i], -self._next[i])

    def _source(self, horizon: int) -> int | None:
        """The horizon whose errors stand for ``horizon``: itself, or the nearest shorter one
        that has errors while it has none yet."""
        for h in range(horizon, 0, -1):
            if self._count[h - 1]:
                return h
        return None

    def margin(
        self, horizon: int, q: float, point: float = 0.0, scaling: LevelScaling = LevelScaling()
    ) -> float:
        """What to add to ``point`` for the q upper bound at ``horizon`` under ``scaling`` (by
        default the plain conformal quantile of the errors); 0.0 with no errors yet."""
        return float(self.margins((horizon,), q, np.array([point]), scaling)[0])

    def margins(
        self,
        horizons: tuple[int, ...],
        q: float | np.ndarray,
        points: np.ndarray,
        scaling: LevelScaling = LevelScaling(),
    ) -> np.ndarray:
        """:meth:`margin` for several horizons at once, in one partial sort: a backtest asks
        for every horizon at every step. Horizons hold different numbers of errors until the
        window is full (a forecast h steps ahead is scored h - 1 points later); the missing
        slots are padded with +inf, which no rank up to a row's own count can reach. ``q`` is
        one level for every horizon or one per horizon."""
        sources = [self._source(h) for h in horizons]
        known = [i for i, h in enumerate(sources) if h is not None]
        out = np.zeros(len(horizons))
        if not known:
            return out
        rows = np.asarray([sources[i] for i in known]) - 1
        q = np.broadcast_to(np.asarray(q, dtype=float), (len(horizons),))[known]
        if self.half_life is None:
            quantiles = self._plain_quantiles(rows, q, scaling)
        else:
            quantiles = self._weighted_quantiles(rows, q, scaling)
        if scaling.power != 0.0:
            quantiles = quantiles * scaling.scale(np.asarray(points, dtype=float)[known])
        out[known] = quantiles
        return out

    def _plain_quantiles(
        self, rows: np.ndarray, q: np.ndarray, scaling: LevelScaling
    ) -> np.ndarray:
        """Rank ``ceil((n + 1) q)`` of each row's scaled errors, in one partial sort."""
        counts = self._count[rows]
        width = int(counts.max())
        values = self._values[rows, :width]
        if scaling.power != 0.0:
            values = values / scaling.scale(self._levels[rows, :width])
        values = np.where(np.arange(width) < counts[:, None], values, np.inf)
        ranks = np.minimum(counts, np.ceil((counts + 1) * q).astype(int)) - 1
        ordered = np.partition(values, np.unique(ranks), axis=1)
        at_rank: np.ndarray = ordered[np.arange(len(rows)), ranks]
        return at_rank

    def _weighted_quantiles(
        self, rows: np.ndarray, q: np.ndarray, scaling: LevelScaling
    ) -> np.ndarray:
        """The recency-weighted quantile of each row's scaled errors, over the newest errors
        whose weight is not negligible (``RECENCY_REACH`` half-lives): the bound is asked at
        every update, and a shorter sort keeps that cheap."""
        reach = min(self.size, int(np.ceil(RECENCY_REACH * (self.half_life or 0.0))))
        keep = max(1, min(reach, int(self._count[rows].max())))
        # slot of each of the newest ``keep`` errors, oldest first; a row not yet full has
        # its next free slot at its count, so slots below 0 are errors it never had
        slots = self._next[rows][:, None] + np.arange(-keep, 0)
        held = (slots >= 0) | (self._count[rows] >= self.size)[:, None]
        slots %= self.size
        values = self._values[rows[:, None], slots]
        if scaling.power != 0.0:
            values = values / scaling.scale(self._levels[rows[:, None], slots])
        weights = np.where(held, self._decay[keep - 1 :: -1][:keep], 0.0)
        return weighted_conformal_quantiles(np.where(held, values, np.inf), weights, q)

    def best_scaling(
        self, q: float, floor: float, powers: tuple[float, ...] = POWERS
    ) -> LevelScaling:
        """The power whose bounds would have had the lowest pinball loss on the errors held now,
        summed over horizons (in-sample, but one parameter out of three). Absolute margins when
        there are too few errors to tell."""
        candidates = [LevelScaling(p, floor) for p in powers]
        if int(self._count[0]) < MIN_ERRORS_TO_CHOOSE:
            return LevelScaling(0.0, floor)
        losses = []
        for scaling in candidates:
            loss = 0.0
            for h in range(1, self.max_horizon + 1):
                n = self._count[h - 1]
                if n < MIN_ERRORS_TO_CHOOSE:
                    continue
                errors, levels = self._values[h - 1, :n], self._levels[h - 1, :n]
                scale = scaling.scale(levels)
                bound = conformal_quantile(errors / scale, q) * scale
                loss += pinball_loss(errors - bound, q)
            losses.append(loss)
        return candidates[int(np.argmin(losses))]
