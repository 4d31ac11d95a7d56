"""Temporal hierarchies: the same series forecast at several aggregation levels, reconciled.

A forecast of the next 8 steps is also a forecast of the next two blocks of 4, of four blocks of
2 and of their sum; a model fitted on the sums of blocks of ``k`` steps sees less noise than
one on the steps themselves and carries the daily level over a stretch where one step is mostly
burst. THieF (Athanasopoulos, Hyndman, Kourentzes and Petropoulos 2017) forecasts every level
on its own and *reconciles* the forecasts of all the nodes (every block of every level) into
base-step forecasts whose sums agree with them as closely as their weights allow: with the
summing matrix ``S`` (nodes x steps: which steps each node covers) and weights ``W`` (the
variance each node's forecast is assumed to have), the reconciled steps are ``G @ nodes`` with
``G = (S' W^-1 S)^-1 S' W^-1`` (weighted least squares). Forecasts that are already coherent
(``nodes = S @ steps``) come back unchanged. ``W`` is structural scaling, the number of steps a
node covers (a block of ``k`` steps has about ``k`` times a step's variance when the steps'
errors are alike and uncorrelated), so ``G`` is fixed per hierarchy: an update costs one small
matrix product.

Here the blocks end at the forecast origin (the last block of each level is the last ``k``
points), so no calendar alignment is needed, and the levels are the divisors of the deepest
horizon (1, 2, 4, 8 for 8 steps: 15 nodes). A level's series is thus re-cut at every new
point; :class:`AggregatedModel` keeps one copy of its model per phase (the origin modulo
``k``), each fitted on the blocks ending at its phase and updated once every ``k`` points with
the newest block, so an update moves one copy per level.

:class:`TemporalHierarchy` is a combination (:mod:`predictor.models.ensemble`): its base level
is the median of its base members, each fitted alone as when it competes on its own, and each
higher level is an :class:`AggregatedModel` member, so selection scores it from the members'
backtests without fitting anything twice.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np

from predictor.models.base import ForecastModel
from predictor.models.ensemble import Combination, TailErrors, _median

# Members with this in their name forecast the sums of blocks; the rest the steps themselves.
BLOCKS_MARK = "_blocks"


def hierarchy_levels(max_horizon: int) -> tuple[int, ...]:
    """The aggregation levels of a hierarchy over ``max_horizon`` steps: its divisors."""
    return tuple(k for k in range(1, max_horizon + 1) if max_horizon % k == 0)


def summing_matrix(levels: Sequence[int], max_horizon: int) -> np.ndarray:
    """Nodes x steps: row ``j`` of level ``k`` covers steps ``j*k`` to ``(j+1)*k - 1``; the
    levels in the order given, each level's blocks oldest first."""
    rows = []
    for k in levels:
        if max_horizon % k:
            raise ValueError(f"level {k} does not divide the {max_horizon} steps")
        for j in range(max_horizon // k):
            row = np.zeros(max_horizon)
            row[j * k : (j + 1) * k] = 1.0
            rows.append(row)
    return np.array(rows)


def reconciliation_matrix(summing: np.ndarray, variances: np.ndarray | None = None) -> np.ndarray:
    """``G`` (steps x nodes) of weighted least squares: steps = ``G @ nodes``. ``variances``
    per node (default: structural scaling, the steps a node covers)."""
    w = summing.sum(axis=1) if variances is None else np.asarray(variances, dtype=float)
    weighted = summing.T / w  # S' W^-1
    return np.linalg.solve(weighted @ summing, weighted)


class AggregatedModel(ForecastModel):
    """Forecasts of the next blocks of ``level`` steps (their sums, from ``make`` fitted on the
    sums of past blocks ending at the origin), spread evenly over the steps they cover: step
    ``h`` gets its block's sum over ``level``. See the module doc for the copy per phase."""

    def __init__(
        self, level: int, max_horizon: int, make: Callable[[int], ForecastModel], **kwargs
    ) -> None:
        if level < 1:
            raise ValueError("level must be >= 1")
        self.level = level
        self.blocks = -(-max_horizon // level)
        self.make = make
        template = make(self.blocks)
        self.name = f"{template.name}{BLOCKS_MARK}{level}"
        self.inner_min_points = template.min_points
        self.copies: list[ForecastModel] = []
        super().__init__(max_horizon, **kwargs)

    @property
    def min_points(self) -> int:
        # Every phase's copy needs its own minimum of blocks, and one more.
        return self.level * (self.inner_min_points + 2)

    def history_capacity(self) -> int:
        return self.level

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        cum = np.concatenate([[0.0], np.cumsum(y[:state_at])])
        self.copies = []
        for phase in range(self.level):
            ends = np.arange(self.level + phase, state_at + 1, self.level)
            copy = self.make(self.blocks)
            copy.fit_until(cum[ends] - cum[ends - self.level], len(ends))
            self.copies.append(copy)

    def _spread(self, block_paths: np.ndarray) -> np.ndarray:
        steps = np.repeat(block_paths / self.level, self.level, axis=-1)
        return steps[..., : self.max_horizon]

    def _advance(self, value: float) -> None:
        block = float(self.history.last(self.level).sum())
        self.copies[self.points_seen % self.level].update(block)

    def _advance_many(self, values: np.ndarray) -> np.ndarray:
        """Each phase's copy replays its new blocks in bulk."""
        kept = self.history.values()
        cum = np.concatenate([[0.0], np.cumsum(np.concatenate([kept, values]))])
        ends = len(kept) + 1 + np.arange(len(values))
        sums = cum[ends] - cum[ends - self.level]
        phases = (self.points_seen + 1 + np.arange(len(values))) % self.level
        blocks = np.empty((len(values), self.blocks))
        for phase in range(self.level):
            rows = np.flatnonzero(phases == phase)
            if len(rows):
                blocks[rows] = self.copies[phase].replay(sums[rows])
        self.history.extend(values)
        self.points_seen += len(values)
        return self._clip(self._spread(blocks))

    def _forecast_path(self) -> np.ndarray:
        return self._spread(self.copies[self.points_seen % self.level].latest_path())


class TemporalHierarchy(Combination):
    """At each level the median of its members (the base members at the steps, the
    :class:`AggregatedModel` members at the higher levels), reconciled (see the module doc).
    The members' levels must divide ``max_horizon``."""

    def __init__(
        self,
        members: list[ForecastModel],
        name: str = "hierarchy",
        **kwargs,
    ) -> None:
        super().__init__(members, name=name, rule="median", **kwargs)
        rows: dict[int, list[int]] = {}
        for i, m in enumerate(members):
            rows.setdefault(m.level if isinstance(m, AggregatedModel) else 1, []).append(i)
        if 1 not in rows or len(rows) < 2:
            raise ValueError("a temporal hierarchy needs base members and aggregated levels")
        self.level_rows = sorted(rows.items())  # (level, member rows), the steps first
        levels = [k for k, _ in self.level_rows]
        self.reconcile = reconciliation_matrix(summing_matrix(levels, self.max_horizon))

    def _combined(self, paths: np.ndarray) -> np.ndarray:
        """Members x [points x] steps: the base median and each level's block sums, as nodes,
        reconciled to steps."""
        nodes = [_median(paths[rows])[..., ::k] * k for k, rows in self.level_rows]
        return self._clip(np.concatenate(nodes, axis=-1) @ self.reconcile.T)

    def combine_paths(
        self,
        paths: Mapping[str, np.ndarray],
        tails: TailErrors,
        actual: np.ndarray | None = None,
        history: np.ndarray | None = None,
    ) -> np.ndarray:
        """See :meth:`Combination.combine_paths`; the reconciliation is fixed, so neither the
        tails nor the actuals move it."""
        del tails, actual, history
        return self._combined(np.stack([paths[n] for n in self.member_names()]))

    def _record_member_tails(self) -> None:
        """Reconcile the members' calibration-tail forecasts origin by origin (a node needs
        every step of its origin's path): the paths whose every horizon was scored from the
        members' errors, the last ``max_horizon - 1`` from the paths they hold pending; each
        horizon then scores those whose target the tail holds."""
        horizons = self.max_horizon
        counts = [[m.residuals.count(h) for h in self.hs] for m in self.members]
        scored = min(c[h - 1] - (horizons - h) for c in counts for h in self.hs)
        pending = min(len(m._pending) for m in self.members) - 1
        if scored <= 0 or pending < horizons - 1:
            return
        paths = []
        for member, count in zip(self.members, counts, strict=True):
            path = np.empty((scored, horizons))
            for h in self.hs:
                end = count[h - 1] - (horizons - h)
                path[:, h - 1] = member.residuals.levels(h)[end - scored : end]
            held = [member._pending[age] for age in range(horizons - 2, -1, -1)]
            paths.append(np.vstack([path, *held]))
        combined = self._combined(np.stack(paths))  # origins x horizons, the newest last
        first = self.members[0].residuals
        # What each target was: the last point is the newest one-step target.
        actual = (first.levels(1) + first.errors(1))[-len(combined) :]
        for h in self.hs:
            rows = len(combined) - h + 1  # origins whose target at h the tail holds
            levels = combined[:rows, h - 1]
            self.residuals.add_many(h, actual[h - 1 : h - 1 + rows] - levels, levels)
