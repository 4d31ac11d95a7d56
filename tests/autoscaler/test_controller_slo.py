"""SLO sizing end to end: real kubernetes client -> fake API server, a fake Prometheus serving
the batcher's service model and request rate, the real decision core and SLO model."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from autoscaler.controller.forecasts import ProviderForecasts
from autoscaler.controller.service_model import PrometheusServiceModels
from autoscaler.core.slo_objective import sizing_quantile_for_objective
from autoscaler.core.slo_sizing import ServiceModel, replicas_for_slo
from tests.autoscaler.test_controller import (
    NS,
    T0,
    UTIL,
    Harness,
    StubPredictor,
    autoscaler_object,
    scale_writes,
)
from tests.live import free_port

SELECTOR = '{namespace="ml"}'
RATE = f"sum(rate(autoglm_batcher_requests_total{SELECTOR}[1m]))"
FIXED = f"avg(autoglm_batcher_cost_fixed_seconds{SELECTOR})"
PER_ITEM = f"avg(autoglm_batcher_cost_per_item_seconds{SELECTOR})"
MAX_BATCH = f"min(autoglm_batcher_max_batch_size_items{SELECTOR})"
SPREAD = f"max(autoglm_batcher_service_time_scv{SELECTOR})"
BEST_EFFORT_SLICE = (
    f"max(autoglm_batcher_best_effort_quantum_seconds{SELECTOR}) and on() "
    '(sum(rate(autoglm_batcher_class_busy_seconds_total{class="best_effort",namespace="ml"}'
    "[5m])) > 0)"
)
MODEL = ServiceModel(fixed_seconds=0.05, per_item_seconds=0.01, max_batch=8)
FALLBACK = [
    {
        "name": "gpu_util",
        "type": "Pods",
        "query": UTIL,
        "target": {"type": "Utilization", "averageUtilization": 70},
    }
]


def slo_object(latency=1.0, **slo):
    return autoscaler_object(
        metrics=FALLBACK,
        behavior={},
        slo={"latencySeconds": latency, "selector": SELECTOR, **slo},
    )


def serve_model(h: Harness, model: ServiceModel) -> None:
    h.prom.answers[FIXED] = [({}, model.fixed_seconds)]
    h.prom.answers[PER_ITEM] = [({}, model.per_item_seconds)]
    h.prom.answers[MAX_BATCH] = [({}, model.max_batch)]


def rate_needing(replicas: int, latency: float = 1.0) -> float:
    rate = 1.0
    while (
        replicas_for_slo(rate, latency, MODEL, min_replicas=1, max_replicas=10).replicas < replicas
    ):
        rate += 1.0
    return rate


def mode(h: Harness) -> str:
    (active,) = [
        m
        for m in ("slo", "hpa_fallback", "hpa")
        if h.sample("autoglm_autoscaler_sizing_mode", namespace=NS, autoscaler="llm", mode=m) == 1
    ]
    return active


@pytest.fixture
def h():
    harness = Harness()
    harness.reconciler.service_models = PrometheusServiceModels(harness.client)
    yield harness
    harness.close()


def test_the_fleet_is_sized_for_the_slo_and_says_why(h):
    h.deployment("llm", 2, [70.0, 70.0])  # at the utilization target: the HPA rule keeps 2
    serve_model(h, MODEL)
    rate = rate_needing(5)
    h.prom.answers[RATE] = [({}, rate)]
    h.fake.add_custom("gpuautoscalers", slo_object())

    h.controller.reconcile_all()

    sizing = replicas_for_slo(rate, 1.0, MODEL, min_replicas=1, max_replicas=10)
    assert h.fake.replicas(NS, "llm") == sizing.replicas == 5
    status = h.status()
    assert status["lastDecision"]["driver"] == "slo"
    assert status["lastDecision"]["reason"] == sizing.reason
    assert status["lastDecision"]["reactiveProposal"] == 2
    slo = status["slo"]
    assert slo["mode"] == "slo"
    assert slo["modelledP99Seconds"] == pytest.approx(sizing.modelled_p99_seconds)
    assert slo["serviceModel"] == {
        "fixedSeconds": 0.05,
        "perItemSeconds": 0.01,
        "maxBatch": 8,
        "serviceScv": 0.0,  # no batcher exports a spread here: taken as deterministic
    }
    assert (slo["rate"], slo["sizingRate"], slo["sizedReplicas"]) == (rate, rate, 5)
    assert slo["sizedLatencySeconds"] == 1.0  # no best-effort work: nothing reserved
    assert slo["feasible"] is True and "5 replicas" in slo["reason"]
    assert h.condition("SizedForSLO")["status"] == "True"

    labels = {"namespace": NS, "autoscaler": "llm"}
    assert h.sample("autoglm_autoscaler_modelled_p99_seconds", **labels) == pytest.approx(
        sizing.modelled_p99_seconds
    )
    assert h.sample("autoglm_autoscaler_slo_seconds", **labels) == 1.0
    assert h.sample("autoglm_autoscaler_slo_proposal_replicas", **labels) == 5
    assert h.sample("autoglm_autoscaler_slo_sizing_rate_requests_per_second", **labels) == rate
    assert h.sample("autoglm_autoscaler_slo_best_effort_reserve_seconds", **labels) == 0.0
    assert mode(h) == "slo"
    assert h.sample("autoglm_autoscaler_condition", condition="SizedForSLO", **labels) == 1


def test_the_batchers_measured_spread_sizes_for_the_slowest_requests(h):
    """Requests whose service varies (the batchers export scv 0.5: mixed sizes, jitter) need
    more replicas than the mean alone says; the widest spread of several batchers is used."""
    h.deployment("llm", 2, [70.0, 70.0])
    serve_model(h, MODEL)
    h.prom.answers[SPREAD] = [({"pod": "a"}, 0.1), ({"pod": "b"}, 0.5)]
    rate = 100.0
    h.prom.answers[RATE] = [({}, rate)]
    h.fake.add_custom("gpuautoscalers", slo_object(latency=0.4))

    h.controller.reconcile_all()

    spread = replace(MODEL, service_scv=0.5)
    sizing = replicas_for_slo(rate, 0.4, spread, min_replicas=1, max_replicas=10)
    plain = replicas_for_slo(rate, 0.4, MODEL, min_replicas=1, max_replicas=10)
    assert sizing.replicas > plain.replicas and sizing.feasible
    assert h.fake.replicas(NS, "llm") == sizing.replicas
    slo = h.status()["slo"]
    assert slo["serviceModel"]["serviceScv"] == 0.5
    assert slo["modelledP99Seconds"] == pytest.approx(sizing.modelled_p99_seconds)


def test_a_spread_that_is_not_a_number_falls_back_to_the_hpa_rule(h):
    h.deployment("llm", 2, [140.0, 140.0])
    serve_model(h, MODEL)
    h.prom.answers[SPREAD] = [({}, "NaN")]
    h.prom.answers[RATE] = [({}, rate_needing(3))]
    h.fake.add_custom("gpuautoscalers", slo_object())

    h.controller.reconcile_all()

    cond = h.condition("SizedForSLO")
    assert (cond["status"], cond["reason"]) == ("False", "FallbackToHPARule")
    assert "autoglm_batcher_service_time_scv" in cond["message"]
    assert h.fake.replicas(NS, "llm") == 4  # the utilization rule: ceil(2 * 140/70)


def test_best_effort_work_on_the_batchers_reserves_its_slice_out_of_the_slo(h):
    """While best-effort work runs, an online request may wait one slice for its replica: the
    fleet is sized for the SLO less the longest slice any batcher runs, and status says so."""
    h.deployment("llm", 4, [70.0] * 4)
    serve_model(h, MODEL)
    h.prom.answers[BEST_EFFORT_SLICE] = [({"pod": "a"}, 0.2), ({"pod": "b"}, 0.35)]
    rate = rate_needing(4, latency=0.5)
    h.prom.answers[RATE] = [({}, rate)]
    h.fake.add_custom("gpuautoscalers", slo_object(latency=0.5))

    h.controller.reconcile_all()

    sizing = replicas_for_slo(rate, 0.15, MODEL, min_replicas=1, max_replicas=10)
    assert sizing.replicas == 7  # 4 for the whole SLO
    assert h.fake.replicas(NS, "llm") == 7
    slo = h.status()["slo"]
    assert slo["serviceModel"]["bestEffortQuantumSeconds"] == 0.35
    assert (slo["latencySeconds"], slo["sizedLatencySeconds"]) == (0.5, pytest.approx(0.15))
    assert slo["modelledP99Seconds"] == pytest.approx(sizing.modelled_p99_seconds)
    assert "0.35 s of the 0.5 s SLO reserved for a best-effort slice" in slo["reason"]
    assert h.condition("SizedForSLO")["status"] == "True"
    reserve = h.sample(
        "autoglm_autoscaler_slo_best_effort_reserve_seconds", namespace=NS, autoscaler="llm"
    )
    assert reserve == pytest.approx(0.35)


def test_a_best_effort_slice_that_is_not_a_number_falls_back_to_the_hpa_rule(h):
    h.deployment("llm", 2, [140.0, 140.0])
    serve_model(h, MODEL)
    h.prom.answers[BEST_EFFORT_SLICE] = [({}, "NaN")]
    h.prom.answers[RATE] = [({}, rate_needing(3))]
    h.fake.add_custom("gpuautoscalers", slo_object())

    h.controller.reconcile_all()

    cond = h.condition("SizedForSLO")
    assert (cond["status"], cond["reason"]) == ("False", "FallbackToHPARule")
    assert "autoglm_batcher_best_effort_quantum_seconds" in cond["message"]
    assert h.fake.replicas(NS, "llm") == 4  # the utilization rule: ceil(2 * 140/70)
    assert h.status()["slo"]["mode"] == "hpa_fallback"
    reserve = h.sample(
        "autoglm_autoscaler_slo_best_effort_reserve_seconds", namespace=NS, autoscaler="llm"
    )
    assert math.isnan(reserve)  # not sized: nothing is known to be reserved


def test_the_forecast_sizes_the_fleet_before_the_load_arrives(h):
    h.deployment("llm", 2, [70.0, 70.0])
    serve_model(h, MODEL)
    h.prom.answers[RATE] = [({}, rate_needing(2))]
    upper = rate_needing(6)
    h.fake.add_custom(
        "gpuautoscalers", slo_object(prediction={"horizonSeconds": 60, "warmupSeconds": 180})
    )
    predictor = StubPredictor(upper=upper, issued_at=T0 - 30)
    h.reconciler.forecasts = ProviderForecasts(predictor, clock=h.clock)

    h.controller.reconcile_all()

    assert predictor.asked == [("request_rate", 180.0, 0.9)]
    assert h.fake.replicas(NS, "llm") == 6
    assert h.status()["slo"]["sizingRate"] == upper


def test_no_service_model_yet_falls_back_to_the_hpa_rule_until_there_is_one(h):
    h.deployment("llm", 2, [140.0, 140.0])
    serve_model(h, MODEL)
    h.prom.answers[FIXED] = [({}, 0.0)]  # a fresh batcher has not fitted its cost yet
    h.prom.answers[PER_ITEM] = [({}, 0.0)]
    h.prom.answers[RATE] = [({}, rate_needing(3))]
    h.fake.add_custom("gpuautoscalers", slo_object())

    h.controller.reconcile_all()

    assert h.fake.replicas(NS, "llm") == 4  # the utilization rule: ceil(2 * 140/70)
    cond = h.condition("SizedForSLO")
    assert (cond["status"], cond["reason"]) == ("False", "FallbackToHPARule")
    assert "not fitted" in cond["message"]
    assert h.status()["slo"]["mode"] == "hpa_fallback"
    assert "serviceModel" not in h.status()["slo"]
    assert mode(h) == "hpa_fallback"
    labels = {"namespace": NS, "autoscaler": "llm"}
    assert h.sample("autoglm_autoscaler_errors_total", kind="service_model_unfitted", **labels) == 1
    warnings = [e["reason"] for e in h.fake.events(NS) if e["type"] == "Warning"]
    assert warnings == ["FallbackToHPARule"]

    # the batcher fits its cost: from the next reconcile the SLO sizes the fleet
    serve_model(h, MODEL)
    for i in range(2, 4):
        h.fake.add_pod(NS, f"llm-{i}", {"app": "llm"})
    h.prom.set_pods(UTIL, {f"llm-{i}": 70.0 for i in range(4)})
    h.prom.answers[RATE] = [({}, rate_needing(6))]
    h.clock.now += 15
    h.controller.reconcile_all()
    assert h.fake.replicas(NS, "llm") == 6
    assert h.condition("SizedForSLO")["status"] == "True"
    assert h.status()["slo"]["serviceModel"]["maxBatch"] == 8
    assert mode(h) == "slo"


def test_prometheus_down_falls_back_and_never_scales_down():
    h = Harness(prom_url=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    h.reconciler.service_models = PrometheusServiceModels(h.client)
    try:
        h.deployment("llm", 4, [10.0] * 4)
        h.fake.add_custom("gpuautoscalers", slo_object())
        for _ in range(2):
            h.controller.reconcile_all()
            h.clock.now += 60
        assert h.fake.replicas(NS, "llm") == 4
        assert not scale_writes(h.fake)
        cond = h.condition("SizedForSLO")
        assert cond["reason"] == "FallbackToHPARule" and "unreachable" in cond["message"]
        assert h.condition("ScalingActive")["status"] == "False"
    finally:
        h.close()


def test_an_slo_no_replica_count_can_meet_is_a_condition_and_an_event(h):
    h.deployment("llm", 2, [70.0, 70.0])
    serve_model(h, MODEL)
    h.prom.answers[RATE] = [({}, 50.0)]
    h.fake.add_custom("gpuautoscalers", slo_object(latency=0.01))  # below one batch's time

    h.controller.reconcile_all()
    h.clock.now += 15
    h.controller.reconcile_all()

    cond = h.condition("SizedForSLO")
    assert (cond["status"], cond["reason"]) == ("False", "SLOOutOfReach")
    assert "out of reach" in cond["message"]
    assert [e["reason"] for e in h.fake.events(NS) if e["type"] == "Warning"] == ["SLOOutOfReach"]
    status = h.status()
    assert status["slo"]["feasible"] is False
    assert h.fake.replicas(NS, "llm") == status["slo"]["sizedReplicas"] > 2


def test_removing_the_slo_removes_its_status_and_condition(h):
    h.deployment("llm", 2, [70.0, 70.0])
    serve_model(h, MODEL)
    h.prom.answers[RATE] = [({}, rate_needing(2))]
    h.fake.add_custom("gpuautoscalers", slo_object())
    h.controller.reconcile_all()
    assert "slo" in h.status()
    obj = h.fake.get("gpuautoscalers", NS, "llm")
    del obj["spec"]["slo"]
    obj["metadata"]["generation"] = 2
    h.fake.add_custom("gpuautoscalers", obj)
    h.clock.now += 15
    h.controller.reconcile_all()
    status = h.status()
    assert "slo" not in status
    assert "SizedForSLO" not in {c["type"] for c in status["conditions"]}
    assert mode(h) == "hpa"


def test_an_objective_over_minutes_sizes_for_the_derived_quantile_and_shows_it(h):
    """One request at a time (0.25 s each) at 1 req/s: a minute holds 60 requests, and its p99
    breaches on one late request, so the objective asks for more than the p99 alone."""
    h.deployment("llm", 1, [70.0])
    model = ServiceModel(fixed_seconds=0.2, per_item_seconds=0.05, max_batch=1)
    serve_model(h, model)
    rate = 1.0
    h.prom.answers[RATE] = [({}, rate)]
    h.fake.add_custom("gpuautoscalers", slo_object(objective=0.995))

    h.controller.reconcile_all()

    derived = sizing_quantile_for_objective(rate, 0.99, 0.995)
    sizing = replicas_for_slo(rate, 1.0, model, min_replicas=1, max_replicas=10, quantile=derived)
    per_request = replicas_for_slo(rate, 1.0, model, min_replicas=1, max_replicas=10)
    assert sizing.replicas > per_request.replicas
    slo = h.status()["slo"]
    assert (slo["objective"], slo["quantile"]) == (0.995, 0.99)
    assert slo["sizingQuantile"] == pytest.approx(derived)
    assert h.fake.replicas(NS, "llm") == slo["sizedReplicas"] == sizing.replicas


def test_without_an_objective_the_quantile_itself_is_sized_for(h):
    h.deployment("llm", 2, [70.0, 70.0])
    serve_model(h, MODEL)
    h.prom.answers[RATE] = [({}, rate_needing(3))]
    h.fake.add_custom("gpuautoscalers", slo_object())

    h.controller.reconcile_all()

    slo = h.status()["slo"]
    assert "objective" not in slo and slo["sizingQuantile"] == 0.99


def test_an_objective_no_count_can_hold_falls_back_with_a_reason(h):
    h.deployment("llm", 2, [70.0, 70.0])
    serve_model(h, MODEL)
    h.prom.answers[RATE] = [({}, 1.0)]
    h.fake.add_custom("gpuautoscalers", slo_object(objective=1 - 1e-15))

    h.controller.reconcile_all()

    assert h.status()["slo"]["mode"] == "hpa_fallback"
    cond = h.condition("SizedForSLO")
    assert (cond["status"], cond["reason"]) == ("False", "FallbackToHPARule")
    assert "lower it" in cond["message"]
