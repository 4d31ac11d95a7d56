"""Sharing one pool of GPUs between autoscalers: guaranteed shares, priorities, weighted fairness.

Every tick each governed autoscaler's proposal (whatever rule made it) becomes a demand in
replicas, each replica costing the GPUs its pod template requests. :func:`allocate` first finds
where everyone should end (the *ideal*):

1. *guaranteed*: each tenant up to its guaranteed GPUs, by priority when they do not all fit;
2. *by priority*: the rest, highest priority first; within one priority by weighted max-min
   fairness (water-filling one replica at a time to the tenant with the fewest GPUs per unit of
   weight). Best-effort work is simply the lowest priority and takes what is left.

Then it keeps the move safe. A tenant keeps its *floor* (the fewest replicas its own scale-down
behavior allows now), so a higher priority waits for a lower one to shrink at its own pace
instead of killing its pods; a tenant marked ``preempt`` lifts that protection from every lower
priority (down to their guaranteed share). While floors hold more than the ideal, growth waits,
the lowest priority's first. So the sum never exceeds the pool unless floors alone keep it over
(the pool shrank below what is running), and then nobody grows.

Allocation says what each tenant may have once everyone has moved; :func:`admit` says how far
one tenant may move *now*, given what the others still hold, so that growth never lands on GPUs
another tenant has not released yet.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from autoscaler.core.behavior import ScalingState, scale_down_limit
from autoscaler.core.spec import GPUAutoscalerSpec

# Why a tenant got less than it proposed (the BudgetLimited condition's reason and the
# autoglm_budget_limited{reason} label).
CAP = "Cap"  # its own cap in the budget
OVER_BUDGET = "OverBudget"  # the pool is smaller than what the tenants may not yet give back
RECLAIMING = "Reclaiming"  # waiting for lower priorities to release GPUs at their own pace
PRIORITY = "Priority"  # higher priorities took the rest of the pool
FAIR_SHARE = "FairShare"  # equal priorities share what is left by weight
EXHAUSTED = "Exhausted"  # the pool is smaller than this tenant's own demand
REASONS = (CAP, OVER_BUDGET, RECLAIMING, PRIORITY, FAIR_SHARE, EXHAUSTED)

# GPUs are counted in floats (quantities may be fractional); sums are compared with this slack.
_EPS = 1e-9


@dataclass(frozen=True)
class Tenant:
    """One governed autoscaler as the allocation sees it, for one resource of the pool."""

    name: str
    gpus_per_replica: float
    current: int
    proposal: int
    floor: int = 0  # fewest replicas reclaiming may leave it with this tick (<= current)
    priority: int = 0
    weight: float = 1.0
    guaranteed_gpus: float = 0.0
    cap_gpus: float | None = None
    preempt: bool = False  # may reclaim lower priorities without waiting for their behavior

    @property
    def cap_replicas(self) -> int | None:
        if self.cap_gpus is None or self.gpus_per_replica <= 0:
            return None
        return math.floor(self.cap_gpus / self.gpus_per_replica + _EPS)

    @property
    def demand(self) -> int:
        """The proposal within the tenant's cap."""
        cap = self.cap_replicas
        return max(0, self.proposal if cap is None else min(self.proposal, cap))

    @property
    def guaranteed_replicas(self) -> int:
        if self.gpus_per_replica <= 0:
            return 0
        return math.floor(self.guaranteed_gpus / self.gpus_per_replica + _EPS)


@dataclass(frozen=True)
class Share:
    """A tenant's outcome: ``allowed`` replicas of the ``proposal``; ``reason`` when cut."""

    name: str
    proposal: int
    allowed: int
    gpus_per_replica: float
    reason: str | None = None

    @property
    def demand_gpus(self) -> float:
        return self.proposal * self.gpus_per_replica

    @property
    def allowed_gpus(self) -> float:
        return self.allowed * self.gpus_per_replica


def allocate(total_gpus: float, tenants: Sequence[Tenant]) -> dict[str, Share]:
    """Each tenant's allowed replicas (see the module docstring)."""
    names = [t.name for t in tenants]
    if len(set(names)) != len(names):
        raise ValueError("tenant names must be unique")
    governed = [t for t in tenants if t.gpus_per_replica > 0]
    ideal = _ideal(total_gpus, governed)
    held = _held(governed)
    alloc = {t.name: max(ideal[t.name], held[t.name]) for t in governed}
    # Floors above the ideal over-commit the pool until their behavior lets them shrink; growth
    # waits for that, the lowest priority's first.
    excess = sum(alloc[t.name] * t.gpus_per_replica for t in governed) - total_gpus
    for t in sorted(governed, key=lambda t: (t.priority, t.name)):
        while excess > _EPS and alloc[t.name] > max(t.current, held[t.name]):
            alloc[t.name] -= 1
            excess -= t.gpus_per_replica

    over = sum(alloc[t.name] * t.gpus_per_replica for t in governed) > total_gpus + _EPS
    shares = {}
    for t in tenants:
        if t.gpus_per_replica <= 0:
            shares[t.name] = Share(t.name, t.proposal, max(0, t.proposal), 0.0)
            continue
        allowed = alloc[t.name]
        reason = None
        if allowed < t.proposal:
            reason = _reason(t, allowed, governed, ideal, held, over)
        shares[t.name] = Share(t.name, t.proposal, allowed, t.gpus_per_replica, reason)
    return shares


def _ideal(total_gpus: float, governed: Sequence[Tenant]) -> dict[str, int]:
    """Where everyone ends once the floors have come down: guaranteed shares, then priority."""
    alloc = {t.name: 0 for t in governed}
    guaranteed = {t.name: min(t.demand, t.guaranteed_replicas) for t in governed}
    remaining = _by_priority(governed, alloc, guaranteed, total_gpus)
    _by_priority(governed, alloc, {t.name: t.demand for t in governed}, remaining)
    return alloc


def _held(governed: Sequence[Tenant]) -> dict[str, int]:
    """What reclaiming may not take this tick: the behavior's floor, lifted down to the
    guaranteed share when a higher priority may preempt."""
    preempting = [t.priority for t in governed if t.preempt]
    held = {}
    for t in governed:
        floor = min(t.floor, t.current)
        if any(p > t.priority for p in preempting):
            floor = min(floor, t.guaranteed_replicas)
        held[t.name] = max(0, min(t.demand, floor))
    return held


def admit(
    total_gpus: float, tenants: Sequence[Tenant], name: str, held_by: Mapping[str, int]
) -> Share:
    """How many replicas ``name`` may have now: its allocation, with growth limited to the GPUs
    the others do not hold (``held_by``: replicas each other tenant holds or was granted)."""
    shares = allocate(total_gpus, tenants)
    share = shares[name]
    me = next(t for t in tenants if t.name == name)
    if share.allowed <= me.current or me.gpus_per_replica <= 0:
        return share
    others = sum(
        held_by.get(t.name, t.current) * t.gpus_per_replica for t in tenants if t.name != name
    )
    fits = math.floor((total_gpus - others) / me.gpus_per_replica + _EPS)
    allowed = min(share.allowed, max(me.current, fits))
    if allowed == share.allowed:
        return share
    return Share(name, share.proposal, allowed, share.gpus_per_replica, RECLAIMING)


def behavior_floor(spec: GPUAutoscalerSpec, state: ScalingState, current: int, now: float) -> int:
    """Fewest replicas the autoscaler's own scale-down policies allow now, never below its
    minReplicas: what reclaiming without preemption may leave it with. Without a behavior
    section the HPA limits no scale-down rate, so only minReplicas holds."""
    lowest = min(spec.min_replicas, current)
    if spec.behavior is None:
        return lowest
    limit = scale_down_limit(state, spec.behavior.scale_down, current, now)
    return max(lowest, min(limit, current))


def _by_priority(
    tenants: Sequence[Tenant], alloc: dict[str, int], target: Mapping[str, int], remaining: float
) -> float:
    for priority in sorted({t.priority for t in tenants}, reverse=True):
        level = [t for t in tenants if t.priority == priority]
        remaining = _water_fill(level, alloc, target, remaining)
    return remaining


def _water_fill(
    level: Sequence[Tenant], alloc: dict[str, int], target: Mapping[str, int], remaining: float
) -> float:
    """One replica at a time to the tenant with the fewest GPUs per unit of weight; a tenant
    whose next replica does not fit drops out (a smaller replica of another may still fit)."""
    active = [t for t in level if alloc[t.name] < target[t.name]]
    while active:
        t = min(
            active,
            key=lambda t: (alloc[t.name] * t.gpus_per_replica / max(t.weight, _EPS), t.name),
        )
        if t.gpus_per_replica <= remaining + _EPS:
            alloc[t.name] += 1
            remaining -= t.gpus_per_replica
            if alloc[t.name] < target[t.name]:
                continue
        active.remove(t)
    return remaining


def _reason(
    t: Tenant,
    allowed: int,
    governed: Sequence[Tenant],
    ideal: Mapping[str, int],
    held: Mapping[str, int],
    over: bool,
) -> str:
    cap = t.cap_replicas
    if cap is not None and allowed >= cap:
        return CAP
    if over:
        return OVER_BUDGET
    if allowed < ideal[t.name]:
        return RECLAIMING
    if any(o.priority > t.priority and ideal[o.name] > 0 for o in governed):
        return PRIORITY
    if any(o.priority == t.priority and o.name != t.name and ideal[o.name] > 0 for o in governed):
        return FAIR_SHARE
    return EXHAUSTED
