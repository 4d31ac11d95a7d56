"""Stabilization windows and scaling policies over time, driven by a fake clock."""

from __future__ import annotations

from autoscaler.core.behavior import (
    ScalingState,
    limit_rate,
    record_scale,
    scale_down_limit,
    scale_up_limit,
    stabilize,
    with_downscale_window,
)
from autoscaler.spec import (
    Behavior,
    HPAScalingPolicy,
    HPAScalingRules,
    default_behavior,
    default_scale_down_rules,
    default_scale_up_rules,
)


def rules(select="Max", window=0, *policies):
    return HPAScalingRules(window, select, tuple(HPAScalingPolicy(*p) for p in policies))


def test_default_scale_up_is_max_of_4_pods_and_100_percent_per_15s():
    state = ScalingState()
    up = default_scale_up_rules()
    assert scale_up_limit(state, up, 1, 0.0) == 5  # 1 + 4 pods beats 2x
    assert scale_up_limit(state, up, 10, 0.0) == 20  # 100% beats +4


def test_scale_up_counts_from_the_start_of_the_period():
    state = ScalingState()
    up = default_scale_up_rules()
    record_scale(state, 0.0, 10, 20)
    # 5 s later the period started at 10 replicas: at most 20 for now
    assert scale_up_limit(state, up, 20, 5.0) == 20
    # once 15 s have passed the event leaves the period: 100% of 20
    assert scale_up_limit(state, up, 20, 15.0) == 40


def test_select_policy_min_and_disabled():
    state = ScalingState()
    both = (("Pods", 4, 60), ("Percent", 100, 60))
    assert scale_up_limit(state, rules("Min", 0, *both), 10, 0.0) == 14
    assert scale_up_limit(state, rules("Disabled", 0, *both), 10, 0.0) == 10
    down = (("Pods", 2, 60), ("Percent", 50, 60))
    assert scale_down_limit(state, rules("Max", 0, *down), 10, 0.0) == 5  # biggest change
    assert scale_down_limit(state, rules("Min", 0, *down), 10, 0.0) == 8  # smallest change
    assert scale_down_limit(state, rules("Disabled", 0, *down), 10, 0.0) == 10


def test_percent_scale_up_rounds_up_and_scale_down_truncates():
    state = ScalingState()
    assert scale_up_limit(state, rules("Max", 0, ("Percent", 10, 60)), 3, 0.0) == 4
    assert scale_down_limit(state, rules("Max", 0, ("Percent", 10, 60)), 3, 0.0) == 2


def test_scale_down_policy_counts_earlier_scale_downs_in_the_period():
    state = ScalingState()
    down = rules("Max", 0, ("Pods", 1, 60))
    record_scale(state, 0.0, 10, 9)
    assert scale_down_limit(state, down, 9, 30.0) == 9  # the period already used its one pod
    assert scale_down_limit(state, down, 9, 61.0) == 8


def test_scale_ups_in_the_period_count_against_scale_down_start():
    state = ScalingState()
    down = rules("Max", 0, ("Percent", 50, 60))
    record_scale(state, 0.0, 4, 8)
    # period started at 8 - 4 = 4 replicas: 50% of 4 = 2
    assert scale_down_limit(state, down, 8, 10.0) == 2


def test_stabilization_window_holds_scale_down_at_highest_recent_recommendation():
    behavior = with_downscale_window(default_behavior(), 300)  # the controller's flag
    state = ScalingState()
    assert stabilize(state, behavior, 10, 10, 0.0).replicas == 10
    assert stabilize(state, behavior, 10, 8, 60.0).replicas == 10
    s = stabilize(state, behavior, 10, 4, 120.0)
    assert s.replicas == 10 and s.reason == "ScaleDownStabilized"
    # at 301 s the first recommendation (10) left the window; the highest left is 8
    assert stabilize(state, behavior, 10, 4, 301.0).replicas == 8
    assert stabilize(state, behavior, 10, 4, 361.0).replicas == 4


def test_scale_up_window_takes_lowest_recent_recommendation():
    behavior = Behavior(
        scale_up=rules("Max", 60, ("Pods", 100, 15)), scale_down=default_scale_down_rules()
    )
    state = ScalingState()
    stabilize(state, behavior, 2, 2, 0.0)
    s = stabilize(state, behavior, 2, 9, 30.0)
    assert s.replicas == 2 and s.reason == "ScaleUpStabilized"
    assert stabilize(state, behavior, 2, 9, 61.0).replicas == 9


def test_stabilization_never_moves_against_the_current_count():
    state = ScalingState()
    behavior = default_behavior()
    stabilize(state, behavior, 5, 10, 0.0)
    # a recent 10 does not push a count of 5 with desire 5 upward
    assert stabilize(state, behavior, 5, 5, 10.0).replicas == 5


def test_limit_rate_reasons():
    state = ScalingState()
    b = default_behavior()
    r = limit_rate(state, b, 1, 100, 2, 50, 0.0)
    assert (r.replicas, r.limited, r.reason) == (6, True, "ScaleUpLimit")
    r = limit_rate(state, b, 1, 5, 4, 50, 0.0)
    assert (r.replicas, r.limited, r.reason) == (5, True, "TooManyReplicas")
    r = limit_rate(state, b, 3, 10, 8, 1, 0.0)
    assert (r.replicas, r.limited, r.reason) == (3, True, "TooFewReplicas")
    slow = Behavior(default_scale_up_rules(), rules("Max", 0, ("Pods", 1, 60)))
    r = limit_rate(state, slow, 1, 10, 8, 2, 0.0)
    assert (r.replicas, r.limited, r.reason) == (7, True, "ScaleDownLimit")
    r = limit_rate(state, b, 1, 10, 4, 6, 0.0)
    assert (r.replicas, r.limited, r.reason) == (6, False, "DesiredWithinRange")


def test_scale_up_limit_below_current_does_not_scale_down():
    state = ScalingState()
    b = Behavior(rules("Max", 0, ("Pods", 1, 60)), default_scale_down_rules())
    record_scale(state, 0.0, 1, 5)  # the period started at 1: limit is 2, below current 5
    r = limit_rate(state, b, 1, 10, 5, 8, 10.0)
    assert r.replicas == 5 and r.reason == "ScaleUpLimit"


def test_state_round_trips_through_a_dict():
    state = ScalingState()
    stabilize(state, default_behavior(), 3, 4, 1.0)
    record_scale(state, 1.0, 3, 4)
    record_scale(state, 2.0, 4, 2)
    again = ScalingState.from_dict(state.to_dict())
    assert again == state
