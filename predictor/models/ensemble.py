"""Combinations of several models: errors of different kinds partly cancel.

The median lets no single bad member drag the forecast far (unlike a mean). The trimmed mean
drops the highest and the lowest member and averages the rest: as robust to one wild member, and
less jumpy than the median when the middle members disagree, which tends to pay further ahead.
Which combination does better on a series is for the backtest to say, so an ensemble can run other
combinations of the same fitted members inside itself (``views``): selection scores them from
the ensemble's own pass, without fitting the members again.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from predictor.models.base import ForecastModel


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


class MedianEnsemble(ForecastModel):
    """Point forecast = the median (or ``combine``) of the members' point forecasts at each
    horizon; ``views`` (name -> combination) are further combinations exposed as parts."""

    def __init__(
        self,
        members: list[ForecastModel],
        name: str = "ensemble",
        combine: str = "median",
        views: Mapping[str, str] | None = None,
        **kwargs,
    ) -> None:
        if len(members) < 2:
            raise ValueError("an ensemble needs at least two members")
        unknown = {combine, *(views or {}).values()} - set(COMBINATIONS)
        if unknown:
            raise ValueError(f"unknown combination {sorted(unknown)[0]!r}")
        self.members = members
        self.name = name
        self.combine = combine
        self.views = [
            CombinationView(members, how, view_name) for view_name, how in (views or {}).items()
        ]
        super().__init__(members[0].max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        return max(m.min_points for m in self.members) + 1

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        for member in self.members:
            member.fit_until(y, state_at)
        for view in self.views:
            view.fit_until(y, state_at)

    def _advance(self, value: float) -> None:
        for member in self.members:
            member.update(value)
        for view in self.views:
            view.update(value)  # after the members: it combines their new forecasts

    def _advance_many(self, values: np.ndarray) -> np.ndarray:
        """Each member replays ``values`` in bulk (see ForecastModel.replay); the combinations
        of their paths are taken for all points at once."""
        self.history.extend(values)
        self.points_seen += len(values)
        member_paths = np.stack([member.replay(values) for member in self.members])
        for view in self.views:
            view.replay_combined(values, member_paths)
        return self._clip(COMBINATIONS[self.combine](member_paths))

    def parts(self) -> dict[str, ForecastModel]:
        return {m.name: m for m in [*self.members, *self.views]}

    def _forecast_path(self) -> np.ndarray:
        return COMBINATIONS[self.combine](np.stack([m.latest_path() for m in self.members]))


class CombinationView(ForecastModel):
    """Another combination of an ensemble's members, driven by that ensemble's fit and updates
    (it fits nothing itself); it keeps its own errors, so it has its own upper bound."""

    def __init__(self, members: list[ForecastModel], combine: str, name: str) -> None:
        self.members = members
        self.combine = combine
        self.name = name
        super().__init__(members[0].max_horizon)

    @property
    def min_points(self) -> int:
        return max(m.min_points for m in self.members) + 1

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        return None  # the ensemble has fitted the members

    def replay_combined(self, values: np.ndarray, member_paths: np.ndarray) -> None:
        """:meth:`replay` of ``values``, given the members' paths after each of them
        (members x values x horizons), which the ensemble has just computed."""
        self.history.extend(values)
        self.points_seen += len(values)
        self._record_replay(values, self._clip(COMBINATIONS[self.combine](member_paths)))

    def _forecast_path(self) -> np.ndarray:
        return COMBINATIONS[self.combine](np.stack([m.latest_path() for m in self.members]))
