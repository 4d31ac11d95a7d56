"""What every forecasting model shares: a bounded history, cheap updates and calibrated bounds.

A model is fitted once on a series (a full, possibly slow refit) and then fed one new point at a
time with :meth:`ForecastModel.update`, which only advances its state. Every update also scores
the forecasts the model issued before that point, so each model carries its own out-of-sample
errors per horizon, with the level each forecast was made at; :meth:`ForecastModel.predict` turns
them into the upper bound, scaled to the current level as the model's own calibration errors
say fits best (see :mod:`predictor.intervals`). ``fit`` replays the tail of the series for
exactly that purpose, from the state the model had before it, with :meth:`ForecastModel.replay`:
the same result as one ``update`` per point, but a model whose state is just its kept history
(and fitted parameters) forecasts every point of the tail in one batch of array operations. That
replay ran after each of the many fits a selection makes and was most of its cost.

Calibration errors may come from another regime than the live one (older fits, a quieter or
busier week), so the level of each horizon's bound adapts online (adaptive conformal inference,
Gibbs and Candes 2021): every live point that the bound missed raises it, every covered one
lowers it, in the proportion that holds the miss rate at ``1 - q``. Only ``update`` adapts:
a bulk replay (the calibration tail after a fit) comes before any bound is asked.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from predictor.intervals import LevelScaling, ResidualWindow

ADAPT_STEP = 0.05
# In errors: the bound follows the live errors within a hundred or so points, as
# the backtest's (older fits, older load) give way to them (see predictor.intervals).
RESIDUAL_HALF_LIFE = 50.0
ADAPT_LEVELS = (0.5, 0.995)


class InsufficientHistory(ValueError):
    """The series is too short for this model; the message says how many points it needs."""


@dataclass(frozen=True)
class Prediction:
    """Point forecasts and upper bounds for ``horizons`` (steps ahead of the last point)."""

    horizons: tuple[int, ...]
    point: np.ndarray
    upper: np.ndarray
    quantile: float


class History:
    """The most recent ``capacity`` points, appended in O(1) amortised, read as arrays."""

    def __init__(self, capacity: int) -> None:
        self.capacity = max(1, capacity)
        self._buf = np.zeros(2 * self.capacity)
        self._start = 0
        self._end = 0

    def extend(self, values: np.ndarray) -> None:
        merged = np.concatenate([self.values(), np.asarray(values, dtype=float)])
        merged = merged[-self.capacity :]
        self._buf[: len(merged)] = merged
        self._start, self._end = 0, len(merged)

    def append(self, value: float) -> None:
        if self._end == len(self._buf):
            keep = self._buf[self._end - self.capacity + 1 : self._end].copy()
            self._buf[: len(keep)] = keep
            self._start, self._end = 0, len(keep)
        self._buf[self._end] = value
        self._end += 1
        self._start = max(self._start, self._end - self.capacity)

    def __len__(self) -> int:
        return self._end - self._start

    def values(self) -> np.ndarray:
        """All kept points, oldest first (a view: do not modify)."""
        return self._buf[self._start : self._end]

    def last(self, k: int) -> np.ndarray:
        return self._buf[max(self._start, self._end - k) : self._end]

    def ago(self, steps: int) -> float:
        """The point ``steps`` back; ``ago(1)`` is the last one."""
        return float(self._buf[self._end - steps])


def as_series(series: Sequence[float] | np.ndarray) -> np.ndarray:
    """A finite float array, or a ValueError that says how to fix the input."""
    y = np.asarray(series, dtype=float).ravel()
    if not np.all(np.isfinite(y)):
        raise ValueError(
            "series holds NaN or infinite values; fill gaps first (predictor.series.fill_gaps)"
        )
    return y


class ForecastModel(ABC):
    """Base class: subclasses implement ``_fit``, ``_advance`` and ``_forecast_path``.

    ``max_horizon`` bounds the horizons (in steps) a model forecasts and scores.
    ``calibration_fraction`` of the fitted series (at most ``residual_window`` points) is held
    back to measure out-of-sample errors for the upper bound.
    """

    name: str = "model"

    def __init__(
        self,
        max_horizon: int,
        calibration_fraction: float = 0.2,
        residual_window: int = 500,
        residual_half_life: float | None = RESIDUAL_HALF_LIFE,
    ) -> None:
        if max_horizon < 1:
            raise ValueError("max_horizon must be >= 1")
        self.max_horizon = max_horizon
        self.calibration_fraction = calibration_fraction
        self.residual_window = residual_window
        self.residual_half_life = residual_half_life
        self.residuals = ResidualWindow(max_horizon, residual_window, residual_half_life)
        self.history = History(self.history_capacity())
        self.nonnegative = True
        self.points_seen = 0
        self.interval_floor = 1.0
        self._scalings: dict[float, LevelScaling] = {}  # per quantile, chosen after a fit
        self._adaptive: dict[float, np.ndarray] = {}  # per quantile: offset per horizon
        self._pending: deque[np.ndarray] = deque(maxlen=max_horizon)
        self._path: np.ndarray | None = None

    def _new_residuals(self) -> ResidualWindow:
        return ResidualWindow(self.max_horizon, self.residual_window, self.residual_half_life)

    # -- what subclasses provide -------------------------------------------------------------
    @property
    @abstractmethod
    def min_points(self) -> int:
        """Points ``_fit`` needs."""

    def history_capacity(self) -> int:
        """How many recent points the model keeps; subclasses needing more override this."""
        return 1

    @abstractmethod
    def _fit(self, y: np.ndarray, state_at: int) -> None:
        """Estimate parameters from ``y`` and leave the state at the end of ``y[:state_at]``
        (which ``history`` holds). Points after ``state_at`` are replayed through ``update``
        to measure errors; a model that would overfit them (many parameters) must estimate
        from ``y[:state_at]`` only."""

    def _advance(self, value: float) -> None:
        """Move the state past ``value`` (``history`` already holds it); cheap."""
        return None

    @abstractmethod
    def _forecast_path(self) -> np.ndarray:
        """Point forecasts for horizons 1..max_horizon from the current state."""

    def _forecast_paths(self, y: np.ndarray, origins: np.ndarray) -> np.ndarray | None:
        """Point forecasts (origins x horizons) made after seeing ``y[:origin]``, for every
        origin at once, or None (the default). Only a model whose whole state is its kept
        history (and its fitted parameters) can offer it: then a replay of many points costs
        a few array operations instead of one forecast per point."""
        return None

    def _advance_many(self, values: np.ndarray) -> np.ndarray:
        """Append ``values`` and move the state past them; the forecast path after each
        (values x horizons, clipped). Batched through :meth:`_forecast_paths` when the model
        offers it, else one :meth:`_advance` and forecast per point."""
        kept = self.history.values()
        paths = self._forecast_paths(
            np.concatenate([kept, values]), len(kept) + 1 + np.arange(len(values))
        )
        if paths is not None:
            self.history.extend(values)
            self.points_seen += len(values)
            return self._clip(paths)
        paths = np.empty((len(values), self.max_horizon))
        for i, value in enumerate(values):
            self.history.append(float(value))
            self.points_seen += 1
            self._advance(float(value))
            paths[i] = self._clip(self._forecast_path())
        return paths

    # -- the public protocol -----------------------------------------------------------------
    def fit(self, series: Sequence[float] | np.ndarray) -> None:
        """Refit on ``series``; errors are measured by replaying its tail through ``update``."""
        y = as_series(series)
        if len(y) < self.min_points + 1:
            raise InsufficientHistory(
                f"{self.name} needs at least {self.min_points + 1} points, got {len(y)}"
            )
        held_back = int(len(y) * self.calibration_fraction)
        held_back = max(0, min(held_back, self.residual_window, len(y) - self.min_points))
        self.fit_until(y, len(y) - held_back)
        self.replay(y[len(y) - held_back :])

    def fit_until(self, y: np.ndarray, state_at: int) -> None:
        """Estimate from ``y`` and stop at ``y[:state_at]``, with no errors recorded yet; the
        caller replays the rest (``fit`` does it; an ensemble does it for its members)."""
        self.nonnegative = bool(np.all(y >= 0))
        self.residuals = self._new_residuals()
        self.interval_floor = LevelScaling.floor_for(y[:state_at])
        self._scalings = {}
        self._adaptive = {}
        self.history = History(self.history_capacity())
        self.history.extend(y[:state_at])
        self.points_seen = state_at
        self._pending.clear()
        self._fit(y, state_at)
        self._path = self._clip(self._forecast_path())

    def update(self, value: float) -> None:
        """Take one new point: score earlier forecasts against it, then advance the state."""
        if self._path is None:
            raise RuntimeError(f"{self.name}: call fit() before update()")
        value = float(value)
        if not np.isfinite(value):
            raise ValueError(f"{self.name}: update() needs a finite value, got {value}")
        self._pending.appendleft(self._path)
        self._adapt(value)
        for age, path in enumerate(self._pending):
            self.residuals.add(age + 1, value - path[age], path[age])
        self.history.append(value)
        self.points_seen += 1
        self._advance(value)
        self._path = self._clip(self._forecast_path())

    def replay(self, values: Sequence[float] | np.ndarray) -> np.ndarray:
        """:meth:`update` with each of ``values`` in turn, with the same result, in bulk: the
        calibration replay after every fit runs hundreds of points, and selection refits every
        candidate several times. Returns the forecast path after each value."""
        if self._path is None:
            raise RuntimeError(f"{self.name}: call fit() before replay()")
        values = as_series(values)
        if not len(values):
            return np.empty((0, self.max_horizon))
        return self._record_replay(values, self._advance_many(values))

    def _record_replay(self, values: np.ndarray, paths: np.ndarray) -> np.ndarray:
        """Score the forecasts issued before each of ``values`` (those pending from earlier
        updates, the current one, then ``paths``, the path after each value) as :meth:`update`
        does, and make the last of ``paths`` current."""
        pending = len(self._pending)
        issued = np.concatenate(
            [
                np.asarray(list(reversed(self._pending))).reshape(pending, self.max_horizon),
                [self._path],
                paths,
            ]
        )
        n = len(values)
        for age in range(self.max_horizon):
            first = max(0, age - pending)  # the first value with a forecast issued age steps back
            if first >= n:
                continue
            levels = issued[pending + first - age : pending + n - age, age]
            self.residuals.add_many(age + 1, values[first:] - levels, levels)
        self._pending.clear()  # the last max_horizon issued, newest first, as update keeps them
        self._pending.extend(issued[pending + n - 1 :: -1][: self.max_horizon])
        self._path = paths[-1]
        return paths

    def predict(self, horizons: Sequence[int] | int, quantile: float = 0.9) -> Prediction:
        """Point forecast and upper bound at ``quantile`` for each horizon (steps ahead)."""
        if self._path is None:
            raise RuntimeError(f"{self.name}: call fit() before predict()")
        hs = (horizons,) if isinstance(horizons, int) else tuple(int(h) for h in horizons)
        for h in hs:
            if not 1 <= h <= self.max_horizon:
                raise ValueError(f"horizon {h} is outside 1..{self.max_horizon} for {self.name}")
        if not 0 < quantile < 1:
            raise ValueError(f"quantile must be in (0, 1), got {quantile}")
        point = np.array([self._path[h - 1] for h in hs])
        scaling = self.interval_scaling(quantile)
        offset = self._adaptive.setdefault(quantile, np.zeros(self.max_horizon))
        levels = np.clip(quantile + offset[np.asarray(hs) - 1], *ADAPT_LEVELS)
        margin = np.maximum(self.residuals.margins(hs, levels, point, scaling), 0.0)
        return Prediction(horizons=hs, point=point, upper=point + margin, quantile=quantile)

    def recalibrate(self, errors: Mapping[int, tuple[np.ndarray, np.ndarray]]) -> None:
        """Replace the calibration errors with ``errors`` (per horizon: errors and the levels
        they were made at, oldest first), measured elsewhere out of sample (selection's
        backtest); live updates keep adding to them."""
        self.residuals = self._new_residuals()
        for h, (values, levels) in errors.items():
            if 1 <= h <= self.max_horizon and len(values):
                self.residuals.add_many(h, np.asarray(values), np.asarray(levels))
        self._scalings = {}
        self._adaptive = {}

    def _adapt(self, value: float) -> None:
        """Adaptive conformal step for every quantile asked so far: the level of each
        horizon's bound moves up by ``ADAPT_STEP * q`` after a miss and down by
        ``ADAPT_STEP * (1 - q)`` after a cover, so the misses of the bounds issued from now on
        settle at ``1 - q`` even where the calibration errors came from another regime. The
        bound checked is the one the current errors give at the level the forecast was made
        at (what was issued, up to the last few errors)."""
        if not self._adaptive:
            return
        ages = len(self._pending)
        hs = tuple(range(1, ages + 1))
        points = np.array([self._pending[a][a] for a in range(ages)])
        for q, offset in self._adaptive.items():
            levels = np.clip(q + offset[:ages], *ADAPT_LEVELS)
            margins = self.residuals.margins(hs, levels, points, self.interval_scaling(q))
            missed = value > points + np.maximum(margins, 0.0)
            offset[:ages] += ADAPT_STEP * (missed - (1.0 - q))

    def interval_scaling(self, quantile: float = 0.9) -> LevelScaling:
        """How the margin at ``quantile`` scales with the level: chosen once per fit, on the
        errors held when first asked (right after the fit: the calibration tail's)."""
        scaling = self._scalings.get(quantile)
        if scaling is None:
            scaling = self.residuals.best_scaling(quantile, self.interval_floor)
            self._scalings[quantile] = scaling
        return scaling

    def latest_path(self) -> np.ndarray:
        """Point forecasts for 1..max_horizon from the current state (no copy of the state)."""
        if self._path is None:
            raise RuntimeError(f"{self.name}: call fit() before predict()")
        return self._path

    def _clip(self, path: np.ndarray) -> np.ndarray:
        path = np.asarray(path, dtype=float)
        return np.maximum(path, 0.0) if self.nonnegative else path
