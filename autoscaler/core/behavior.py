"""Stabilization windows and scaling policies, as ``horizontal.go`` applies the behavior API.

A proposal from the metrics is first *stabilized*: it may not rise above the lowest recommendation
of the scale-up window nor fall below the highest recommendation of the scale-down window (the
window that suppresses flapping). It is then *rate limited* by the policies of its direction,
counted from the replica count at the start of each policy's period (current minus what was
added in the period plus what was removed), and clamped to minReplicas/maxReplicas. The result
carries the AbleToScale and ScalingLimited condition reasons the HPA writes.

The memory these rules need (past recommendations and scale events) lives in
:class:`ScalingState`, owned by the caller and changed only through this module's functions, so
the same state can be kept in memory, persisted as a dict, or replayed in a simulator.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field, replace
from typing import Any

from autoscaler.core.spec import Behavior, HPAScalingRules


@dataclass
class TimedRecommendation:
    replicas: int
    at: float


@dataclass
class ScaleEvent:
    change: int
    at: float


@dataclass
class ScalingState:
    """Past recommendations and scale events of one autoscaler (the HPA keeps them per key).

    ``seeded`` tells "no recommendation yet" (a new autoscaler, or a restarted controller: the
    current count is recorded first, so nothing scales down at once) from a history whose
    recommendations have all aged out of the windows, or that holds a recommendation of 0.
    """

    recommendations: list[TimedRecommendation] = field(default_factory=list)
    scale_up_events: list[ScaleEvent] = field(default_factory=list)
    scale_down_events: list[ScaleEvent] = field(default_factory=list)
    seeded: bool = False

    def restore(self, snapshot: ScalingState) -> None:
        """Go back to ``snapshot`` (a deep copy taken earlier), forgetting what happened since:
        a decision that could not be applied because its inputs went stale leaves no trace."""
        self.__dict__.update(copy.deepcopy(snapshot).__dict__)

    def to_dict(self) -> dict[str, Any]:
        return {
            "seeded": self.seeded,
            "recommendations": [[r.replicas, r.at] for r in self.recommendations],
            "scaleUpEvents": [[e.change, e.at] for e in self.scale_up_events],
            "scaleDownEvents": [[e.change, e.at] for e in self.scale_down_events],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ScalingState:
        """Rebuild from :meth:`to_dict`; malformed entries raise ValueError naming the key."""
        try:
            recommendations = [
                TimedRecommendation(int(r), float(t)) for r, t in data.get("recommendations", [])
            ]
            return cls(
                recommendations=recommendations,
                seeded=bool(data.get("seeded", bool(recommendations))),
                scale_up_events=[
                    ScaleEvent(int(c), float(t)) for c, t in data.get("scaleUpEvents", [])
                ],
                scale_down_events=[
                    ScaleEvent(int(c), float(t)) for c, t in data.get("scaleDownEvents", [])
                ],
            )
        except (TypeError, ValueError) as exc:
            raise ValueError(
                "scaling state must map recommendations/scaleUpEvents/scaleDownEvents to "
                f"lists of [int, seconds] pairs: {exc}"
            ) from exc


def record_initial_recommendation(state: ScalingState, current_replicas: int, now: float) -> None:
    """The first recommendation is the current count, so a restart never scales down at once
    (``recordInitialRecommendation``); only an unseeded state gets one."""
    if not state.seeded:
        state.recommendations.append(TimedRecommendation(current_replicas, now))
        state.seeded = True


def record_scale(state: ScalingState, now: float, from_replicas: int, to_replicas: int) -> None:
    """Remember a completed scale for the policies' periods (``storeScaleEvent``)."""
    if to_replicas > from_replicas:
        state.scale_up_events.append(ScaleEvent(to_replicas - from_replicas, now))
    elif to_replicas < from_replicas:
        state.scale_down_events.append(ScaleEvent(from_replicas - to_replicas, now))


def forget_outdated(state: ScalingState, behavior: Behavior, now: float) -> None:
    """Drop what no window or period can see any more; it could never change a decision.

    ``behavior`` must have both windows filled in (:func:`with_downscale_window`).
    """
    longest_window = max(
        behavior.scale_up.stabilization_window_seconds or 0,
        behavior.scale_down.stabilization_window_seconds or 0,
    )
    state.recommendations = [r for r in state.recommendations if r.at > now - longest_window]
    up_period = behavior.scale_up.longest_policy_period
    down_period = behavior.scale_down.longest_policy_period
    state.scale_up_events = [e for e in state.scale_up_events if e.at > now - up_period]
    state.scale_down_events = [e for e in state.scale_down_events if e.at > now - down_period]


def with_downscale_window(behavior: Behavior, downscale_stabilization: float) -> Behavior:
    """Fill an unset scale-down window from the controller's flag
    (``maybeInitScaleDownStabilizationWindow``): the API defaults leave it unset on purpose."""
    if behavior.scale_down.stabilization_window_seconds is not None:
        return behavior
    down = replace(behavior.scale_down, stabilization_window_seconds=round(downscale_stabilization))
    return replace(behavior, scale_down=down)


@dataclass(frozen=True)
class Stabilized:
    replicas: int
    reason: str
    message: str


def stabilize(
    state: ScalingState, behavior: Behavior, current: int, desired: int, now: float
) -> Stabilized:
    """Clamp ``desired`` into the stabilization windows and record it as a recommendation.

    ``stabilizeRecommendationWithBehaviors``: the up-window's minimum and the down-window's maximum
    bound the result, both including the new recommendation; the current count is the starting
    point, so the windows only ever hold back a change, never cause one.
    """
    up_cutoff = now - (behavior.scale_up.stabilization_window_seconds or 0)
    down_cutoff = now - (behavior.scale_down.stabilization_window_seconds or 0)
    up_bound = desired
    down_bound = desired
    for rec in state.recommendations:
        if rec.at > up_cutoff:
            up_bound = min(up_bound, rec.replicas)
        if rec.at > down_cutoff:
            down_bound = max(down_bound, rec.replicas)
    recommendation = min(max(current, up_bound), down_bound)
    state.recommendations.append(TimedRecommendation(desired, now))
    if desired >= current:
        return Stabilized(
            recommendation,
            "ScaleUpStabilized",
            "recent recommendations were lower than current one, "
            "applying the lowest recent recommendation",
        )
    return Stabilized(
        recommendation,
        "ScaleDownStabilized",
        "recent recommendations were higher than current one, "
        "applying the highest recent recommendation",
    )


def _change_in_period(events: list[ScaleEvent], period: int, now: float) -> int:
    cutoff = now - period
    return sum(e.change for e in events if e.at > cutoff)


def _replicas_at_period_start(state: ScalingState, current: int, period: int, now: float) -> int:
    """Replicas before the scale events of the last ``period`` seconds: what a policy's
    change per period counts from."""
    return (
        current
        - _change_in_period(state.scale_up_events, period, now)
        + _change_in_period(state.scale_down_events, period, now)
    )


def scale_up_limit(state: ScalingState, rules: HPAScalingRules, current: int, now: float) -> int:
    """Most replicas the scale-up policies allow now (``calculateScaleUpLimitWithScalingRules``)."""
    if rules.select_policy == "Disabled":
        return current
    proposals = []
    for policy in rules.policies:
        start = _replicas_at_period_start(state, current, policy.period_seconds, now)
        if policy.type == "Pods":
            proposals.append(start + policy.value)
        else:
            # Rounded up, or a small target could never grow by a percentage.
            proposals.append(math.ceil(start * (1 + policy.value / 100)))
    return (min if rules.select_policy == "Min" else max)(proposals)


def scale_down_limit(state: ScalingState, rules: HPAScalingRules, current: int, now: float) -> int:
    """Fewest replicas the scale-down policies allow (``calculateScaleDownLimitWithBehaviors``)."""
    if rules.select_policy == "Disabled":
        return current
    proposals = []
    for policy in rules.policies:
        start = _replicas_at_period_start(state, current, policy.period_seconds, now)
        if policy.type == "Pods":
            proposals.append(start - policy.value)
        else:
            proposals.append(int(start * (1 - policy.value / 100)))
    # "Min" selects the smallest change, which for a scale-down is the highest count.
    return (max if rules.select_policy == "Min" else min)(proposals)


@dataclass(frozen=True)
class RateLimited:
    replicas: int
    limited: bool
    reason: str
    message: str


def limit_rate(
    state: ScalingState,
    behavior: Behavior,
    min_replicas: int,
    max_replicas: int,
    current: int,
    desired: int,
    now: float,
) -> RateLimited:
    """Apply the policies and min/max (``convertDesiredReplicasWithBehaviorRate``)."""
    if desired > current:
        limit = max(scale_up_limit(state, behavior.scale_up, current, now), current)
        if max_replicas > limit:
            allowed, reason, message = (
                limit,
                "ScaleUpLimit",
                "the desired replica count is increasing faster than the maximum scale rate",
            )
        else:
            allowed, reason, message = (
                max_replicas,
                "TooManyReplicas",
                "the desired replica count is more than the maximum replica count",
            )
        if desired > allowed:
            return RateLimited(allowed, True, reason, message)
    elif desired < current:
        limit = min(scale_down_limit(state, behavior.scale_down, current, now), current)
        if min_replicas < limit:
            allowed, reason, message = (
                limit,
                "ScaleDownLimit",
                "the desired replica count is decreasing faster than the maximum scale rate",
            )
        else:
            allowed, reason, message = (
                min_replicas,
                "TooFewReplicas",
                "the desired replica count is less than the minimum replica count",
            )
        if desired < allowed:
            return RateLimited(allowed, True, reason, message)
    return RateLimited(
        desired, False, "DesiredWithinRange", "the desired count is within the acceptable range"
    )


# --- without a behavior section: the HPA's older rules (``normalizeDesiredReplicas``) ----------

# horizontal.go's scaleUpLimitFactor and scaleUpLimitMinimum.
LEGACY_SCALE_UP_FACTOR = 2
LEGACY_SCALE_UP_MINIMUM = 4


def stabilize_legacy(state: ScalingState, window: float, desired: int, now: float) -> Stabilized:
    """``stabilizeRecommendation``: the highest recommendation of the scale-down window, the new
    one included. Unlike the behavior path it is not clamped to the current count, so a higher
    recommendation still in the window can raise the count; scale events are not kept."""
    cutoff = now - window
    state.recommendations = [r for r in state.recommendations if r.at >= cutoff]
    state.scale_up_events, state.scale_down_events = [], []
    highest = max([desired, *(r.replicas for r in state.recommendations)])
    state.recommendations.append(TimedRecommendation(desired, now))
    if highest != desired:
        return Stabilized(
            highest,
            "ScaleDownStabilized",
            "recent recommendations were higher than current one, "
            "applying the highest recent recommendation",
        )
    return Stabilized(highest, "ReadyForNewScale", "recommended size matches current size")


def limit_rate_legacy(
    min_replicas: int, max_replicas: int, current: int, desired: int
) -> RateLimited:
    """``convertDesiredReplicasWithRules``: at most max(2x current, 4) up, no limit down."""
    scale_up_limit = max(LEGACY_SCALE_UP_FACTOR * current, LEGACY_SCALE_UP_MINIMUM)
    if max_replicas > scale_up_limit:
        maximum, reason, message = (
            scale_up_limit,
            "ScaleUpLimit",
            "the desired replica count is increasing faster than the maximum scale rate",
        )
    else:
        maximum, reason, message = (
            max_replicas,
            "TooManyReplicas",
            "the desired replica count is more than the maximum replica count",
        )
    if desired < min_replicas:
        return RateLimited(
            min_replicas,
            True,
            "TooFewReplicas",
            "the desired replica count is less than the minimum replica count",
        )
    if desired > maximum:
        return RateLimited(maximum, True, reason, message)
    return RateLimited(
        desired, False, "DesiredWithinRange", "the desired count is within the acceptable range"
    )
