"""A combination whose weights follow the best member as it changes, point by point.

The experts are every member plus the median of the ``median_of`` members (the median ensemble,
the a-priori safest forecast), which the prior favours (``median_prior`` of the weight, the rest
shared by the members alike). After every point each horizon's weights move by fixed-share
Hedge (:mod:`predictor.aggregation`) on the experts' absolute errors scaled by the series' mean
level over the calibration tail: between the selection's daily re-picks the weights already
lean towards whichever expert has been closest lately, and the share pulls them back towards the
prior, so a lucky run of one expert is forgotten as fast as it was learned.

A fit starts the weights from the prior and replays the members' calibration-tail errors
through them (out of sample for each member), so a freshly fitted model already weighs its
experts by their recent record. Forecasts that the previous fit issued are not scored by the new
one: the tail already holds the points they were made for. :meth:`TrackingCombination.
combine_paths` reproduces from the members' backtest forecasts, their tail errors and the
actuals exactly what the model would have forecast, so selection scores it without refitting
anything.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Mapping, Sequence

import numpy as np

from predictor.aggregation import LEARNING_RATE, SHARE, FixedShareHedge
from predictor.models.base import ForecastModel
from predictor.models.ensemble import Combination, TailErrors, _median

MEDIAN_PRIOR = 0.5


class TrackingCombination(Combination):
    """Fixed-share Hedge over the members and their median (see the module doc)."""

    def __init__(
        self,
        members: list[ForecastModel],
        median_of: Sequence[str],
        name: str = "tracking",
        learning_rate: float = LEARNING_RATE,
        share: float = SHARE,
        median_prior: float = MEDIAN_PRIOR,
        **kwargs,
    ) -> None:
        super().__init__(members, name=name, **kwargs)
        names = self.member_names()
        unknown = sorted(set(median_of) - set(names))
        if unknown:
            raise ValueError(f"median_of names {unknown[0]!r}, which is no member")
        if not 0 < median_prior < 1:
            raise ValueError("median_prior must be within (0, 1)")
        self.median_rows = [names.index(n) for n in median_of]
        self.learning_rate = learning_rate
        self.share = share
        self.median_prior = median_prior if self.median_rows else None
        self.hedge = self._new_hedge()
        self.scale = 1.0
        self._issued: deque[np.ndarray] = deque(maxlen=self.max_horizon)

    def _new_hedge(self) -> FixedShareHedge:
        members = len(self.members)
        if self.median_prior is None:
            prior = np.full(members, 1.0 / members)
        else:
            prior = np.append(np.full(members, (1 - self.median_prior) / members), 1.0)
            prior[-1] = self.median_prior
        return FixedShareHedge(prior, self.max_horizon, self.learning_rate, self.share)

    def experts(self, member_values: np.ndarray) -> np.ndarray:
        """The experts' values from the members' (members x ...): the members, then their
        median over ``median_of`` when there is one."""
        if not self.median_rows:
            return member_values
        median = _median(member_values[self.median_rows])
        return np.concatenate([member_values, median[None]])

    def start(self, tails: TailErrors, level: float) -> None:
        """Weights from the prior, then replayed through the members' tail errors (scaled by
        ``level``, the series' mean size), newest last; nothing issued yet."""
        self.scale = level if np.isfinite(level) and level > 0 else 1.0
        self.hedge = self._new_hedge()
        self._issued.clear()
        names = self.member_names()
        per_horizon = []
        for i in range(self.max_horizon):
            n = min(len(tails[m][i]) for m in names)
            errors = np.stack([np.asarray(tails[m][i])[len(tails[m][i]) - n :] for m in names])
            per_horizon.append(np.abs(self.experts(errors)).T / self.scale)  # n x experts
        rounds = max((len(e) for e in per_horizon), default=0)
        losses = np.full((rounds, self.max_horizon, len(self.hedge.prior)), np.nan)
        for i, e in enumerate(per_horizon):
            losses[rounds - len(e) :, i] = e  # aligned on the newest error
        for row in losses:
            self.hedge.step(row)

    def observe(self, value: float) -> None:
        """Score the experts' forecasts issued before ``value`` and move the weights."""
        losses = np.full(self.hedge.weights.shape, np.nan)
        for age, issued in enumerate(reversed(self._issued)):
            losses[age] = np.abs(value - issued[:, age]) / self.scale
        self.hedge.step(losses)

    def issue(self, member_paths: np.ndarray) -> np.ndarray:
        """The combined path from the members' (members x horizons), remembered for scoring."""
        experts = self.experts(member_paths)
        self._issued.append(experts)
        return self._clip(self.hedge.combine(experts))

    def _start_weights(self, y: np.ndarray, tails: TailErrors) -> None:
        """Start the weights from the members' tail errors (Combination.fit replays them)."""
        self.start(tails, loss_scale(y, tails))

    def _combine_at(self, h: int, member_values: np.ndarray) -> np.ndarray:
        """The expert mix at horizon ``h`` (members x points), at the current weights: the
        calibration errors are those of the mix as it stands after the replay."""
        return self.hedge.weights[h - 1] @ self.experts(member_values)

    def _restart_paths(self) -> None:
        self._pending.clear()
        self._path = self.issue(np.stack([m.latest_path() for m in self.members]))

    def combine_paths(
        self,
        paths: Mapping[str, np.ndarray],
        tails: TailErrors,
        actual: np.ndarray | None = None,
        history: np.ndarray | None = None,
    ) -> np.ndarray:
        """What this model would have forecast (points x horizons) had it been fitted on
        ``history`` where the members were: ``paths`` are the members' forecasts, ``tails``
        their calibration errors after that fit, ``actual`` (points x horizons, NaN unknown)
        what each forecast was for, from which the weights move (without it they stay where
        the tails left them). This model's own state is left as it was."""
        tracker = copy.copy(self)
        tracker._issued = deque(maxlen=self.max_horizon)
        level = loss_scale(history, tails) if history is not None else 1.0
        tracker.start(tails, level)
        stacked = np.stack([paths[n] for n in self.member_names()])  # members x points x H
        out = np.empty((stacked.shape[1], self.max_horizon))
        for i in range(len(out)):
            out[i] = tracker.issue(stacked[:, i])
            if actual is not None and np.isfinite(actual[i, 0]):
                tracker.observe(float(actual[i, 0]))
        return out

    def _advance(self, value: float) -> None:
        self.observe(value)
        for member in self.members:
            member.update(value)

    def _advance_many(self, values: np.ndarray) -> np.ndarray:
        """Each member replays ``values`` in bulk; the weights then move point by point."""
        member_paths = np.stack([member.replay(values) for member in self.members], axis=1)
        self.history.extend(values)
        self.points_seen += len(values)
        out = np.empty((len(values), self.max_horizon))
        for i, value in enumerate(values):
            self.observe(float(value))
            out[i] = self.issue(member_paths[i])
        return out

    def _forecast_path(self) -> np.ndarray:
        return self.issue(np.stack([m.latest_path() for m in self.members]))


def loss_scale(history: np.ndarray, tails: TailErrors) -> float:
    """The mean size of the last points of ``history`` as long as the longest calibration tail
    (at least one point): what losses are divided by, so one learning rate fits every series."""
    points = max((len(t[0]) for t in tails.values() if len(t)), default=0)
    recent = np.abs(np.asarray(history, dtype=float)[-max(1, points) :])
    return float(np.mean(recent)) if len(recent) else 1.0
