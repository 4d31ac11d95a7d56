"""Local mode: a group of real worker processes scaled up and down, and driven by the reconciler."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from autoglm.prometheus_api import PrometheusClient
from autoscaler.controller.controllers import LocalController
from autoscaler.controller.metrics_source import PrometheusMetricsSource
from autoscaler.controller.reconciler import Reconciler
from autoscaler.local import LocalProcessGroup
from autoscaler.metrics import AutoscalerMetrics
from autoscaler.spec import parse_spec
from tests.autoscaler.fake_prometheus import FakePrometheus
from tests.waiting import wait_until

WORKER = str(Path(__file__).parent / "workers" / "http_worker.py")


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def child_pids(path: Path) -> list[int]:
    return [int(x) for x in path.read_text().split()] if path.exists() else []


@pytest.fixture
def group(tmp_path):
    groups = []

    def make(*extra, **kw):
        g = LocalProcessGroup(
            [
                sys.executable,
                WORKER,
                "--port",
                "{port}",
                "--child-pid-file",
                str(tmp_path / "children"),
                *extra,
            ],
            stop_timeout=kw.pop("stop_timeout", 5.0),
            **kw,
        )
        groups.append(g)
        return g

    yield make
    for g in groups:
        g.close()


@pytest.mark.timeout(60)
def test_scale_up_and_down_leaves_no_orphans(group, tmp_path):
    g = group()
    g.set_replicas(3)
    assert g.get_scale().replicas == 3
    ports = g.ports()
    assert len(set(ports)) == 3
    wait_until(lambda: all(p.ready for p in g.pods()), timeout=20, what="3 ready workers")
    assert [p.name for p in g.pods()] == [f"127.0.0.1:{port}" for port in ports]
    assert all(p.phase == "Running" and p.started_at for p in g.pods())

    pids = g.pids()
    wait_until(
        lambda: len(child_pids(tmp_path / "children")) == 3, timeout=20, what="children started"
    )
    children = child_pids(tmp_path / "children")

    g.set_replicas(1)  # the newest two go
    assert g.pids() == pids[:1]
    assert g.ports() == ports[:1]
    for pid in pids[1:]:
        assert not alive(pid)
    wait_until(
        lambda: sum(alive(c) for c in children) == 1,
        timeout=20,
        what="children of stopped workers gone",
    )

    g.set_replicas(2)
    assert len(g.pids()) == 2
    g.close()
    for pid in g.pids() + pids:
        assert not alive(pid)
    wait_until(
        lambda: not any(alive(c) for c in child_pids(tmp_path / "children")),
        timeout=20,
        what="no orphans",
    )


@pytest.mark.timeout(60)
def test_a_worker_that_ignores_sigterm_is_killed(group):
    g = group("--ignore-sigterm", stop_timeout=0.5)
    g.set_replicas(1)
    wait_until(lambda: all(p.ready for p in g.pods()), timeout=20, what="ready worker")
    (pid,) = g.pids()
    g.set_replicas(0)
    assert not alive(pid)


@pytest.mark.timeout(60)
def test_a_crashed_worker_shows_as_failed_and_is_restarted(group):
    g = group()
    g.set_replicas(2)
    wait_until(lambda: all(p.ready for p in g.pods()), timeout=20, what="ready workers")
    victim = g.pids()[0]
    os.kill(victim, 9)
    wait_until(lambda: g.pods()[0].phase == "Failed", timeout=20, what="the crash to show")
    assert g.get_scale().status_replicas == 1
    assert g.supervise() == 1
    assert g.pids()[0] != victim
    assert g.restarts == 1
    wait_until(lambda: all(p.ready for p in g.pods()), timeout=20, what="restarted worker ready")


@pytest.mark.timeout(60)
def test_local_controller_scales_workers_from_metrics(group):
    """The same reconciler as in a cluster; pods are HOST:PORT, matched on the instance label."""
    query = "avg by (instance) (autoglm_batcher_queue_items)"
    spec = parse_spec(
        {
            "scaleTargetRef": {"kind": "LocalProcessGroup", "name": "batcher"},
            "minReplicas": 1,
            "maxReplicas": 4,
            "metrics": [
                {
                    "name": "queue",
                    "type": "Pods",
                    "query": query,
                    "target": {"type": "AverageValue", "averageValue": 4},
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 0}},
        }
    )
    g = group()
    g.set_replicas(1)
    wait_until(lambda: all(p.ready for p in g.pods()), timeout=20, what="ready worker")
    prom = FakePrometheus()
    client = PrometheusClient(prom.url)
    metrics = AutoscalerMetrics()
    try:
        controller = LocalController(
            spec,
            g,
            Reconciler(PrometheusMetricsSource(client, pod_label="instance"), None, metrics),
        )
        prom.answers[query] = [({"instance": p.name}, 12.0) for p in g.pods()]
        controller.reconcile_all()
        assert g.get_scale().replicas == 3  # ceil(12 / 4)
        assert controller.status["desiredReplicas"] == 3

        prom.answers[query] = [({"instance": p.name}, 1.0) for p in g.pods()]
        controller.reconcile_all()
        assert g.get_scale().replicas == 1
        assert controller.status["lastDecision"]["driver"] == "metric:queue/reactive"
        assert (
            metrics.registry.get_sample_value(
                "autoglm_autoscaler_scale_events_total",
                {"namespace": "local", "autoscaler": "batcher", "direction": "down"},
            )
            == 1
        )
    finally:
        client.close()
        prom.stop()
