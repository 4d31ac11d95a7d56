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
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

POWERS = (0.0, 0.5, 1.0)
FLOOR_FRACTION = 0.1
MIN_ERRORS_TO_CHOOSE = 20


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
        return np.maximum(np.asarray(level, dtype=float), self.floor) ** self.power

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


class ResidualWindow:
    """The last ``size`` forecast errors (actual - point) per horizon 1..max_horizon, each with
    the point forecast (the level) it was made at."""

    def __init__(self, max_horizon: int, size: int = 500) -> None:
        if max_horizon < 1 or size < 1:
            raise ValueError("max_horizon and size must be >= 1")
        self.max_horizon = max_horizon
        self.size = size
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
        h = self._source(horizon)
        if h is None:
            return 0.0
        n = self._count[h - 1]
        if scaling.power == 0.0:
            return conformal_quantile(self._values[h - 1, :n], q)
        ratios = self._values[h - 1, :n] / scaling.scale(self._levels[h - 1, :n])
        return conformal_quantile(ratios, q) * float(scaling.scale(point))

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
        counts = self._count[rows]
        width = int(counts.max())
        values = self._values[rows, :width]
        if scaling.power != 0.0:
            values = values / scaling.scale(self._levels[rows, :width])
        values = np.where(np.arange(width) < counts[:, None], values, np.inf)
        q = np.broadcast_to(np.asarray(q, dtype=float), (len(horizons),))[known]
        ranks = np.minimum(counts, np.ceil((counts + 1) * q).astype(int)) - 1
        ordered = np.partition(values, np.unique(ranks), axis=1)
        quantiles = ordered[np.arange(len(rows)), ranks]
        if scaling.power != 0.0:
            quantiles = quantiles * scaling.scale(np.asarray(points, dtype=float)[known])
        out[known] = quantiles
        return out

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
