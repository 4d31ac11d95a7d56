"""Combinations of several models: errors of different kinds partly cancel.

Three rules combine the members' point forecasts at each horizon:

- ``median``: no single bad member drags the forecast far (unlike a mean);
- ``trimmed_mean``: drops the highest and the lowest member and averages the rest, as robust to
  one wild member and less jumpy than the median when the middle members disagree;
- ``inverse_error``: a weighted mean of the ``top`` members with the lowest recent error at that
  horizon, plus the best seasonal copy whatever its rank (an anchor that a member gone astray
  cannot drag away from last day's or last week's shape), each weighted by its error to the
  power ``-power``. Forecast combinations with weights estimated from recent errors are hard to
  beat by any single member picked in advance (the "forecast combination puzzle"): a member's
  lead on one stretch rarely survives the next, a blend of good members does.

The ``median`` and ``trimmed_mean`` rules may count a member more than once (``votes``): the
eighth round of docs/predictor-accuracy.md found that a second vote for ``seasonal_mean`` helps
on windows the design was not chosen on, at no cost.

Each member is fitted alone, exactly as it would be as a candidate of its own, so that the
combination's forecasts can be reproduced from the members' own backtests without fitting them
again (selection does so: :meth:`Combination.combine_paths`). The weights of ``inverse_error``
come from the errors each member made on its own calibration tail (out of sample for it); the
combination's own calibration errors are those weighted tails, in sample for the weights, which
is why the service replaces them with the selection's out-of-sample errors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from predictor.intervals import LevelScaling
from predictor.models.base import ForecastModel, History, InsufficientHistory, as_series

TOP = 3
POWER = 2.0
ANCHOR_PREFIX = "seasonal_naive_"

# per member name: per horizon (1..H, index h-1), the errors on its calibration tail
TailErrors = Mapping[str, Sequence[np.ndarray]]


def _median(paths: np.ndarray) -> np.ndarray:
    """np.median over members, without its overhead (it runs on every update)."""
    ordered = np.sort(paths, axis=0)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return 0.5 * (ordered[middle - 1] + ordered[middle])


def _trimmed_mean(paths: np.ndarray) -> np.ndarray:
    if len(paths) < 3:
        return paths.mean(axis=0)
    return np.sort(paths, axis=0)[1:-1].mean(axis=0)


COMBINATIONS: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "median": _median,
    "trimmed_mean": _trimmed_mean,
}
RULES = (*COMBINATIONS, "inverse_error")


def inverse_error_weights(
    names: Sequence[str], tails: TailErrors, max_horizon: int, top: int = TOP, power: float = POWER
) -> np.ndarray:
    """Weights (horizons x members) of the ``inverse_error`` rule from each member's tail errors
    (see the module doc). A member without errors at a horizon gets no weight there; with none
    at all, every member weighs the same."""
    weights = np.zeros((max_horizon, len(names)))
    for i in range(max_horizon):
        error = np.array(
            [float(np.mean(np.abs(tails[n][i]))) if len(tails[n][i]) else np.inf for n in names]
        )
        if not np.isfinite(error).any():
            weights[i] = 1.0 / len(names)
            continue
        order = np.argsort(error, kind="stable")
        picked = set(order[:top].tolist())
        anchors = [j for j in order if names[j].startswith(ANCHOR_PREFIX)]
        if anchors and np.isfinite(error[anchors[0]]):
            picked.add(int(anchors[0]))
        chosen = [j for j in sorted(picked) if np.isfinite(error[j])]
        inverse = np.maximum(error[chosen], 1e-9 * max(float(error[chosen].max()), 1.0)) ** -power
        weights[i, chosen] = inverse / inverse.sum()
    return weights


class Combination(ForecastModel):
    """Point forecast = ``rule`` over the members' point forecasts at each horizon (see the
    module doc); members are fitted and updated alone, as they would be as candidates."""

    def __init__(
        self,
        members: list[ForecastModel],
        name: str = "ensemble",
        rule: str = "median",
        top: int = TOP,
        power: float = POWER,
        votes: Mapping[str, int] | None = None,
        **kwargs,
    ) -> None:
        if len(members) < 2:
            raise ValueError("a combination needs at least two members")
        if rule not in RULES:
            raise ValueError(f"unknown combination {rule!r}; choose from: {', '.join(RULES)}")
        names = [m.name for m in members]
        if len(set(names)) != len(members):
            raise ValueError("combination members need distinct names")
        votes = dict(votes or {})
        if votes and rule not in COMBINATIONS:
            raise ValueError(f"votes apply to the {' and '.join(COMBINATIONS)} rules, not {rule!r}")
        unknown = sorted(set(votes) - set(names))
        if unknown:
            raise ValueError(f"votes name {unknown[0]!r}, which is no member")
        if any(not isinstance(v, int) or v < 1 for v in votes.values()):
            raise ValueError("votes must be whole numbers of at least 1")
        # each member's row, repeated once per vote (what the median and trimmed mean see)
        self._vote_rows = np.repeat(np.arange(len(members)), [votes.get(n, 1) for n in names])
        self.members = members
        self.name = name
        self.rule = rule
        self.top = top
        self.power = power
        self.weights = np.full((members[0].max_horizon, len(members)), 1.0 / len(members))
        super().__init__(members[0].max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return max(m.min_points for m in self.members)

    def member_names(self) -> list[str]:
        return [m.name for m in self.members]

    def voters(self) -> list[str]:
        """The members' names, each as many times as it votes."""
        names = self.member_names()
        return [names[i] for i in self._vote_rows]

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        raise NotImplementedError("a combination fits its members alone: call fit()")

    def fit(self, series: Sequence[float] | np.ndarray) -> None:
        """Fit every member alone on ``series`` (each replays its own calibration tail), set
        the weights from their tail errors, and take the combined tails as this model's
        calibration errors."""
        y = as_series(series)
        if len(y) < self.min_points + 1:
            raise InsufficientHistory(
                f"{self.name} needs at least {self.min_points + 1} points, got {len(y)}"
            )
        for member in self.members:
            member.fit(y)
        tails = {m.name: [m.residuals.errors(h) for h in self.hs] for m in self.members}
        self._start_weights(y, tails)
        self.nonnegative = bool(np.all(y >= 0))
        self.interval_floor = LevelScaling.floor_for(y)
        self._scalings = {}
        self._adaptive = {}
        self.history = History(self.history_capacity())
        self.history.extend(y)
        self.points_seen = len(y)
        self.residuals = self._new_residuals()
        self._record_member_tails()
        self._restart_paths()

    def _record_member_tails(self) -> None:
        """Take the members' calibration-tail forecasts, combined, as this model's calibration
        errors (per horizon, the points every member scored)."""
        for h in self.hs:
            n = min(m.residuals.count(h) for m in self.members)
            if n == 0:
                continue
            levels = np.stack([m.residuals.levels(h)[-n:] for m in self.members])
            actual = levels[0] + self.members[0].residuals.errors(h)[-n:]
            combined = self._clip(self._combine_at(h, levels))
            self.residuals.add_many(h, actual - combined, combined)

    def _start_weights(self, y: np.ndarray, tails: TailErrors) -> None:
        """Set the combination's weights after the members were fitted on ``y``."""
        self.weights = self.weights_for(tails)

    def _restart_paths(self) -> None:
        """The forecasts pending scoring and the latest path, combined from the members'."""
        pending = min(len(m._pending) for m in self.members)
        self._pending.clear()
        for age in range(pending):
            self._pending.append(self._combined(np.stack([m._pending[age] for m in self.members])))
        self._path = self._combined(np.stack([m.latest_path() for m in self.members]))

    @property
    def hs(self) -> range:
        return range(1, self.max_horizon + 1)

    def weights_for(self, tails: TailErrors) -> np.ndarray:
        """The rule's weights (horizons x members) given each member's tail errors; only the
        ``inverse_error`` rule uses them."""
        if self.rule != "inverse_error":
            return self.weights
        return inverse_error_weights(
            self.member_names(), tails, self.max_horizon, self.top, self.power
        )

    def _combine_at(self, h: int, member_values: np.ndarray) -> np.ndarray:
        """Combine members' forecasts at horizon ``h`` (members x points)."""
        if self.rule == "inverse_error":
            return self.weights[h - 1] @ member_values
        return COMBINATIONS[self.rule](member_values[self._vote_rows])

    def _combined(self, paths: np.ndarray) -> np.ndarray:
        """Combine members' paths (members x [points x] horizons)."""
        if self.rule == "inverse_error":
            return self._clip(np.einsum("m...h,hm->...h", paths, self.weights))
        return self._clip(COMBINATIONS[self.rule](paths[self._vote_rows]))

    def combine_paths(
        self,
        paths: Mapping[str, np.ndarray],
        tails: TailErrors,
        actual: np.ndarray | None = None,
        history: np.ndarray | None = None,
    ) -> np.ndarray:
        """The forecasts (points x horizons) this combination would have made had it been
        fitted where the members were: ``paths`` are the members' forecasts, ``tails`` their
        calibration errors after that fit. Selection scores combinations with it. ``actual``
        (what each forecast was for) and ``history`` (the series the fit saw) serve
        combinations whose weights move with every point; this one's do not."""
        del actual, history
        weights = self.weights_for(tails)
        stacked = np.stack([paths[n] for n in self.member_names()])
        if self.rule == "inverse_error":
            return self._clip(np.einsum("mph,hm->ph", stacked, weights))
        return self._clip(COMBINATIONS[self.rule](stacked[self._vote_rows]))

    def _advance(self, value: float) -> None:
        for member in self.members:
            member.update(value)

    def _advance_many(self, values: np.ndarray) -> np.ndarray:
        """Each member replays ``values`` in bulk (see ForecastModel.replay); their paths are
        combined for all points at once."""
        self.history.extend(values)
        self.points_seen += len(values)
        return self._combined(np.stack([member.replay(values) for member in self.members]))

    def _forecast_path(self) -> np.ndarray:
        return self._combined(np.stack([m.latest_path() for m in self.members]))
