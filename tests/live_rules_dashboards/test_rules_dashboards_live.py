"""The rules and dashboards proven against a live stack (see ``stack.py``).

Every panel query of every dashboard returns data from a real Prometheus fed by the real
exporter, batchers, predictor and autoscaler (the batcher's CUDA allocator panels excepted on a
machine without a GPU: those series exist only on CUDA, which the lint checks); faults injected
into the simulated GPUs fire the matching alerts, which reach the webhook through a real
Alertmanager with their labels and annotations; stopping an exporter fires the exporter-down
alert; overloading a batcher's tiny queue fires the rejection alert. The rules are the real file
with their real ``for:`` durations, so waits are bounded by what those durations imply (about a
minute), not shortened; the faults and the overload run at once so their waits overlap.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from dashboards import autoscaler, batcher, predictor
from dashboards.annotations import throttle_annotation, xid_annotation
from dashboards.catalogue import DASHBOARDS
from dashboards.output import JSON_DIR
from dashboards.queries import make_concrete, metric_names, queries
from dashboards.runbooks import runbook_url
from tests.live_alertmanager import Alert
from tests.live_rules_dashboards.load import Bursts
from tests.live_rules_dashboards.stack import (
    AUTOSCALER,
    FORECAST_TARGET,
    HORIZONS_S,
    MODEL_NAME,
    NODE_A,
    LiveStack,
)

pytestmark = [pytest.mark.live, pytest.mark.timeout(600)]  # the shared stack starts in the first

ALERT_WAIT_S = 90.0  # a `for: 1m` alert, evaluated every second, plus delivery
PANEL_WAIT_S = 100.0  # GPU-hour panels integrate in 1-minute steps: wait past one boundary
# Bursts of whole batches (4 rows) against 4 running + 4 sent behind them + 4 queued items:
# three requests of a burst fill the worker, the rest are refused (about 90 % on a quiet machine,
# more where the server is slower), far above the alert's 5 % beside the steady load.
BURST_SIZE = 16
BURST_INTERVAL_S = 0.25
BURST_ROWS = 4  # the workers' --max-batch-size
# A rate over 1m above 5% for 1m, evaluated every second, plus delivery; generous, a guard
# against a hang: a CI rehearsal on a loaded machine once missed 150 s.
REJECTION_WAIT_S = 240.0
# Batcher panels that read only the CUDA caching allocator's statistics: absent on a CPU
# replica (the series are absent, never zero), so they cannot show data without a GPU.
CUDA_ONLY_PANELS = {(batcher.UID, "Allocator memory"), (batcher.UID, "Allocator retries and OOMs")}
CUDA_ONLY_METRICS = {
    "autoglm_batcher_memory_allocated_bytes",
    "autoglm_batcher_memory_reserved_bytes",
    "autoglm_batcher_memory_reserved_unallocated_bytes",
    "autoglm_batcher_memory_inactive_split_bytes",
    "autoglm_batcher_memory_alloc_retries_total",
    "autoglm_batcher_memory_allocator_ooms_total",
}
# Batcher panels that read only the front workers' series (``--workers N``): a one-process
# batcher, as the stack runs, has none (absent, never zero).
WORKERS_ONLY_PANELS = {
    (batcher.UID, "Front worker restarts"),
    (batcher.UID, "Requests per front worker"),
}
WORKERS_ONLY_METRICS = {
    "autoglm_batcher_worker_restarts_total",
    "autoglm_batcher_worker_requests_total",
}


def _values(stack: LiveStack, uid: str) -> dict[str, str]:
    """Variable values that exist in the live stack, per dashboard: GPU 0 of node A runs pod
    llm/llama-...; the batcher serves the demo model; the predictor forecasts the request rate
    at 2 and 4 s; the local autoscaler is local/demo."""
    per_dashboard = {
        batcher.UID: {"model": MODEL_NAME},
        predictor.UID: {"target": FORECAST_TARGET, "horizon": str(HORIZONS_S[0])},
        autoscaler.UID: {"namespace": AUTOSCALER[0], "autoscaler": AUTOSCALER[1]},
    }
    gpu = {
        "node": NODE_A,
        "gpu": "0",
        "namespace": "llm",
        "workload": "llama",
        "instance": stack.exporter_a.address,
    }
    return {**per_dashboard.get(uid, gpu), "__rate_interval": "30s"}


def _range_query(stack: LiveStack, expr: str, start: float) -> list[dict[str, Any]]:
    reply = requests.get(
        f"{stack.prometheus.url}/api/v1/query_range",
        params={"query": expr, "start": start, "end": time.time(), "step": "2s"},
        timeout=20,
    ).json()
    assert reply["status"] == "success", f"{expr}: {reply}"
    return reply["data"]["result"]


def _dashboard_queries(stack: LiveStack) -> list[tuple[str, str, bool]]:
    """(where, concrete expr, instant?) of every panel target and variable, from the JSON files,
    but for the CUDA-only and workers-only panels (see CUDA_ONLY_PANELS)."""
    found = []
    for entry in DASHBOARDS:
        dashboard = json.loads((JSON_DIR / entry.filename).read_text())
        values = _values(stack, dashboard["uid"])
        for query in queries(dashboard):
            if query.kind == "annotation":  # events: checked after the faults below
                continue
            if (query.dashboard, query.where) in CUDA_ONLY_PANELS | WORKERS_ONLY_PANELS:
                continue
            where = f"{query.dashboard} / {query.where}"
            found.append((where, make_concrete(query.expr, values), query.instant))
    return found


@pytest.mark.parametrize(
    ("panels", "metrics"),
    [(CUDA_ONLY_PANELS, CUDA_ONLY_METRICS), (WORKERS_ONLY_PANELS, WORKERS_ONLY_METRICS)],
    ids=["cuda", "workers"],
)
def test_only_cuda_and_front_worker_series_are_exempt_from_the_data_check(panels, metrics) -> None:
    """The exemption must not hide anything but the allocator's CUDA-only series and the
    front workers' series."""
    dashboard = json.loads((JSON_DIR / "batcher.json").read_text())
    exempt = [q for q in queries(dashboard) if (q.dashboard, q.where) in panels]
    assert {(q.dashboard, q.where) for q in exempt} == panels
    for query in exempt:
        assert metric_names(make_concrete(query.expr)) <= metrics, query.expr


def test_every_panel_query_returns_data(live_stack: LiveStack) -> None:
    pending = _dashboard_queries(live_stack)
    assert len(pending) > 100
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
    """Break node A's GPUs at once (overheating, lost, Xid 79, ECC), stop node B's exporter and
    overload the first batcher worker, so the alerts' `for:` durations run concurrently."""
    live_stack.inject("temp-ramp:gpu=0:to=95:over=5s")
    live_stack.inject("lost:gpu=1")
    live_stack.inject("xid:gpu=2:code=79")
    live_stack.inject("ecc:gpu=3:dbe=2")
    live_stack.exporter_b.stop()
    overload = Bursts(
        live_stack.infer_url, BURST_SIZE, BURST_INTERVAL_S, REJECTION_WAIT_S + 30, BURST_ROWS
    )
    try:
        yield live_stack
    finally:
        overload.stop()


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
    assert alert["labels"]["Hostname"] == NODE_A
    assert alert["labels"]["severity"] == "critical"
    _check_annotations(alert, "GPULost")
    assert alert["annotations"]["summary"] == f"GPU 1 on {NODE_A} cannot be read."


def test_critical_xid_fires_with_its_code(faults: LiveStack) -> None:
    alerts = faults.webhook.wait_for(_named("GPUCriticalXid"), ALERT_WAIT_S, "GPUCriticalXid")
    # The application Xid 13 injected at start is not critical and must not have fired.
    assert [(a["labels"]["gpu"], a["labels"]["xid"]) for a in alerts] == [("2", "79")]
    alert = alerts[0]
    assert alert["labels"]["Hostname"] == NODE_A and alert["labels"]["severity"] == "critical"
    assert alert["labels"]["pod"] == "embed-0"  # the Xid series carry the pod that holds the GPU
    _check_annotations(alert, "GPUCriticalXid")
    assert alert["annotations"]["summary"] == f"GPU 2 on {NODE_A} reported Xid 79."
    assert "used by pod search/embed-0" in alert["annotations"]["description"]


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


def test_overloaded_batcher_fires_rejections(faults: LiveStack) -> None:
    """Bursts against a queue of 4 items: the share refused goes over 5% and stays
    there, and BatcherRejectingRequests reaches the webhook naming the replica and the model."""
    (alert,) = faults.webhook.wait_for(
        _named("BatcherRejectingRequests"), REJECTION_WAIT_S, "BatcherRejectingRequests"
    )
    assert alert["labels"]["instance"] == faults.worker_address
    assert alert["labels"]["model"] == MODEL_NAME
    assert alert["labels"]["job"] == "autoglm-batcher"
    assert alert["labels"]["severity"] == "warning"
    _check_annotations(alert, "BatcherRejectingRequests")
    share = float(alert["annotations"]["summary"].split(" refuses ")[1].split("%")[0]) / 100
    assert share > 0.05
    assert alert["annotations"]["summary"].endswith(f"of requests to {MODEL_NAME}.")
