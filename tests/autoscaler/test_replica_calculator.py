"""Per-metric proposals, with cases worked out from Kubernetes' replica_calculator.go rules."""

from __future__ import annotations

import math

import pytest

from autoscaler.core.replica_calculator import (
    MetricUnavailable,
    PodSample,
    Tolerances,
    average_value_metric_replicas,
    group_pods,
    pods_metric_replicas,
    resource_utilization_replicas,
    value_metric_replicas,
)

NOW = 10_000.0
TOL = Tolerances(0.1, 0.1)


def running(
    name: str, value: float | None, ready: bool = True, age: float = 3600.0, gpus: float = 1.0
) -> PodSample:
    """A pod that started ``age`` seconds ago, became ready right after starting, and requests
    ``gpus`` GPUs in its one container."""
    return PodSample(
        name=name,
        value=value,
        ready=ready,
        started_at=NOW - age,
        ready_changed_at=NOW - age + 5,
        sampled_at=NOW - 10,
        window_seconds=30,
        containers={"server": {"nvidia.com/gpu": gpus}},
    )


def utilization(pods, current, target, tol=TOL):
    return resource_utilization_replicas(pods, current, target, "nvidia.com/gpu", tol, NOW)


def test_tolerance_is_separate_up_and_down():
    tol = Tolerances(up=0.2, down=0.05)
    assert tol.within(1.2) and not tol.within(1.21)
    assert tol.within(0.95) and not tol.within(0.94)


def test_average_value_scale_up_uses_ceil_of_ratio_times_ready_pods():
    pods = [running("a", 300.0), running("b", 500.0), running("c", 700.0)]
    p = pods_metric_replicas(pods, 3, 300.0, TOL, NOW)
    # average 500 / target 300 -> ratio 5/3 -> ceil(5/3 * 3) = 5
    assert p.replicas == 5
    assert p.usage == pytest.approx(500.0)


def test_within_tolerance_keeps_current_count():
    pods = [running("a", 105.0), running("b", 104.0), running("c", 108.0)]
    assert pods_metric_replicas(pods, 3, 100.0, TOL, NOW).replicas == 3
    # asymmetric tolerance: 0.95 is outside a 0.01 scale-down tolerance
    pods = [running("a", 95.0)] * 1
    tight = Tolerances(up=0.1, down=0.01)
    assert pods_metric_replicas(pods, 1, 100.0, tight, NOW).replicas == 1
    pods = [running(n, 45.0) for n in "abcd"]
    assert pods_metric_replicas(pods, 4, 50.0, tight, NOW).replicas == 4  # ceil(3.6)
    assert pods_metric_replicas(pods, 4, 50.0, TOL, NOW).replicas == 4  # within


def test_scale_down():
    pods = [running(n, 10.0) for n in "abcd"]
    assert pods_metric_replicas(pods, 4, 50.0, TOL, NOW).replicas == 1


def test_missing_pods_count_at_target_on_scale_down():
    # 4 pods, one without a sample; the others at 20 against 50 -> ratio 0.4 (scale down).
    pods = [running("a", 20.0), running("b", 20.0), running("c", 20.0), running("d", None)]
    p = pods_metric_replicas(pods, 4, 50.0, TOL, NOW)
    # missing pod assumed at the target: (20*3 + 50) / 4 = 27.5 -> ratio 0.55 -> ceil(0.55*4) = 3
    assert p.replicas == 3
    assert p.usage == pytest.approx(20.0)  # the status shows the measured average only


def test_missing_pods_count_at_max_100_or_target_for_utilization_scale_down():
    pods = [running("a", 10.0), running("b", 10.0), running("c", None)]
    p = utilization(pods, 3, 50.0)
    # missing at max(100, 50) = 100: (10+10+100)/3 = 40 -> ratio 0.8 -> ceil(2.4) = 3 = current
    assert p.replicas == 3


def test_missing_pods_count_at_zero_on_scale_up():
    pods = [running("a", 90.0), running("b", 90.0), running("c", None)]
    p = pods_metric_replicas(pods, 3, 50.0, TOL, NOW)
    # 90/50 = 1.8 up; missing at 0: 180/3 = 60 -> ratio 1.2 -> ceil(1.2 * 3) = 4
    assert p.replicas == 4


def test_missing_pods_can_cancel_a_scale_up_that_flips_direction():
    pods = [running("a", 60.0), running("b", None), running("c", None)]
    p = pods_metric_replicas(pods, 3, 50.0, TOL, NOW)
    # 1.2 up; with two missing at 0: 20 -> ratio 0.4: direction flips -> current
    assert p.replicas == 3


def test_pending_pods_count_at_zero_on_scale_up_only():
    pods = [
        running("a", 100.0),
        running("b", 100.0),
        PodSample("c", None, ready=False, phase="Pending"),
    ]
    p = pods_metric_replicas(pods, 3, 50.0, TOL, NOW)
    # ready average 100 -> ratio 2.0; pending at 0: 200/3 = 66.7 -> ratio 1.33 -> ceil(4.0) = 4
    assert p.replicas == 4
    # on a scale-down the pending pod is left out entirely: 10/50 over two pods -> 1
    pods = [
        running("a", 10.0),
        running("b", 10.0),
        PodSample("c", None, ready=False, phase="Pending"),
    ]
    assert pods_metric_replicas(pods, 3, 50.0, TOL, NOW).replicas == 1


def test_unready_pods_at_zero_can_cancel_scale_up():
    # utilization rules: "b" and "c" are unready; "a" alone at 60 vs 50 -> 1.2 up, but with the
    # unready ones at 0 the ratio is 0.4: the direction flips, so nothing changes.
    pods = [running("a", 60.0), running("b", 90.0, ready=False), running("c", 90.0, ready=False)]
    assert utilization(pods, 3, 50.0).replicas == 3


def test_unready_running_pods_count_as_ready_for_average_value_targets():
    # Custom metrics ignore readiness (only pending pods are unready), as in Kubernetes.
    pods = [running("a", 60.0), running("b", 90.0, ready=False), running("c", 90.0, ready=False)]
    assert pods_metric_replicas(pods, 3, 50.0, TOL, NOW).replicas == 5


def test_initialization_period_ignores_samples_from_before_readiness():
    started = NOW - 60  # within the 300 s initialization period
    fresh = PodSample(
        "n",
        95.0,
        ready=True,
        started_at=started,
        ready_changed_at=NOW - 20,
        sampled_at=NOW - 5,
        window_seconds=30,
    )
    settled = PodSample(
        "s",
        95.0,
        ready=True,
        started_at=started,
        ready_changed_at=NOW - 50,
        sampled_at=NOW - 5,
        window_seconds=30,
    )
    groups = group_pods([fresh, settled], NOW, readiness_rules=True)
    # fresh: its sample window (30 s) started before it turned ready 20 s ago -> unready
    assert groups.unready == {"n"} and groups.ready_count == 1


def test_after_initialization_unready_pod_that_was_never_ready_is_ignored():
    never = PodSample("x", 50.0, ready=False, started_at=NOW - 1000, ready_changed_at=NOW - 990)
    once = PodSample("y", 50.0, ready=False, started_at=NOW - 1000, ready_changed_at=NOW - 100)
    groups = group_pods([never, once], NOW, readiness_rules=True)
    # "never" went unready within the 30 s readiness delay of its start: never ready -> unready;
    # "once" became unready much later (it had been ready): its sample still counts.
    assert groups.unready == {"x"} and groups.ready_count == 1


def test_no_start_time_or_no_ready_condition_is_unready_for_utilization():
    assert group_pods([PodSample("a", 1.0, ready=None, started_at=0.0)], NOW, True).unready == {"a"}
    assert group_pods([PodSample("a", 1.0, ready=True)], NOW, True).unready == {"a"}


def test_deleting_and_failed_pods_are_ignored():
    pods = [
        running("a", 100.0),
        PodSample("b", 1000.0, deleting=True),
        PodSample("c", 1000.0, phase="Failed"),
    ]
    groups = group_pods(pods, NOW, readiness_rules=False)
    assert groups.ignored == {"b", "c"}
    # only "a" counts: 100/50 = 2 -> ceil(2 * 1) = 2
    assert pods_metric_replicas(pods, 3, 50.0, TOL, NOW).replicas == 2


def test_recomputed_count_moving_against_direction_keeps_current():
    # 2.0x up among 1 ready pod plus 1 missing -> new ratio 1.0... within tolerance -> current
    pods = [running("a", 100.0), running("b", None)]
    assert pods_metric_replicas(pods, 2, 50.0, TOL, NOW).replicas == 2
    # scale-down where missing pods raise the recomputed count above current -> current
    pods = [running("a", 10.0)] + [running(f"m{i}", None) for i in range(4)]
    assert pods_metric_replicas(pods, 2, 50.0, TOL, NOW).replicas == 2


def test_nan_sample_is_a_missing_sample():
    pods = [running("a", 90.0), running("b", 90.0), running("c", math.nan)]
    assert pods_metric_replicas(pods, 3, 50.0, TOL, NOW).replicas == 4


def test_no_pods_and_no_samples_are_errors():
    with pytest.raises(MetricUnavailable, match="no pods"):
        pods_metric_replicas([], 1, 50.0, TOL, NOW)
    with pytest.raises(MetricUnavailable, match="did not receive metrics"):
        pods_metric_replicas([running("a", None)], 1, 50.0, TOL, NOW)


def test_value_target_scales_ready_pods_and_wakes_from_zero():
    assert value_metric_replicas(500.0, 4, 100.0, TOL, 2).replicas == 10  # ceil(5 * 2 ready)
    assert value_metric_replicas(105.0, 4, 100.0, TOL, 2).replicas == 4  # within tolerance
    assert value_metric_replicas(250.0, 0, 100.0, TOL, 0).replicas == 3  # ceil(2.5) from zero
    assert value_metric_replicas(0.0, 0, 100.0, TOL, 0).replicas == 0
    assert value_metric_replicas(500.0, 4, 100.0, TOL, 0).replicas == 0  # no ready pods
    # the ready count is only needed outside the tolerance, and then it must be known
    assert value_metric_replicas(105.0, 4, 100.0, TOL, None).replicas == 4
    with pytest.raises(MetricUnavailable, match="ready pods"):
        value_metric_replicas(500.0, 4, 100.0, TOL, None)


def test_average_value_target_divides_total_by_target():
    p = average_value_metric_replicas(950.0, 3, 100.0, TOL)
    assert p.replicas == 10 and p.usage == pytest.approx(950.0 / 3)
    # 310 over 3 replicas at 100 each: ratio 1.033 within tolerance -> status replicas
    assert average_value_metric_replicas(310.0, 3, 100.0, TOL).replicas == 3
    assert average_value_metric_replicas(310.0, 0, 100.0, TOL).replicas == 4
