"""decide(): the HPA's reconcile rules plus the predictive candidate, over time."""

from __future__ import annotations

from autoscaler.core import MetricInput, PodSample, ScalingState, decide, record_scale
from autoscaler.spec import parse_spec


def make_spec(min_replicas=1, max_replicas=20, metrics=None, behavior=None):
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
        raw["behavior"] = behavior
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
    d = decide(
        spec, 4, [MetricInput(spec.metrics[0], value=30.0)], ScalingState(), 0.0, ready_pods=2
    )
    assert d.reactive_proposal == 6


def test_missing_input_for_a_metric_counts_as_invalid():
    spec = two_metric_spec()
    d = decide(spec, 3, [MetricInput(spec.metrics[0], pods=pods(1.0, 1.0, 1.0))], ScalingState(), 0)
    assert d.driver == "invalid_metrics_no_scale_down"
