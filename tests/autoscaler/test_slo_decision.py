"""decide() with spec.slo: the SLO's sized count as one more proposal, and the fallbacks.

No sockets and no clock: the sizing itself is autoscaler.core.slo_sizing's (tested on its own);
these tests check how the decision uses it.
"""

from __future__ import annotations

import pytest

from autoscaler.core import MetricInput, PodSample, ScalingState, decide
from autoscaler.core.decision import SloInput
from autoscaler.core.slo_sizing import ServiceModel, replicas_for_slo
from autoscaler.spec import SpecError, parse_spec

MODEL = ServiceModel(fixed_seconds=0.05, per_item_seconds=0.01, max_batch=8)  # 8 / 0.13 s


def slo_spec(metrics=None, behavior=None, latency=1.0, min_replicas=1, max_replicas=50, **slo):
    raw = {
        "scaleTargetRef": {"kind": "Deployment", "name": "llm"},
        "minReplicas": min_replicas,
        "maxReplicas": max_replicas,
        "slo": {"latencySeconds": latency, **slo},
        "behavior": {} if behavior is None else behavior,
    }
    if metrics is not None:
        raw["metrics"] = metrics
    return parse_spec(raw)


UTIL = [{"name": "q", "query": "q", "target": {"type": "AverageValue", "averageValue": 10}}]


def pods(*values):
    return tuple(PodSample(f"p{i}", v) for i, v in enumerate(values))


def sized(rate, spec):
    return replicas_for_slo(
        rate,
        spec.slo.latency_seconds,
        MODEL,
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        quantile=spec.slo.quantile,
    )


def rate_needing(replicas, spec):
    """The lowest whole-number rate the model sizes to ``replicas``."""
    rate = 1.0
    while sized(rate, spec).replicas < replicas:
        rate += 1.0
    assert sized(rate, spec).replicas == replicas
    return rate


def test_the_fleet_is_sized_for_the_slo_not_for_the_metrics():
    spec = slo_spec(metrics=UTIL)
    rate = rate_needing(6, spec)
    # the metric says 2 replicas are plenty (at target); the SLO needs 6 at this rate
    d = decide(
        spec,
        2,
        [MetricInput(spec.metrics[0], pods=pods(10.0, 10.0))],
        ScalingState(),
        0.0,
        slo=SloInput(rate=rate, service_model=MODEL),
    )
    assert d.desired_replicas == 6 and d.driver == "slo"
    assert d.reactive_proposal == 2  # the metric's answer is still reported
    assert d.slo.sizing == sized(rate, spec)
    assert d.reason == d.slo.sizing.reason and "6 replicas" in d.reason
    assert d.conditions["SizedForSLO"][:2] == (True, "SizedForSLO")
    # and when the metric would want more than the SLO needs, the SLO still decides
    d = decide(
        spec,
        6,
        [MetricInput(spec.metrics[0], pods=pods(*[100.0] * 6))],
        ScalingState(),
        0.0,
        slo=SloInput(rate=rate, service_model=MODEL),
    )
    assert d.reactive_proposal == 60 and d.desired_replicas == 6


def test_sized_for_the_larger_of_the_observed_rate_and_the_forecast():
    spec = slo_spec(prediction={"horizonSeconds": 300})
    low, high = rate_needing(3, spec), rate_needing(9, spec)
    for rate, upper in ((low, high), (high, low)):
        d = decide(spec, 3, [], ScalingState(), 0.0, slo=SloInput(rate, upper, MODEL))
        assert d.slo.sizing_rate == high
        assert d.slo.sizing.replicas == 9
        assert d.desired_replicas == 7  # the default scale-up policy: max(3 + 4, 2 * 3)


def test_the_tolerance_holds_back_a_small_change():
    spec = slo_spec()
    rate = rate_needing(11, spec)
    d = decide(spec, 10, [], ScalingState(), 0.0, slo=SloInput(rate=rate, service_model=MODEL))
    assert d.slo.sizing.replicas == 11
    assert d.slo.proposal == 10 and d.desired_replicas == 10  # 1.1x is within 0.1
    tight = slo_spec(behavior={"scaleUp": {"tolerance": 0}})
    d = decide(tight, 10, [], ScalingState(), 0.0, slo=SloInput(rate=rate, service_model=MODEL))
    assert d.desired_replicas == 11


def test_stabilization_holds_a_lower_slo_count():
    spec = slo_spec(behavior={"scaleDown": {"stabilizationWindowSeconds": 300}})
    state = ScalingState()
    busy, quiet = rate_needing(8, spec), rate_needing(2, spec)
    decide(spec, 8, [], state, 0.0, slo=SloInput(rate=busy, service_model=MODEL))
    d = decide(spec, 8, [], state, 60.0, slo=SloInput(rate=quiet, service_model=MODEL))
    assert d.slo.proposal == 2 and d.desired_replicas == 8 and d.driver == "stabilization"
    d = decide(spec, 8, [], state, 301.0, slo=SloInput(rate=quiet, service_model=MODEL))
    assert d.desired_replicas == 2


def test_an_slo_no_count_can_meet_is_a_condition_not_a_crash():
    # below the time of one batch of one: no replica count helps
    spec = slo_spec(latency=0.01, max_replicas=10)
    d = decide(spec, 3, [], ScalingState(), 0.0, slo=SloInput(rate=50.0, service_model=MODEL))
    assert d.conditions["SizedForSLO"][:2] == (False, "SLOOutOfReach")
    assert not d.slo.sizing.feasible
    # the count that comes closest is still proposed, through the policies as usual
    assert d.slo.proposal == d.slo.sizing.replicas > 3
    assert d.desired_replicas == 7 and d.driver == "policy:scale_up_limit"
    # more load than max_replicas can serve: the most replicas there are
    d = decide(spec, 10, [], ScalingState(), 0.0, slo=SloInput(rate=1e6, service_model=MODEL))
    assert d.conditions["SizedForSLO"][1] == "SLOOutOfReach"
    assert d.desired_replicas == 10 and "cannot keep up" in d.conditions["SizedForSLO"][2]


def test_a_best_effort_slice_is_reserved_out_of_the_slo():
    """With best-effort work on the batchers the fleet is sized for the SLO less one slice: more
    replicas at the same rate, and the status says what was sized for and why."""
    spec = slo_spec(latency=0.5, max_replicas=20)
    rate = rate_needing(4, spec)
    plain = decide(spec, 4, [], ScalingState(), 0.0, slo=SloInput(rate, service_model=MODEL))
    held = SloInput(rate, service_model=MODEL, best_effort_quantum_seconds=0.35)
    d = decide(spec, 4, [], ScalingState(), 0.0, slo=held)
    expected = replicas_for_slo(rate, 0.15, MODEL, min_replicas=1, max_replicas=20)
    assert d.slo.sizing.replicas == expected.replicas > plain.slo.sizing.replicas == 4
    assert d.slo.sizing.modelled_p99_seconds == expected.modelled_p99_seconds
    assert d.slo.sized_latency_seconds == pytest.approx(0.15)
    assert plain.slo.sized_latency_seconds == 0.5
    assert d.slo.best_effort_quantum_seconds == 0.35 and d.slo.latency_seconds == 0.5
    ok, reason, message = d.conditions["SizedForSLO"]
    assert (ok, reason) == (True, "SizedForSLO")
    assert "0.35 s of the 0.5 s SLO reserved for a best-effort slice" in message


def test_a_slice_as_long_as_the_slo_falls_back_to_the_hpa_rule():
    spec = slo_spec(metrics=UTIL, latency=0.5)
    metric = MetricInput(spec.metrics[0], pods=pods(30.0, 30.0))
    held = SloInput(40.0, service_model=MODEL, best_effort_quantum_seconds=0.5)
    d = decide(spec, 2, [metric], ScalingState(), 0.0, slo=held)
    assert d.desired_replicas == 6 and d.driver == "metric:q/reactive"
    ok, reason, message = d.conditions["SizedForSLO"]
    assert (ok, reason) == (False, "FallbackToHPARule")
    assert "shorten the quantum" in message


@pytest.mark.parametrize(
    ("slo_input", "why"),
    [
        (SloInput(rate=40.0), "no service model"),
        (SloInput(rate=40.0, error="service model: not fitted yet"), "not fitted yet"),
        (SloInput(error="request rate: prometheus unreachable"), "prometheus unreachable"),
        (None, "no SLO inputs were read"),
    ],
)
def test_missing_slo_inputs_fall_back_to_the_hpa_rule(slo_input, why):
    spec = slo_spec(metrics=UTIL)
    metric = MetricInput(spec.metrics[0], pods=pods(30.0, 30.0))
    d = decide(spec, 2, [metric], ScalingState(), 0.0, slo=slo_input)
    assert d.desired_replicas == 6 and d.driver == "metric:q/reactive"  # ceil(2 * 30/10)
    ok, reason, message = d.conditions["SizedForSLO"]
    assert (ok, reason) == (False, "FallbackToHPARule") and why in message
    assert d.slo.sizing is None and d.slo.error


def test_without_metrics_to_fall_back_on_nothing_changes():
    spec = slo_spec()
    d = decide(spec, 4, [], ScalingState(), 0.0, slo=SloInput(rate=10.0))
    assert d.desired_replicas == 4 and d.driver == "all_metrics_invalid"
    assert d.conditions["ScalingActive"][:2] == (False, "FailedGetSLOInputs")
    assert d.conditions["SizedForSLO"][1] == "FallbackToHPARule"


def test_slo_spec_defaults_and_validation():
    spec = slo_spec(selector='{namespace="ml"}')
    assert spec.metrics == ()
    assert spec.slo.quantile == 0.99
    assert spec.slo.rate_query == 'sum(rate(autoglm_batcher_requests_total{namespace="ml"}[1m]))'
    assert spec.slo.fixed_seconds_query == 'avg(autoglm_batcher_cost_fixed_seconds{namespace="ml"})'
    assert spec.slo.max_batch_query == 'min(autoglm_batcher_max_batch_size_items{namespace="ml"})'
    assert spec.slo.best_effort_quantum_query == (
        'max(autoglm_batcher_best_effort_quantum_seconds{namespace="ml"}) and on() '
        '(sum(rate(autoglm_batcher_class_busy_seconds_total{class="best_effort",namespace="ml"}'
        "[5m])) > 0)"
    )
    assert slo_spec().slo.best_effort_quantum_query == (
        "max(autoglm_batcher_best_effort_quantum_seconds) and on() "
        '(sum(rate(autoglm_batcher_class_busy_seconds_total{class="best_effort"}[5m])) > 0)'
    )
    own = slo_spec(serviceModel={"bestEffortQuantumQuery": "max(my_slice)"})
    assert own.slo.best_effort_quantum_query == "max(my_slice)"
    assert spec.slo.rate_metric.source == "External"
    for bad, where in [
        ({"latency": 0}, "spec.slo.latencySeconds"),
        ({"quantile": 1.0}, "spec.slo.quantile"),
        ({"selector": 'namespace="ml"'}, "spec.slo.selector"),
        ({"min_replicas": 0}, "spec.minReplicas"),
        ({"serviceModel": {"bogus": "x"}}, "spec.slo.serviceModel.bogus"),
        ({"metrics": [{**UTIL[0], "name": "request_rate"}]}, "spec.slo.rateName"),
    ]:
        with pytest.raises(SpecError, match=where):
            slo_spec(**bad)
