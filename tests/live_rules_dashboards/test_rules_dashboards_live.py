"""The rules and dashboards proven against a live stack (see ``stack.py``).

Every panel query of every dashboard returns data from a real Prometheus fed by the real
exporter; faults injected into the simulated GPUs fire the matching alerts, which reach the
webhook through a real Alertmanager with their labels and annotations; stopping an exporter
fires the exporter-down alert. The rules are the real file with their real ``for:`` durations,
so waits are bounded by what those durations imply (about a minute), not shortened.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from dashboards.annotations import throttle_annotation, xid_annotation
from dashboards.catalogue import DASHBOARDS
from dashboards.output import JSON_DIR
from dashboards.queries import make_concrete, queries
from dashboards.runbooks import runbook_url
from tests.live_alertmanager import Alert
from tests.live_rules_dashboards.stack import NODE_A, LiveStack

pytestmark = [pytest.mark.live, pytest.mark.timeout(240)]

ALERT_WAIT_S = 90.0  # a `for: 1m` alert, evaluated every second, plus delivery
PANEL_WAIT_S = 100.0  # GPU-hour panels integrate in 1-minute steps: wait past one boundary


def _values(stack: LiveStack) -> dict[str, str]:
    """Variable values that exist in the live stack (GPU 0 of node A runs pod llm/llama-...)."""
    return {
        "node": NODE_A,
        "gpu": "0",
        "namespace": "llm",
        "workload": "llama",
        "instance": stack.exporter_a.address,
        "__rate_interval": "30s",
    }


def _range_query(stack: LiveStack, expr: str, start: float) -> list[dict[str, Any]]:
    reply = requests.get(
        f"{stack.prometheus.url}/api/v1/query_range",
        params={"query": expr, "start": start, "end": time.time(), "step": "2s"},
        timeout=20,
    ).json()
    assert reply["status"] == "success", f"{expr}: {reply}"
    return reply["data"]["result"]


def _dashboard_queries(stack: LiveStack) -> list[tuple[str, str, bool]]:
    """(where, concrete expr, instant?) of every panel target and variable, from the JSON files."""
    values = _values(stack)
    found = []
    for entry in DASHBOARDS:
        dashboard = json.loads((JSON_DIR / entry.filename).read_text())
        for query in queries(dashboard):
            if query.kind != "annotation":  # events: checked after the faults below
                where = f"{query.dashboard} / {query.where}"
                found.append((where, make_concrete(query.expr, values), query.instant))
    return found


def test_every_panel_query_returns_data(live_stack: LiveStack) -> None:
    pending = _dashboard_queries(live_stack)
    assert len(pending) > 50
    deadline = time.monotonic() + PANEL_WAIT_S
    while pending and time.monotonic() < deadline:
        still_empty = []
        for where, expr, instant in pending:
            result = (
                live_stack.prometheus.query(expr)
                if instant
                else _range_query(live_stack, expr, max(live_stack.started_at, time.time() - 600))
            )
            if not result:
                still_empty.append((where, expr, instant))
        pending = still_empty
        if pending:
            time.sleep(2)
    assert not pending, "queries without data:\n" + "\n".join(f"{w}: {e}" for w, e, _ in pending)


@pytest.fixture(scope="module")
def faults(live_stack: LiveStack) -> Iterator[LiveStack]:
    """Break node A's GPUs at once (overheating, lost, Xid 79, ECC) and stop node B's exporter,
    so the alerts' `for:` durations run concurrently."""
    live_stack.inject("temp-ramp:gpu=0:to=95:over=5s")
    live_stack.inject("lost:gpu=1")
    live_stack.inject("xid:gpu=2:code=79")
    live_stack.inject("ecc:gpu=3:dbe=2")
    live_stack.exporter_b.stop()
    yield live_stack


def _named(name: str, **labels: str) -> Any:
    def match(alert: Alert) -> bool:
        got = alert["labels"]
        return got.get("alertname") == name and all(got.get(k) == v for k, v in labels.items())

    return match


def _check_annotations(alert: Alert, name: str) -> None:
    annotations = alert["annotations"]
    assert annotations["runbook_url"] == runbook_url(name)
    assert annotations["summary"] and annotations["description"]
    assert "{{" not in annotations["summary"] + annotations["description"]


def test_temperature_ramp_fires_near_slowdown(faults: LiveStack) -> None:
    (alert,) = faults.webhook.wait_for(
        _named("GPUTemperatureNearSlowdown"), ALERT_WAIT_S, "GPUTemperatureNearSlowdown"
    )
    assert alert["status"] == "firing"
    assert alert["labels"]["gpu"] == "0"  # only the overheating GPU, not its healthy neighbours
    assert alert["labels"]["Hostname"] == NODE_A
    assert alert["labels"]["severity"] == "warning"
    assert alert["labels"]["pod"] == "llama-7d9f8c6b5-x2x4q"
    _check_annotations(alert, "GPUTemperatureNearSlowdown")
    celsius = float(alert["annotations"]["summary"].split(" is at ")[1].split(" ")[0])
    assert celsius >= 84  # within 5 C of the H100's 89 C slowdown point


def test_lost_gpu_fires(faults: LiveStack) -> None:
    (alert,) = faults.webhook.wait_for(_named("GPULost"), ALERT_WAIT_S, "GPULost")
    assert alert["labels"]["gpu"] == "1"
    assert alert["labels"]["instance"] == faults.exporter_a.address
    assert alert["labels"]["severity"] == "critical"
    _check_annotations(alert, "GPULost")
    assert f"GPU 1 on {faults.exporter_a.address}" in alert["annotations"]["summary"]


def test_critical_xid_fires_with_its_code(faults: LiveStack) -> None:
    alerts = faults.webhook.wait_for(_named("GPUCriticalXid"), ALERT_WAIT_S, "GPUCriticalXid")
    # The application Xid 13 injected at start is not critical and must not have fired.
    assert [(a["labels"]["gpu"], a["labels"]["xid"]) for a in alerts] == [("2", "79")]
    alert = alerts[0]
    assert alert["labels"]["Hostname"] == NODE_A and alert["labels"]["severity"] == "critical"
    _check_annotations(alert, "GPUCriticalXid")
    assert alert["annotations"]["summary"] == f"GPU 2 on {NODE_A} reported Xid 79."


def test_double_bit_ecc_errors_fire(faults: LiveStack) -> None:
    (alert,) = faults.webhook.wait_for(
        _named("GPUEccDoubleBitErrors"), ALERT_WAIT_S, "GPUEccDoubleBitErrors"
    )
    assert alert["labels"]["gpu"] == "3" and alert["labels"]["severity"] == "critical"
    _check_annotations(alert, "GPUEccDoubleBitErrors")


def test_stopping_the_exporter_fires_exporter_down(faults: LiveStack) -> None:
    (alert,) = faults.webhook.wait_for(
        _named("AutoglmExporterDown"), ALERT_WAIT_S, "AutoglmExporterDown"
    )
    assert alert["labels"]["instance"] == faults.exporter_b.address
    assert alert["labels"]["job"] == "autoglm-exporter"
    _check_annotations(alert, "AutoglmExporterDown")


def test_xid_and_throttling_show_as_annotations(faults: LiveStack) -> None:
    faults.webhook.wait_for(_named("GPUCriticalXid"), ALERT_WAIT_S, "GPUCriticalXid")
    faults.webhook.wait_for(
        _named("GPUTemperatureNearSlowdown"), ALERT_WAIT_S, "GPUTemperatureNearSlowdown"
    )
    values = {"node": NODE_A}
    since = time.time() - 180
    xids = _range_query(faults, make_concrete(xid_annotation().build().expr, values), since)
    assert {s["metric"]["xid"] for s in xids} >= {"79"}
    throttled = _range_query(
        faults, make_concrete(throttle_annotation().build().expr, values), since
    )
    assert {s["metric"]["gpu"] for s in throttled} == {"0"}
