"""The controller end to end: real kubernetes client -> fake API server, metrics from a query API.

Every scenario goes through KubernetesController.reconcile_all(): read the GPUAutoscaler, the
scale subresource and the pods, query the metrics, decide with the real core, scale through the
scale subresource, write status and Events.
"""

from __future__ import annotations

import logging

import pytest
from prometheus_client import generate_latest

from autoglm.prometheus_api import PrometheusClient
from autoscaler.controller.controllers import KubernetesController
from autoscaler.controller.forecasts import ProviderForecasts
from autoscaler.controller.kube import KubeAPI
from autoscaler.controller.leader import LeaderElector
from autoscaler.controller.loop import ReconcileLoop
from autoscaler.controller.metrics_source import PrometheusMetricsSource
from autoscaler.controller.reconciler import Reconciler
from autoscaler.metrics import AutoscalerMetrics
from predictor.api import Forecast
from tests.autoscaler.fake_kube import FakeKubeServer
from tests.autoscaler.fake_prometheus import FakePrometheus
from tests.live import free_port

NS = "ml"
UTIL = 'avg by (pod) (DCGM_FI_DEV_GPU_UTIL{namespace="ml"})'
QUEUE = 'sum(autoglm_batcher_queue_items{namespace="ml"})'
T0 = 1_720_000_000.0  # after the fake pods started (2024-01-01)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> float:
        return self.now


def autoscaler_object(name="llm", kind="Deployment", metrics=None, **spec) -> dict:
    return {
        "apiVersion": "autoscaling.autoglm.io/v1alpha1",
        "kind": "GPUAutoscaler",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": name},
            "minReplicas": 1,
            "maxReplicas": 10,
            "metrics": metrics
            or [
                {
                    "name": "gpu_util",
                    "type": "Pods",
                    "query": UTIL,
                    "target": {"type": "Utilization", "averageUtilization": 70},
                }
            ],
            **spec,
        },
    }


class Harness:
    def __init__(self, prom_url: str | None = None, dry_run: bool = False, identity="ctl-a"):
        self.kube_server = FakeKubeServer().start()
        self.fake = self.kube_server.fake
        self.prom = FakePrometheus()
        self.clock = Clock()
        self.metrics = AutoscalerMetrics()
        self.client = PrometheusClient(prom_url or self.prom.url, timeout=2)
        self.api_client = self.kube_server.api_client()
        self.kube = KubeAPI(self.api_client, identity=identity, clock=self.clock)
        self.reconciler = Reconciler(
            PrometheusMetricsSource(self.client),
            None,
            self.metrics,
            dry_run=dry_run,
            clock=self.clock,
        )
        self.controller = KubernetesController(self.kube, self.reconciler, NS)

    def deployment(self, name: str, replicas: int, utils: list[float], kind="deployments"):
        labels = {"app": name}
        self.fake.add_workload(NS, name, replicas, labels, resource=kind)
        for i in range(replicas):
            self.fake.add_pod(NS, f"{name}-{i}", labels)
        self.prom.set_pods(UTIL, {f"{name}-{i}": u for i, u in enumerate(utils)})

    def status(self, name="llm") -> dict:
        return self.fake.get("gpuautoscalers", NS, name).get("status") or {}

    def condition(self, ctype: str, name="llm") -> dict:
        return next(c for c in self.status(name)["conditions"] if c["type"] == ctype)

    def sample(self, name: str, **labels) -> float | None:
        return self.metrics.registry.get_sample_value(name, labels)

    def close(self) -> None:
        self.client.close()
        self.api_client.close()
        self.prom.stop()
        self.kube_server.stop()


@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()


def scale_writes(fake, name="llm"):
    return [r for r in fake.writes(f"/{name}/scale")]


def test_scale_up_through_the_scale_subresource(h):
    h.deployment("llm", 2, [140.0, 140.0])
    h.fake.add_custom("gpuautoscalers", autoscaler_object())
    results = h.controller.reconcile_all()

    assert results["llm"].scaled
    assert h.fake.replicas(NS, "llm") == 4  # ceil(2 * 140/70)
    (put,) = scale_writes(h.fake)
    assert put.method == "PUT"
    assert put.body["spec"]["replicas"] == 4
    assert put.body["metadata"]["resourceVersion"]  # optimistic concurrency, as the HPA does

    status = h.status()
    assert status["currentReplicas"] == 4
    assert status["desiredReplicas"] == 4
    assert status["lastScaleTime"] == "2024-07-03T09:46:40Z"
    assert status["observedGeneration"] == 1
    assert status["lastDecision"]["driver"] == "metric:gpu_util/reactive"
    assert status["lastDecision"]["reactiveProposal"] == 4
    assert status["currentMetrics"][0]["current"] == {"averageUtilization": "140"}
    assert h.condition("AbleToScale")["reason"] == "SucceededRescale"
    assert h.condition("ScalingActive")["status"] == "True"
    assert h.condition("ScalingLimited")["status"] == "False"

    (event,) = h.fake.events(NS)
    assert event["reason"] == "SuccessfulRescale"
    assert event["type"] == "Normal"
    assert event["message"].startswith("New size: 4; reason:")
    assert event["involvedObject"]["kind"] == "GPUAutoscaler"
    assert event["involvedObject"]["name"] == "llm"
    assert event["source"]["component"] == "autoglm-autoscaler"

    assert h.sample("autoglm_autoscaler_desired_replicas", namespace=NS, autoscaler="llm") == 4
    assert h.sample("autoglm_autoscaler_current_replicas", namespace=NS, autoscaler="llm") == 4
    assert (
        h.sample(
            "autoglm_autoscaler_scale_events_total", namespace=NS, autoscaler="llm", direction="up"
        )
        == 1
    )
    assert (
        h.sample(
            "autoglm_autoscaler_metric_value", namespace=NS, autoscaler="llm", metric="gpu_util"
        )
        == 140
    )


def test_scale_down_after_the_stabilization_window(h):
    h.deployment("llm", 4, [35.0] * 4)
    h.fake.add_custom("gpuautoscalers", autoscaler_object())
    h.controller.reconcile_all()
    # The first recommendation is the current count and the window is 300 s: no change yet.
    assert h.fake.replicas(NS, "llm") == 4
    assert h.status()["desiredReplicas"] == 4
    assert h.status()["lastDecision"]["reactiveProposal"] == 2
    assert h.status()["lastDecision"]["driver"] == "stabilization"
    assert not scale_writes(h.fake)

    h.clock.now += 301
    h.controller.reconcile_all()
    assert h.fake.replicas(NS, "llm") == 2
    assert h.status()["currentReplicas"] == 2
    assert (
        h.sample(
            "autoglm_autoscaler_scale_events_total",
            namespace=NS,
            autoscaler="llm",
            direction="down",
        )
        == 1
    )


def test_a_concurrent_scale_is_never_overwritten_by_a_stale_decision(h):
    """Issue 16's lost update: someone scales to 10 between our read and our write. The write
    carries the version the decision read, gets 409, and nothing is replayed; the next reconcile
    decides again from 10."""
    h.deployment("llm", 2, [140.0, 140.0])
    h.fake.add_custom("gpuautoscalers", autoscaler_object())
    h.fake.concurrent_scale_changes = [10]  # a kubectl scale races our write

    h.controller.reconcile_all()

    assert h.fake.replicas(NS, "llm") == 10  # the stale 4 was not written over it
    (put,) = scale_writes(h.fake)
    assert put.body["spec"]["replicas"] == 4
    assert h.condition("AbleToScale")["reason"] == "ScaleConflict"
    assert "10" in h.condition("AbleToScale")["message"]
    assert [(e["type"], e["reason"]) for e in h.fake.events(NS)] == [("Warning", "ScaleConflict")]
    assert h.sample("autoglm_autoscaler_scale_conflicts_total", namespace=NS, autoscaler="llm") == 1
    assert h.status()["currentReplicas"] == 10

    # The next reconcile decides from 10: the two measured pods alone ask for 4, which the
    # scale-down window holds back, so 10 stays and nothing is written.
    h.clock.now += 15
    h.controller.reconcile_all()
    assert h.fake.replicas(NS, "llm") == 10
    assert len(scale_writes(h.fake)) == 1
    assert h.status()["lastDecision"]["currentReplicas"] == 10
    assert h.condition("AbleToScale")["status"] == "True"


def test_dry_run_never_writes_the_scale():
    h = Harness(dry_run=True)
    try:
        h.deployment("llm", 2, [140.0, 140.0])
        h.fake.add_custom("gpuautoscalers", autoscaler_object())
        for _ in range(3):
            h.controller.reconcile_all()
            h.clock.now += 15
        assert h.fake.replicas(NS, "llm") == 2
        assert not scale_writes(h.fake)
        status = h.status()
        assert status["currentReplicas"] == 2
        assert status["desiredReplicas"] == 4
        assert status["lastDecision"]["dryRun"] is True
        assert "lastScaleTime" not in status
        assert {e["reason"] for e in h.fake.events(NS)} == {"DryRunRescale"}
        assert "would scale from 2 to 4" in h.fake.events(NS)[0]["message"]
    finally:
        h.close()


def test_prometheus_down_never_scales_down_and_is_reported():
    h = Harness(prom_url=f"http://127.0.0.1:{free_port()}")  # nothing listens there
    try:
        h.deployment("llm", 4, [10.0] * 4)
        h.fake.add_custom(
            "gpuautoscalers",
            autoscaler_object(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}),
        )
        for _ in range(3):
            h.controller.reconcile_all()
            h.clock.now += 60
        assert h.fake.replicas(NS, "llm") == 4
        assert not scale_writes(h.fake)
        active = h.condition("ScalingActive")
        assert active["status"] == "False"
        assert active["reason"] == "FailedGetResourceMetric"  # a Utilization target
        assert "unreachable" in active["message"]
        assert h.status()["lastDecision"]["driver"] == "all_metrics_invalid"
        errors = h.sample(
            "autoglm_autoscaler_errors_total",
            namespace=NS,
            autoscaler="llm",
            kind="prometheus_unreachable",
        )
        assert errors == 3
        # one Warning when the condition turned false, not one per reconcile
        assert [e["reason"] for e in h.fake.events(NS)] == ["FailedGetResourceMetric"]
        assert (
            h.sample(
                "autoglm_autoscaler_condition",
                namespace=NS,
                autoscaler="llm",
                condition="ScalingActive",
            )
            == 0
        )
    finally:
        h.close()


def test_a_nan_metric_blocks_scale_down_but_not_scale_up(h):
    metrics = [
        {
            "name": "gpu_util",
            "type": "Pods",
            "query": UTIL,
            "target": {"type": "Utilization", "averageUtilization": 70},
        },
        {
            "name": "queue",
            "type": "External",
            "query": QUEUE,
            "target": {"type": "AverageValue", "averageValue": 8},
        },
    ]
    h.deployment("llm", 4, [10.0] * 4)
    h.prom.answers[QUEUE] = [({}, "NaN")]
    h.fake.add_custom(
        "gpuautoscalers",
        autoscaler_object(
            metrics=metrics, behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}
        ),
    )
    h.controller.reconcile_all()
    assert h.fake.replicas(NS, "llm") == 4  # gpu_util alone would say 1
    assert h.status()["lastDecision"]["driver"] == "invalid_metrics_no_scale_down"
    assert h.condition("ScalingActive")["reason"] == "FailedGetExternalMetric"
    assert (
        h.sample(
            "autoglm_autoscaler_errors_total", namespace=NS, autoscaler="llm", kind="metric_nan"
        )
        == 1
    )
    # the valid metric may still scale up while the other is broken
    h.prom.set_pods(UTIL, {f"llm-{i}": 140.0 for i in range(4)})
    h.clock.now += 15
    h.controller.reconcile_all()
    assert h.fake.replicas(NS, "llm") == 8
    # and once the metric is back, scale-down works again
    h.prom.answers[QUEUE] = [({}, 8.0)]
    h.prom.set_pods(UTIL, {f"llm-{i}": 10.0 for i in range(4)})
    for i in range(4, 8):
        h.fake.add_pod(NS, f"llm-{i}", {"app": "llm"})
    h.prom.set_pods(UTIL, {f"llm-{i}": 10.0 for i in range(8)})
    h.clock.now += 15
    h.controller.reconcile_all()
    assert h.fake.replicas(NS, "llm") == 2  # max(ceil(8 * 10/70), ceil(8/8))


def test_an_api_error_reading_the_scale_changes_nothing_and_is_reported(h):
    h.deployment("llm", 4, [10.0] * 4)
    h.fake.add_custom("gpuautoscalers", autoscaler_object())
    h.fake.inject("GET", r"/deployments/llm/scale$", 500, "InternalError", times=1)
    h.controller.reconcile_all()
    assert not scale_writes(h.fake)
    assert h.condition("AbleToScale")["reason"] == "FailedGetScale"
    assert [e["reason"] for e in h.fake.events(NS)] == ["FailedGetScale"]
    assert (
        h.sample(
            "autoglm_autoscaler_errors_total", namespace=NS, autoscaler="llm", kind="get_scale"
        )
        == 1
    )
    # recovers on the next reconcile; lastTransitionTime moves with the status change
    h.clock.now += 15
    h.controller.reconcile_all()
    assert h.condition("AbleToScale")["status"] == "True"
    assert h.condition("AbleToScale")["lastTransitionTime"] == "2024-07-03T09:46:55Z"


def test_pods_list_failure_is_an_invalid_metric(h):
    h.deployment("llm", 4, [10.0] * 4)
    h.fake.add_custom(
        "gpuautoscalers",
        autoscaler_object(behavior={"scaleDown": {"stabilizationWindowSeconds": 0}}),
    )
    h.fake.inject("GET", r"/pods$", 503, "ServiceUnavailable", times=1)
    h.controller.reconcile_all()
    assert h.fake.replicas(NS, "llm") == 4
    assert h.condition("ScalingActive")["status"] == "False"
    for kind in ("list_pods", "pods_unavailable"):
        assert (
            h.sample("autoglm_autoscaler_errors_total", namespace=NS, autoscaler="llm", kind=kind)
            == 1
        )


def test_statefulsets_scale_too_and_pods_are_matched_by_the_scale_selector(h):
    h.deployment("db", 2, [140.0, 140.0], kind="statefulsets")
    # a pod of another app with a metric must not be counted
    h.fake.add_pod(NS, "other-0", {"app": "other"})
    h.prom.answers[UTIL].append(({"pod": "other-0"}, 1.0))
    h.fake.add_custom("gpuautoscalers", autoscaler_object(name="db", kind="StatefulSet"))
    h.controller.reconcile_all()
    assert h.fake.replicas(NS, "db", resource="statefulsets") == 4
    pod_lists = [r for r in h.fake.requests if r.path.endswith("/pods")]
    assert pod_lists[0].query["labelSelector"] == ["app=db"]


def test_an_invalid_spec_is_reported_not_acted_on(h):
    h.deployment("llm", 2, [140.0, 140.0])
    bad = autoscaler_object()
    bad["spec"]["maxReplicas"] = 0
    h.fake.add_custom("gpuautoscalers", bad)
    h.controller.reconcile_all()
    h.controller.reconcile_all()
    assert not scale_writes(h.fake)
    cond = h.condition("ScalingActive")
    assert cond["reason"] == "InvalidSpec"
    assert "spec.maxReplicas" in cond["message"]
    assert [e["reason"] for e in h.fake.events(NS)] == ["InvalidSpec"]  # once, not per reconcile


def test_all_autoscalers_in_the_namespace_are_reconciled(h):
    h.deployment("a", 2, [140.0, 140.0])
    h.fake.add_workload(NS, "b", 3, {"app": "b"})
    for i in range(3):
        h.fake.add_pod(NS, f"b-{i}", {"app": "b"})
    h.prom.answers[UTIL] += [({"pod": f"b-{i}"}, 70.0) for i in range(3)]
    h.fake.add_custom("gpuautoscalers", autoscaler_object(name="a"))
    h.fake.add_custom("gpuautoscalers", autoscaler_object(name="b"))
    results = h.controller.reconcile_all()
    assert set(results) == {"a", "b"}
    assert h.fake.replicas(NS, "a") == 4
    assert h.fake.replicas(NS, "b") == 3  # at target: within tolerance
    assert h.status("b")["lastDecision"]["reason"] == "no change"


def _leader_setup(h: Harness, identity: str):
    kube = KubeAPI(h.api_client, identity=identity, clock=h.clock)
    elector = LeaderElector(h.api_client, NS, "autoglm-autoscaler", identity, clock=h.clock)
    metrics = AutoscalerMetrics()
    reconciler = Reconciler(
        PrometheusMetricsSource(h.client),
        None,
        metrics,
        clock=h.clock,
        may_act=elector.is_leader,
    )
    controller = KubernetesController(kube, reconciler, NS, may_act=elector.is_leader)
    return ReconcileLoop(controller, metrics, elector=elector), metrics


def test_leader_handover_only_the_holder_acts(h):
    h.deployment("llm", 2, [140.0, 140.0])
    h.fake.add_custom("gpuautoscalers", autoscaler_object())
    loop_a, metrics_a = _leader_setup(h, "ctl-a")
    loop_b, metrics_b = _leader_setup(h, "ctl-b")

    loop_a.tick()
    assert h.fake.replicas(NS, "llm") == 4
    assert metrics_a.registry.get_sample_value("autoglm_autoscaler_leader") == 1

    for i in range(2, 4):  # the new pods come up, load rises again
        h.fake.add_pod(NS, f"llm-{i}", {"app": "llm"})
    h.prom.set_pods(UTIL, {f"llm-{i}": 140.0 for i in range(4)})
    before = len(h.fake.writes())
    h.clock.now += 5
    loop_b.tick()  # b only reads the lease: it must not scale, patch status or write events
    assert h.fake.writes()[before:] == []
    assert metrics_b.registry.get_sample_value("autoglm_autoscaler_leader") == 0
    assert h.fake.replicas(NS, "llm") == 4

    # a stops (crash: no release); after the lease expires b takes over and acts
    h.clock.now += 16
    loop_b.tick()
    assert metrics_b.registry.get_sample_value("autoglm_autoscaler_leader") == 1
    assert h.fake.replicas(NS, "llm") == 8
    lease = h.fake.get("leases", NS, "autoglm-autoscaler")
    assert lease["spec"]["holderIdentity"] == "ctl-b"
    assert sorted((e["reportingInstance"], e["reason"]) for e in h.fake.events(NS)) == [
        ("ctl-a", "SuccessfulRescale"),
        ("ctl-b", "SuccessfulRescale"),
    ]

    # a comes back and must not act
    h.prom.set_pods(UTIL, {f"llm-{i}": 140.0 for i in range(8)})
    before = len(h.fake.writes())
    loop_a.tick()
    assert h.fake.writes()[before:] == []
    assert h.fake.replicas(NS, "llm") == 8
    assert metrics_a.registry.get_sample_value("autoglm_autoscaler_leader") == 0


@pytest.mark.timeout(30)
def test_the_loop_ticks_on_apscheduler_and_stops_cleanly(h):
    h.deployment("llm", 2, [140.0, 140.0])
    h.fake.add_custom("gpuautoscalers", autoscaler_object())
    loop = ReconcileLoop(h.controller, h.metrics, interval=0.05)
    loop.start()
    try:
        while loop.ticks < 3:
            loop.tick_done.wait(10)
            loop.tick_done.clear()
    finally:
        loop.stop()
    assert h.fake.replicas(NS, "llm") == 4
    exposition = generate_latest(h.metrics.registry).decode()
    assert "autoglm_autoscaler_reconcile_duration_seconds_count" in exposition
    assert "autoglm_autoscaler_leader 1.0" not in exposition  # stop() cleared it


class StubPredictor:
    """Stands in for predictor.service.PredictorService through the ForecastProvider protocol."""

    def __init__(self, upper: float, issued_at: float) -> None:
        self.upper, self.issued_at = upper, issued_at
        self.asked: list[tuple[str, float, float]] = []

    def forecast(self, target: str, horizon_seconds: float, quantile: float = 0.9):
        self.asked.append((target, horizon_seconds, quantile))
        return Forecast(
            target, horizon_seconds, self.upper * 0.8, self.upper, quantile, "ets", self.issued_at
        )


def test_a_forecast_orders_replicas_before_the_load_arrives(h):
    queue = "avg by (pod) (autoglm_batcher_queue_items)"
    metrics = [
        {
            "name": "queue",
            "type": "Pods",
            "query": queue,
            "target": {"type": "AverageValue", "averageValue": 4},
            "prediction": {"horizonSeconds": 60, "quantile": 0.9, "warmupSeconds": 180},
        }
    ]
    h.deployment("llm", 2, [0.0, 0.0])
    h.prom.set_pods(queue, {"llm-0": 4.0, "llm-1": 4.0})  # at target now: reactive keeps 2
    # with a behavior section, so the default policies allow 2 -> 6 at once
    h.fake.add_custom("gpuautoscalers", autoscaler_object(metrics=metrics, behavior={}))
    predictor = StubPredictor(upper=24.0, issued_at=T0 - 30)  # the fleet's total queue, ahead
    h.reconciler.forecasts = ProviderForecasts(predictor, clock=h.clock)

    h.controller.reconcile_all()

    assert predictor.asked == [("queue", 180.0, 0.9)]  # never shorter than the warm-up
    assert h.fake.replicas(NS, "llm") == 6  # 24 / 4 per pod
    decision = h.status()["lastDecision"]
    assert decision["driver"] == "metric:queue/predictive"
    assert (decision["reactiveProposal"], decision["predictiveProposal"]) == (2, 6)
    assert h.status()["currentMetrics"][0]["forecastUpper"] == "12"  # per pod
    assert (
        h.sample("autoglm_autoscaler_predictive_proposal_replicas", namespace=NS, autoscaler="llm")
        == 6
    )


def test_a_stale_forecast_is_ignored(h):
    queue = "avg by (pod) (autoglm_batcher_queue_items)"
    metrics = [
        {
            "name": "queue",
            "type": "Pods",
            "query": queue,
            "target": {"type": "AverageValue", "averageValue": 4},
            "prediction": {"horizonSeconds": 60},
        }
    ]
    h.deployment("llm", 2, [0.0, 0.0])
    h.prom.set_pods(queue, {"llm-0": 4.0, "llm-1": 4.0})
    h.fake.add_custom("gpuautoscalers", autoscaler_object(metrics=metrics))
    h.reconciler.forecasts = ProviderForecasts(
        StubPredictor(upper=24.0, issued_at=T0 - 3600), clock=h.clock
    )
    h.controller.reconcile_all()
    assert h.fake.replicas(NS, "llm") == 2
    assert "predictiveProposal" not in h.status()["lastDecision"]  # null removes it (merge patch)
    assert (
        h.sample(
            "autoglm_autoscaler_errors_total", namespace=NS, autoscaler="llm", kind="forecast_stale"
        )
        == 1
    )


def test_a_repeated_event_is_counted_on_the_first_not_created_again(h, caplog):
    """As client-go's recorder: identical Events patch count and lastTimestamp; a different
    message is a new Event; one the API server expired is created anew; a failing write is
    logged and never raised."""
    h.fake.add_custom("gpuautoscalers", autoscaler_object())
    obj = h.fake.get("gpuautoscalers", NS, "llm")
    for _ in range(3):
        h.kube.create_event(NS, obj, "Warning", "FailedGetPodsMetric", "prometheus unreachable")
        h.clock.now += 15
    (event,) = h.fake.events(NS)
    assert event["count"] == 3
    assert event["firstTimestamp"] < event["lastTimestamp"]
    assert [r.method for r in h.fake.writes("/events")] == ["POST", "PATCH", "PATCH"]

    h.kube.create_event(NS, obj, "Warning", "FailedGetPodsMetric", "query returned NaN")
    assert sorted(e["count"] for e in h.fake.events(NS)) == [1, 3]

    h.fake.expire_events(NS)
    h.kube.create_event(NS, obj, "Warning", "FailedGetPodsMetric", "prometheus unreachable")
    (renewed,) = h.fake.events(NS)
    assert renewed["count"] == 1 and renewed["message"] == "prometheus unreachable"

    h.fake.inject("PATCH", r"/events/", 500, "InternalError")
    h.kube.create_event(NS, obj, "Warning", "FailedGetPodsMetric", "prometheus unreachable")
    assert "could not record event" in caplog.text
    h.kube.create_event(NS, obj, "Warning", "FailedGetPodsMetric", "prometheus unreachable")
    assert h.fake.events(NS)[0]["count"] == 2  # the failed repeat is not counted


def test_value_targets_multiply_the_ready_pods_the_controller_lists(h):
    """The HPA counts Running and Ready pods for every metric type: with no Pods metric the
    controller still lists them, and an unready pod is not multiplied."""
    metrics = [
        {
            "name": "queue",
            "type": "External",
            "query": QUEUE,
            "target": {"type": "Value", "value": 10},
        }
    ]
    h.fake.add_workload(NS, "llm", 3, {"app": "llm"})
    h.fake.add_pod(NS, "llm-0", {"app": "llm"})
    h.fake.add_pod(NS, "llm-1", {"app": "llm"})
    h.fake.add_pod(NS, "llm-2", {"app": "llm"}, ready=False)
    h.prom.answers[QUEUE] = [({}, 30.0)]  # 3x the target
    h.fake.add_custom("gpuautoscalers", autoscaler_object(metrics=metrics, behavior={}))

    h.controller.reconcile_all()

    assert any(r.path.endswith("/pods") for r in h.fake.requests)
    assert h.fake.replicas(NS, "llm") == 6  # ceil(3.0 * 2 ready), not ceil(3.0 * 3)


def test_a_steady_decision_is_logged_at_info_once_then_at_debug(h, caplog):
    """Every tick of a steady load decides "no change": the first says so at info, the
    repeats go to debug, and a new decision is at info again."""
    h.deployment("llm", 2, [70.0, 70.0])
    h.fake.add_custom("gpuautoscalers", autoscaler_object())

    def decisions() -> list[tuple[int, int]]:
        found = [(r.levelno, r.desired) for r in caplog.records if r.getMessage() == "decision"]
        caplog.clear()
        return found

    with caplog.at_level(logging.DEBUG, logger="autoscaler"):
        h.controller.reconcile_all()
        assert decisions() == [(logging.INFO, 2)]
        for _ in range(2):
            h.clock.now += 15
            h.controller.reconcile_all()
            assert decisions() == [(logging.DEBUG, 2)]
        h.prom.set_pods(UTIL, {"llm-0": 140.0, "llm-1": 140.0})
        h.clock.now += 15
        assert h.controller.reconcile_all()["llm"].scaled  # to 4: "scaled", not "decision"
        assert decisions() == []
        for i in range(2, 4):
            h.fake.add_pod(NS, f"llm-{i}", {"app": "llm"})
        h.prom.set_pods(UTIL, {f"llm-{i}": 70.0 for i in range(4)})
        h.clock.now += 15
        h.controller.reconcile_all()
        assert decisions() == [(logging.INFO, 4)]  # steady again, at a new size: news
