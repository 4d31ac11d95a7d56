"""decide(): the HPA's reconcile rules plus the predictive candidate, over time."""

from __future__ import annotations

from autoscaler.core import MetricInput, PodSample, ScalingState, decide, record_scale
from autoscaler.spec import parse_spec


def make_spec(min_replicas=1, max_replicas=20, metrics=None, behavior=...):
    """A spec with a behavior section (all defaults) unless ``behavior`` says otherwise; None
    leaves the section out (the HPA's legacy rules)."""
    raw = {
        "scaleTargetRef": {"kind": "Deployment", "name": "llm"},
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "metrics": metrics
        or [
            {
                "name": "util",
                "type": "Pods",
                "query": "q",
                "target": {"type": "AverageValue", "averageValue": 50},
                "prediction": {"horizonSeconds": 120, "warmupSeconds": 60},
            }
        ],
    }
    if behavior is not None:
        raw["behavior"] = {} if behavior is ... else behavior
    return parse_spec(raw)


def pods(*values):
    return tuple(PodSample(f"p{i}", v) for i, v in enumerate(values))


def util(spec, *values, forecast=None, error=None):
    return MetricInput(spec.metrics[0], pods=pods(*values), forecast_upper=forecast, error=error)


def test_first_recommendation_is_current_count_so_no_immediate_scale_down():
    spec = make_spec()
    state = ScalingState()
    d = decide(spec, 6, [util(spec, *[5.0] * 6)], state, 0.0)
    assert d.desired_replicas == 6 and d.driver == "stabilization"
    assert d.reactive_proposal == 1
    assert d.conditions["AbleToScale"][1] == "ScaleDownStabilized"


def test_scale_down_after_window_one_step_per_policy():
    spec = make_spec()
    state = ScalingState()
    t = 0.0
    for _ in range(20):  # 300 s of low load every 15 s
        d = decide(spec, 6, [util(spec, *[5.0] * 6)], state, t)
        assert d.desired_replicas == 6
        t += 15.0
    d = decide(spec, 6, [util(spec, *[5.0] * 6)], state, t)
    assert d.desired_replicas == 1 and d.driver == "metric:util/reactive"
    assert d.reason == "All metrics below target"


def test_scale_up_limited_by_policy_then_continues():
    spec = make_spec(max_replicas=100)
    state = ScalingState()
    d = decide(spec, 2, [util(spec, 500.0, 500.0)], state, 0.0)
    # 2 pods at 10x target want 20; default policy: max(2+4, 2*2) = 6
    assert d.reactive_proposal == 20 and d.desired_replicas == 6
    assert d.driver == "policy:scale_up_limit"
    assert d.conditions["ScalingLimited"] == (
        True,
        "ScaleUpLimit",
        "the desired replica count is increasing faster than the maximum scale rate",
    )
    record_scale(state, 0.0, 2, 6)
    d = decide(spec, 6, [util(spec, *[500.0 / 3] * 6)], state, 5.0)
    assert d.desired_replicas == 6  # still in the same 15 s period
    d = decide(spec, 6, [util(spec, *[500.0 / 3] * 6)], state, 15.0)
    assert d.desired_replicas == 12


def test_max_replicas_clamp_reports_too_many_replicas():
    spec = make_spec(max_replicas=4)
    d = decide(spec, 3, [util(spec, 100.0, 100.0, 100.0)], ScalingState(), 0.0)
    assert d.desired_replicas == 4 and d.driver == "max_replicas"
    assert d.conditions["ScalingLimited"][1] == "TooManyReplicas"


def test_current_outside_min_max_is_brought_back_without_metrics():
    spec = make_spec(min_replicas=2, max_replicas=5)
    assert decide(spec, 9, [], ScalingState(), 0.0).desired_replicas == 5
    d = decide(spec, 1, [], ScalingState(), 0.0)
    assert d.desired_replicas == 2 and d.driver == "min_replicas"


def test_scaled_to_zero_by_hand_is_left_alone():
    spec = make_spec()
    d = decide(spec, 0, [util(spec, 500.0)], ScalingState(), 0.0)
    assert d.desired_replicas == 0 and not d.rescale
    assert d.driver == "scaled_to_zero_by_hand"
    assert d.conditions["ScalingActive"][:2] == (False, "ScalingDisabled")


def two_metric_spec():
    return make_spec(
        metrics=[
            {"name": "a", "query": "qa", "target": {"type": "AverageValue", "averageValue": 10}},
            {
                "name": "b",
                "type": "External",
                "query": "qb",
                "target": {"type": "AverageValue", "averageValue": 100},
            },
        ]
    )


def test_maximum_over_metrics_wins():
    spec = two_metric_spec()
    a = MetricInput(spec.metrics[0], pods=pods(20.0, 20.0))  # wants 4
    b = MetricInput(spec.metrics[1], value=700.0)  # wants 7
    d = decide(spec, 2, [a, b], ScalingState(), 0.0)
    assert d.desired_replicas == 6  # 7 limited by max(2+4, 4) = 6
    assert [m.reactive for m in d.per_metric] == [4, 7]
    assert d.reason == "metric:b/reactive above target"


def test_invalid_metric_blocks_scale_down_but_not_scale_up():
    spec = two_metric_spec()
    broken = MetricInput(spec.metrics[1], error="prometheus unreachable")
    low = MetricInput(spec.metrics[0], pods=pods(1.0, 1.0, 1.0))
    state = ScalingState()
    d = decide(spec, 3, [low, broken], state, 1000.0)
    assert d.desired_replicas == 3 and d.driver == "invalid_metrics_no_scale_down"
    assert d.conditions["ScalingActive"][:2] == (False, "FailedGetExternalMetric")
    high = MetricInput(spec.metrics[0], pods=pods(20.0, 20.0, 20.0))
    d = decide(spec, 3, [high, broken], state, 1015.0)
    assert d.desired_replicas == 6 and d.conditions["ScalingActive"][0] is True


def test_all_metrics_invalid_changes_nothing_and_records_no_recommendation():
    spec = two_metric_spec()
    state = ScalingState()
    bad = [MetricInput(m, error="NaN") for m in spec.metrics]
    d = decide(spec, 3, bad, state, 0.0)
    assert d.desired_replicas == 3 and d.driver == "all_metrics_invalid"
    assert [r.replicas for r in state.recommendations] == [3]  # only the initial one


def test_nan_external_value_is_invalid():
    spec = two_metric_spec()
    d = decide(
        spec,
        3,
        [
            MetricInput(spec.metrics[0], pods=pods(1.0, 1.0, 1.0)),
            MetricInput(spec.metrics[1], value=float("nan")),
        ],
        ScalingState(),
        0.0,
    )
    assert d.driver == "invalid_metrics_no_scale_down"


def test_predictive_candidate_scales_up_before_the_load_arrives():
    spec = make_spec()
    state = ScalingState()
    # now at target (50 per pod on 2 pods) but the forecast's upper bound is 150 per pod
    d = decide(spec, 2, [util(spec, 50.0, 50.0, forecast=150.0)], state, 0.0)
    assert d.reactive_proposal == 2 and d.predictive_proposal == 6
    assert d.desired_replicas == 6 and d.driver == "metric:util/predictive"


def test_predictive_candidate_never_lowers_the_reactive_proposal():
    spec = make_spec()
    d = decide(spec, 2, [util(spec, 150.0, 150.0, forecast=10.0)], ScalingState(), 0.0)
    assert d.predictive_proposal == 1 and d.desired_replicas == 6
    assert d.driver == "metric:util/reactive"


def test_predictive_low_forecast_cannot_bypass_scale_down_stabilization():
    spec = make_spec()
    state = ScalingState()
    decide(spec, 4, [util(spec, 50.0, 50.0, 50.0, 50.0)], state, 0.0)
    d = decide(spec, 4, [util(spec, 10.0, 10.0, 10.0, 10.0, forecast=1.0)], state, 15.0)
    assert d.desired_replicas == 4 and d.driver == "stabilization"


def test_forecast_ignored_when_prediction_disabled_or_missing():
    spec = make_spec(
        metrics=[
            {
                "name": "util",
                "query": "q",
                "target": {"type": "AverageValue", "averageValue": 50},
                "prediction": {"enabled": False},
            }
        ]
    )
    d = decide(spec, 2, [util(spec, 50.0, 50.0, forecast=500.0)], ScalingState(), 0.0)
    assert d.predictive_proposal is None and d.desired_replicas == 2
    spec = make_spec()
    d = decide(spec, 2, [util(spec, 50.0, 50.0, forecast=None)], ScalingState(), 0.0)
    assert d.predictive_proposal is None and d.driver == "metric:util/reactive"


def test_object_value_metric_uses_ready_pods_and_scale_from_zero():
    spec = make_spec(
        min_replicas=0,
        metrics=[
            {
                "name": "queue",
                "type": "Object",
                "query": "q",
                "target": {"type": "Value", "value": 10},
            }
        ],
    )
    d = decide(spec, 0, [MetricInput(spec.metrics[0], value=35.0)], ScalingState(), 0.0)
    assert d.reactive_proposal == 4 and d.desired_replicas == 4
    # four pods, of which two are Running and Ready: the ratio scales those two
    listed = (
        PodSample("a", None),
        PodSample("b", None),
        PodSample("c", None, ready=False),
        PodSample("d", None, phase="Pending"),
    )
    d = decide(
        spec, 4, [MetricInput(spec.metrics[0], value=30.0)], ScalingState(), 0.0, pods=listed
    )
    assert d.reactive_proposal == 6
    # without the pod list the ratio has nothing to multiply: the metric is invalid
    d = decide(spec, 4, [MetricInput(spec.metrics[0], value=30.0)], ScalingState(), 0.0)
    assert d.driver == "all_metrics_invalid"
    assert d.conditions["ScalingActive"][1] == "FailedGetObjectMetric"


def test_missing_input_for_a_metric_counts_as_invalid():
    spec = two_metric_spec()
    d = decide(spec, 3, [MetricInput(spec.metrics[0], pods=pods(1.0, 1.0, 1.0))], ScalingState(), 0)
    assert d.driver == "invalid_metrics_no_scale_down"


def gpu_pods(*pairs):
    """Pods given as (percent of request, GPUs requested)."""
    return tuple(
        PodSample(f"g{i}", pct, started_at=-1000.0, containers={"server": {"nvidia.com/gpu": gpus}})
        for i, (pct, gpus) in enumerate(pairs)
    )


def utilization_spec(**behavior):
    return make_spec(
        metrics=[
            {
                "name": "gpu",
                "query": "q",
                "target": {"type": "Utilization", "averageUtilization": 50},
            }
        ],
        **behavior,
    )


def test_utilization_is_summed_usage_over_summed_requests():
    spec = utilization_spec()
    # a 4-GPU pod at 90% and a 1-GPU pod at 10%: 3.7 GPUs busy of 5 = 74%, not the mean 50%
    d = decide(
        spec,
        2,
        [MetricInput(spec.metrics[0], pods=gpu_pods((90, 4), (10, 1)))],
        ScalingState(),
        0.0,
    )
    assert d.per_metric[0].usage == 74
    assert d.reactive_proposal == 3  # ceil(2 * 74/50)


def test_a_pod_without_the_request_makes_a_utilization_metric_invalid():
    spec = utilization_spec()
    pods = (*gpu_pods((90, 1)), PodSample("cpu-only", 90.0, containers={"server": {}}))
    d = decide(spec, 2, [MetricInput(spec.metrics[0], pods=pods)], ScalingState(), 0.0)
    assert d.driver == "all_metrics_invalid"
    assert d.conditions["ScalingActive"][1] == "FailedGetResourceMetric"
    assert "missing request for nvidia.com/gpu in container server of Pod cpu-only" in d.reason


def test_asymmetric_tolerances_from_the_spec_reach_the_decision():
    spec = make_spec(behavior={"scaleUp": {"tolerance": 2.0}, "scaleDown": {"tolerance": 0.01}})
    # 1.9x is inside the 200% scale-up tolerance; 0.95x is outside the 1% scale-down one
    assert decide(spec, 2, [util(spec, 95.0, 95.0)], ScalingState(), 0.0).reactive_proposal == 2
    assert decide(spec, 4, [util(spec, *[47.5] * 4)], ScalingState(), 0.0).reactive_proposal == 4
    spec = make_spec(behavior={"scaleDown": {"tolerance": 0.01}})
    d = decide(spec, 20, [util(spec, *[47.5] * 20)], ScalingState(), 0.0)
    assert d.reactive_proposal == 19  # ceil(20 * 0.95)
    spec = make_spec(behavior={"scaleUp": {"tolerance": 0.01}})
    d = decide(spec, 20, [util(spec, *[52.5] * 20)], ScalingState(), 0.0)
    assert d.reactive_proposal == 21  # ceil(20 * 1.05)


def test_proposals_are_capped_at_int32():
    spec = make_spec(
        max_replicas=2**31 - 1,
        metrics=[
            {
                "name": "qps",
                "type": "External",
                "query": "q",
                "target": {"type": "AverageValue", "averageValue": "1m"},
            }
        ],
    )
    d = decide(spec, 3, [MetricInput(spec.metrics[0], value=1e300)], ScalingState(), 0.0)
    assert d.reactive_proposal == 2**31 - 1


def test_without_a_behavior_section_the_legacy_hpa_rules_apply():
    """No behavior: at most max(2x, 4) up per decision and no period bookkeeping; an empty
    section gets the API defaults: max(+4 pods, 2x) per 15 s."""
    legacy, defaulted = make_spec(behavior=None), make_spec()
    assert legacy.behavior is None and defaulted.behavior is not None
    up = [util(legacy, 500.0)]
    assert decide(legacy, 1, up, ScalingState(), 0.0).desired_replicas == 4
    assert decide(defaulted, 1, [util(defaulted, 500.0)], ScalingState(), 0.0).desired_replicas == 5
    # legacy stabilization is not clamped to the current count: a higher recommendation still
    # in the 300 s window raises it (after, say, a manual scale-down to 2), within max(2x, 4)
    state = ScalingState()
    decide(legacy, 6, [util(legacy, *[50.0] * 6)], state, 0.0)
    d = decide(legacy, 2, [util(legacy, 50.0, 50.0)], state, 60.0)
    assert (d.reactive_proposal, d.desired_replicas) == (2, 4)
    assert d.conditions["AbleToScale"][1] == "ScaleDownStabilized"
    state = ScalingState()
    decide(defaulted, 6, [util(defaulted, *[50.0] * 6)], state, 0.0)
    assert decide(defaulted, 2, [util(defaulted, 50.0, 50.0)], state, 60.0).desired_replicas == 2


def test_the_scale_down_window_comes_from_the_flag_unless_the_spec_sets_it():
    spec = make_spec(
        behavior={"scaleDown": {"policies": [{"type": "Pods", "value": 10, "periodSeconds": 15}]}}
    )
    assert spec.behavior.scale_down.stabilization_window_seconds is None
    for window, expected in ((60.0, 1), (300.0, 6)):
        state = ScalingState()
        decide(spec, 6, [util(spec, *[50.0] * 6)], state, 0.0, downscale_stabilization=window)
        d = decide(spec, 6, [util(spec, *[5.0] * 6)], state, 61.0, downscale_stabilization=window)
        assert d.desired_replicas == expected


def test_no_recommendation_yet_differs_from_a_recommendation_of_zero():
    spec = make_spec(
        min_replicas=0,
        metrics=[
            {
                "name": "q",
                "type": "External",
                "query": "q",
                "target": {"type": "AverageValue", "averageValue": 10},
            }
        ],
    )
    zero = MetricInput(spec.metrics[0], value=0.0)
    # a fresh state records the current count first, so the first decision cannot scale down
    assert decide(spec, 3, [zero], ScalingState(), 0.0).desired_replicas == 3
    # a state whose window holds only a recommendation of 0 lets the count follow it
    state = ScalingState.from_dict({"seeded": True, "recommendations": [[0, -10.0]]})
    assert decide(spec, 3, [zero], state, 0.0).desired_replicas == 0
    # once everything aged out, the state stays seeded: nothing re-records the current count
    state = ScalingState()
    decide(spec, 3, [MetricInput(spec.metrics[0], value=30.0)], state, 0.0)
    assert decide(spec, 3, [zero], state, 1000.0).desired_replicas == 0
    assert ScalingState.from_dict(state.to_dict()) == state
