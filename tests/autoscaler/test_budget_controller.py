"""GPUBudgets end to end, kind-free: the real kubernetes client against the fake API server.

Two GPUAutoscalers share one budget through a burst; the budget shrinks; two controller
replicas that both believe they lead allocate against the same budget; bad budgets are
conditions, not crashes.
"""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest
import yaml

from autoscaler.controller.budget import BudgetCoordinator, BudgetMetrics, parse_budget
from autoscaler.controller.controllers import KubernetesController
from autoscaler.controller.kube import KubeAPI, KubeError
from autoscaler.controller.leader import LeaderElector
from autoscaler.controller.loop import ReconcileLoop
from autoscaler.controller.metrics_source import PrometheusMetricsSource
from autoscaler.controller.reconciler import Reconciler
from autoscaler.metrics import AutoscalerMetrics
from tests.autoscaler.test_controller import NS, UTIL, Harness, autoscaler_object
from tests.autoscaler.test_controller_crd import _as_json_schema

CRD_DIR = Path(__file__).resolve().parents[2] / "autoscaler" / "crd"

SCALE_DOWN_ONE_PER_MINUTE = {
    "scaleDown": {
        "stabilizationWindowSeconds": 0,
        "policies": [{"type": "Pods", "value": 1, "periodSeconds": 60}],
    }
}


def budget_object(total=9, tenants=None, name="team", **spec) -> dict:
    return {
        "apiVersion": "autoscaling.autoglm.io/v1alpha1",
        "kind": "GPUBudget",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "resources": {"nvidia.com/gpu": total},
            "tenants": tenants
            if tenants is not None
            else [{"autoscaler": "chat", "priority": 10}, {"autoscaler": "batch", "priority": 0}],
            **spec,
        },
    }


class Tenants:
    """A controller (with budgets) over workloads whose pods follow their replica counts."""

    def __init__(self, h: Harness) -> None:
        self.h = h
        self.load: dict[str, float] = {}  # GPU utilization summed over the app's pods
        self.coordinator = self.attach(h.kube, h.reconciler, h.controller, h.metrics)

    def attach(self, kube, reconciler, controller, metrics) -> BudgetCoordinator:
        coordinator = BudgetCoordinator(
            kube, controller, NS, BudgetMetrics(metrics.registry), self.h.clock
        )
        reconciler.budget = coordinator
        return coordinator

    def add(self, name: str, replicas: int, load: float, gpus: str = "1", **spec) -> None:
        self.h.fake.add_workload(
            NS, name, replicas, {"app": name}, requests={"nvidia.com/gpu": gpus}
        )
        self.h.fake.add_custom("gpuautoscalers", autoscaler_object(name, maxReplicas=20, **spec))
        self.load[name] = load
        self.sync()

    def sync(self) -> None:
        """Pods for every replica (new ones ready at once), sharing their app's load."""
        fake, values = self.h.fake, {}
        for name, load in self.load.items():
            replicas = fake.replicas(NS, name)
            util = load / max(replicas, 1)
            with fake.lock:
                for key in [k for k in fake.objects if k[0] == "pods" and k[1] == NS]:
                    pod = fake.objects[key]
                    if pod["metadata"]["labels"]["app"] == name:
                        index = int(key[2].rsplit("-", 1)[1])
                        if index >= replicas:
                            del fake.objects[key]
            for i in range(replicas):
                if ("pods", NS, f"{name}-{i}") not in fake.objects:
                    fake.add_pod(NS, f"{name}-{i}", {"app": name})
                values[f"{name}-{i}"] = util
        self.h.prom.set_pods(UTIL, values)

    def tick(self, coordinator=None, seconds: float = 20) -> dict[str, int]:
        (coordinator or self.coordinator).reconcile_all()
        self.h.clock.now += seconds
        self.sync()
        return {n: self.h.fake.replicas(NS, n) for n in self.load}

    def condition(self, name: str) -> dict | None:
        conditions = self.h.status(name).get("conditions") or []
        return next((c for c in conditions if c["type"] == "BudgetLimited"), None)

    def budget_condition(self, ctype: str, budget: str = "team") -> dict:
        status = self.h.fake.get("gpubudgets", NS, budget).get("status") or {}
        return next(c for c in status["conditions"] if c["type"] == ctype)


@pytest.fixture
def h():
    harness = Harness()
    yield harness
    harness.close()


def test_a_burst_goes_to_the_high_priority_and_the_budget_is_never_exceeded(h):
    t = Tenants(h)
    t.add("chat", 2, 140.0)
    t.add("batch", 2, 140.0)
    h.fake.add_custom("gpubudgets", budget_object(total=9))
    assert t.tick() == {"chat": 2, "batch": 2}  # at target: nothing to do, nothing limited
    assert t.condition("chat")["status"] == "False"

    t.load = {"chat": 560.0, "batch": 560.0}  # both want four times as many
    t.sync()
    seen = [t.tick() for _ in range(6)]
    assert all(sum(counts.values()) <= 9 for counts in seen), seen
    assert seen[-1] == {"chat": 8, "batch": 1}

    batch, chat = t.condition("batch"), t.condition("chat")
    assert batch["status"] == "True" and batch["reason"] == "Priority"
    assert chat["status"] == "False"
    limited = {
        (e["involvedObject"]["name"], e["message"])
        for e in h.fake.events(NS)
        if e["reason"] == "BudgetLimited"
    }
    assert {name for name, _ in limited} == {"batch", "chat"}
    # the high priority waited only for GPUs the low priority had not released yet
    assert all("Reclaiming" in message for name, message in limited if name == "chat")
    labels = {"budget": "team", "autoscaler": "batch", "resource": "nvidia.com/gpu"}
    assert h.sample("autoglm_budget_limited", **labels, reason="Priority") == 1
    assert h.sample("autoglm_budget_allowed_gpus", **labels) == 1
    assert h.sample("autoglm_budget_demand_gpus", **labels) > 1
    assert h.sample("autoglm_budget_used_gpus", budget="team", resource="nvidia.com/gpu") == 9
    status = h.fake.get("gpubudgets", NS, "team")["status"]
    assert {x["autoscaler"]: x["granted"] for x in status["tenants"]} == {"batch": 1, "chat": 8}


def test_a_shrunk_budget_scales_the_low_priority_down_within_its_behavior(h):
    t = Tenants(h)
    t.add("chat", 3, 210.0)
    t.add("batch", 5, 350.0, behavior=SCALE_DOWN_ONE_PER_MINUTE)
    h.fake.add_custom("gpubudgets", budget_object(total=8))
    assert t.tick() == {"chat": 3, "batch": 5}
    with h.fake.lock:
        h.fake.objects[("gpubudgets", NS, "team")]["spec"]["resources"]["nvidia.com/gpu"] = 5
    counts = [t.tick(seconds=61) for _ in range(4)]
    assert [c["batch"] for c in counts] == [4, 3, 2, 2]  # one a minute, as its behavior says
    assert all(c["chat"] == 3 for c in counts)  # the high priority is never touched
    assert t.condition("batch")["reason"] in ("OverBudget", "Priority")


def test_two_controllers_never_over_commit_the_budget(h):
    """Both replicas read the same budget and both try to grow their tenant in one tick; the
    grant written with the budget's resourceVersion lets only the first one through."""
    t = Tenants(h)
    t.add("chat", 2, 560.0)
    t.add("batch", 2, 560.0)
    h.fake.add_custom(
        "gpubudgets",
        budget_object(
            total=6,
            tenants=[{"autoscaler": "chat", "priority": 0}, {"autoscaler": "batch", "priority": 0}],
        ),
    )
    other_kube = KubeAPI(h.api_client, identity="ctl-b", clock=h.clock)
    other_metrics = AutoscalerMetrics()
    other_reconciler = Reconciler(
        PrometheusMetricsSource(h.client), None, other_metrics, clock=h.clock
    )
    other_controller = KubernetesController(other_kube, other_reconciler, NS, name="batch")
    other = t.attach(other_kube, other_reconciler, other_controller, other_metrics)
    t.coordinator.controller.name = "chat"  # each replica happens to reconcile a different one

    for _ in range(4):
        t.coordinator.begin_tick()
        other.begin_tick()  # both read the budget before either writes
        t.coordinator.controller.reconcile_all()
        other.controller.reconcile_all()
        t.coordinator.end_tick()
        other.end_tick()
        h.clock.now += 20
        t.sync()
        assert h.fake.replicas(NS, "chat") + h.fake.replicas(NS, "batch") <= 6
    assert h.fake.replicas(NS, "chat") + h.fake.replicas(NS, "batch") == 6
    assert any(r.method == "PATCH" and "/gpubudgets/" in r.path for r in h.fake.requests), (
        "grants are recorded on the budget"
    )
    contended = other_metrics.registry.get_sample_value(
        "autoglm_budget_limited",
        {
            "budget": "team",
            "autoscaler": "batch",
            "resource": "nvidia.com/gpu",
            "reason": "Contended",
        },
    )
    assert contended is not None


def test_a_failed_budget_read_keeps_the_last_budget_in_force(h):
    t = Tenants(h)
    t.add("chat", 2, 140.0)
    t.add("batch", 2, 140.0)
    h.fake.add_custom("gpubudgets", budget_object(total=5))
    assert t.tick() == {"chat": 2, "batch": 2}
    t.load = {"chat": 560.0, "batch": 560.0}
    t.sync()
    h.fake.inject("GET", r"/gpubudgets$", 500, "InternalError", times=3)
    for _ in range(3):
        counts = t.tick()
        assert sum(counts.values()) <= 5, counts
    # Held on the last budget read (grants not yet released count as held): never over it.
    counts = [t.tick() for _ in range(3)]  # reads work again
    assert all(sum(c.values()) <= 5 for c in counts)
    assert counts[-1] == {"chat": 4, "batch": 1}


def test_a_tenant_whose_target_cannot_be_read_stops_the_others_growing(h):
    t = Tenants(h)
    t.add("chat", 2, 560.0)
    h.fake.add_custom("gpuautoscalers", autoscaler_object("ghost", maxReplicas=20))  # no target
    h.fake.add_custom(
        "gpubudgets",
        budget_object(tenants=[{"autoscaler": "chat"}, {"autoscaler": "ghost"}], total=20),
    )
    assert t.tick()["chat"] == 2
    assert t.condition("chat")["reason"] == "Contended"
    assert "cannot read ghost" in t.condition("chat")["message"]


def test_missing_references_overlaps_and_bad_specs_are_conditions_not_crashes(h):
    t = Tenants(h)
    t.add("chat", 2, 280.0)
    h.fake.add_custom(
        "gpubudgets", budget_object(tenants=[{"autoscaler": "chat"}, {"autoscaler": "ghost"}])
    )
    h.fake.add_custom("gpubudgets", budget_object(name="other", tenants=[{"autoscaler": "chat"}]))
    broken = budget_object(name="broken")
    broken["spec"]["resources"] = {"nvidia.com/gpu": "lots"}
    h.fake.add_custom("gpubudgets", broken)
    assert t.tick()["chat"] == 4  # still scales, within both budgets
    assert t.budget_condition("ReferencesResolved")["status"] == "False"
    assert "ghost" in t.budget_condition("ReferencesResolved")["message"]
    assert t.budget_condition("Overlapping")["status"] == "True"
    assert t.budget_condition("Overlapping", "other")["status"] == "True"
    assert t.budget_condition("Valid", "broken")["status"] == "False"
    reasons = {e["reason"] for e in h.fake.events(NS)}
    assert {"MissingAutoscalers", "Overlaps", "InvalidSpec"} <= reasons


def test_the_budget_selects_by_label_and_by_the_autoscalers_own_label():
    spec = parse_budget(budget_object(tenants=[], selector={"matchLabels": {"pool": "a"}}))
    by_selector = {"metadata": {"name": "x", "labels": {"pool": "a"}}}
    by_label = {"metadata": {"name": "y", "labels": {"autoscaling.autoglm.io/gpu-budget": "team"}}}
    neither = {"metadata": {"name": "z", "labels": {"pool": "b"}}}
    assert spec.selects(by_selector) and spec.selects(by_label) and not spec.selects(neither)


def test_only_the_lease_holder_allocates(h):
    t = Tenants(h)
    t.add("chat", 2, 560.0)
    h.fake.add_custom("gpubudgets", budget_object(total=3))
    loops = []
    for identity in ("ctl-a", "ctl-b"):
        elector = LeaderElector(h.api_client, NS, "autoglm-autoscaler", identity, clock=h.clock)
        kube = KubeAPI(h.api_client, identity=identity, clock=h.clock)
        metrics = AutoscalerMetrics()
        reconciler = Reconciler(
            PrometheusMetricsSource(h.client),
            None,
            metrics,
            clock=h.clock,
            may_act=elector.is_leader,
        )
        controller = KubernetesController(kube, reconciler, NS, may_act=elector.is_leader)
        coordinator = t.attach(kube, reconciler, controller, metrics)
        loops.append(ReconcileLoop(coordinator, metrics, elector=elector))
    loops[0].tick()
    assert h.fake.replicas(NS, "chat") == 3  # capped by the budget
    before = len(h.fake.writes())
    h.clock.now += 5
    loops[1].tick()  # not the leader: reads the lease only, writes nothing
    assert h.fake.writes()[before:] == []


def test_the_example_budget_fits_the_crd_and_the_parser():
    example = yaml.safe_load((CRD_DIR / "gpubudget-example.yaml").read_text())
    crd = yaml.safe_load((CRD_DIR / "gpubudget.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    jsonschema.validate(example, _as_json_schema(version["schema"]["openAPIV3Schema"]))
    spec = parse_budget(example)
    assert spec.totals == {"nvidia.com/gpu": 16, "nvidia.com/mig-1g.10gb": 14}
    assert spec.policy("chat").guaranteed == {"nvidia.com/gpu": 4} and spec.policy("chat").preempt
    assert spec.policy("anyone").priority == -10
    example["spec"]["tenants"][0]["weight"] = 0
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(example, _as_json_schema(version["schema"]["openAPIV3Schema"]))
    with pytest.raises(ValueError, match="weight"):
        parse_budget(example)


def test_what_budgets_read_and_write_goes_through_kube_api(h):
    """The budget coordinator's calls (other custom objects, a workload's template, a status
    patch guarded by resourceVersion) turn client errors into KubeErrors like the rest."""
    h.fake.add_custom("gpubudgets", budget_object(total=4))
    (budget,) = h.kube.list_objects(NS, "gpubudgets")
    assert budget["spec"]["resources"] == {"nvidia.com/gpu": 4}
    h.fake.add_workload(NS, "chat", 1, {"app": "chat"}, requests={"nvidia.com/gpu": "2"})
    workload = h.kube.read_workload(NS, "Deployment", "chat")
    assert workload.spec.template.spec.containers[0].resources.requests == {"nvidia.com/gpu": "2"}
    with pytest.raises(KubeError) as missing:
        h.kube.read_workload(NS, "Deployment", "absent")
    assert missing.value.not_found
    with pytest.raises(KubeError, match="UnsupportedKind"):
        h.kube.read_workload(NS, "DaemonSet", "chat")
    stale = {"metadata": {"resourceVersion": "0"}, "status": {"granted": []}}
    with pytest.raises(KubeError) as conflict:
        h.kube.patch_object_status(NS, "gpubudgets", "team", stale)
    assert conflict.value.conflict
