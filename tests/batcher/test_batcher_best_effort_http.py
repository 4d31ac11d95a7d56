"""The best-effort class over real HTTP: a real server, requests and tritonclient's ``priority``."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest
import requests
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families

from tests.batcher.batcher_test_models import EchoModel
from tests.batcher.test_batcher_cli import LogReader, batcher_process
from tests.batcher.test_batcher_http import json_request, triton_inputs
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


def samples(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample on /metrics, keyed by (name, sorted labels without ``model``)."""
    text = requests.get(f"{url}/metrics", timeout=5).text
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = tuple(sorted((k, v) for k, v in sample.labels.items() if k != "model"))
            found[(sample.name, labels)] = sample.value
    return found


def class_requests(found: dict, request_class: str, outcome: str) -> float:
    key = (("class", request_class), ("outcome", outcome))
    return found[("autoglm_batcher_class_requests_total", key)]


def online_requests(found: dict, outcome: str) -> float:
    return found[("autoglm_batcher_requests_total", (("outcome", outcome),))]


def test_best_effort_by_name_is_served_and_counted_apart_from_online(serve) -> None:
    server = serve(EchoModel(), warmup_repeats=0)
    url = f"{server.url}/v2/models/echo/infer"
    body = json_request([[1, 2, 3]], [[7]], parameters={"priority": "best-effort"})
    reply = requests.post(url, json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    assert {o["name"]: o["data"] for o in reply.json()["outputs"]}["y"] == [2, 4, 6]
    online = json_request([[1, 1, 1]], [[1]], parameters={"priority": "online"})
    assert requests.post(url, json=online, timeout=10).status_code == 200
    found = samples(server.url)
    assert class_requests(found, "best_effort", "ok") == 1
    assert class_requests(found, "online", "ok") == 1
    assert online_requests(found, "ok") == 1  # the existing series: online only
    assert found[("autoglm_batcher_request_latency_seconds_count", ())] == 1
    assert found[("autoglm_batcher_class_batch_size_count", (("class", "best_effort"),))] == 1
    busy = found[("autoglm_batcher_class_busy_seconds_total", (("class", "best_effort"),))]
    assert busy > 0
    assert found[("autoglm_batcher_best_effort_share", ())] == 1.0
    assert found[("autoglm_batcher_best_effort_quantum_seconds", ())] == pytest.approx(0.025)
    assert found[("autoglm_batcher_best_effort_throttled", ())] == 0


def test_tritonclient_integer_priorities_choose_the_class(serve) -> None:
    server = serve(EchoModel(), warmup_repeats=0)  # one level: 0 and 1 online, 2 and up best-effort
    client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        x = np.arange(6, dtype=np.float32).reshape(2, 3)
        k = np.arange(2, dtype=np.int32).reshape(2, 1)
        for priority in (2, 7, 1, 0):
            result = client.infer("echo", triton_inputs(x, k, True), priority=priority)
            np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
    finally:
        client.close()
    found = samples(server.url)
    assert class_requests(found, "best_effort", "ok") == 2
    assert class_requests(found, "online", "ok") == 2


@pytest.mark.parametrize(
    ("priority", "reason"),
    [("batch", "'batch' is not a request class"), (1.5, "parameters.priority must be")],
)
def test_unknown_priorities_get_400_with_the_reason(serve, priority, reason) -> None:
    server = serve(EchoModel(), warmup_repeats=0)
    body = json_request([[1, 2, 3]], [[7]], parameters={"priority": priority})
    reply = requests.post(f"{server.url}/v2/models/echo/infer", json=body, timeout=10)
    assert reply.status_code == 400
    assert reason in reply.json()["error"]


def test_throttled_best_effort_gets_429_with_a_derived_retry_after(serve) -> None:
    # Each batch takes 30 ms against a 20 ms SLO: every online request breaks it, the slack is
    # negative and best-effort work is throttled.
    server = serve(
        EchoModel(delay_seconds=0.03),
        warmup_repeats=0,
        slo_seconds=0.02,
        best_effort_window_seconds=3.0,
    )
    url = f"{server.url}/v2/models/echo/infer"
    assert requests.post(url, json=json_request([[1, 2, 3]], [[7]]), timeout=10).ok
    time.sleep(0.5)  # past one control step (window / 10)
    body = json_request([[1, 2, 3]], [[7]], parameters={"priority": "best-effort"})
    reply = requests.post(url, json=body, timeout=10)
    assert reply.status_code == 429
    assert "best-effort work is paused" in reply.json()["error"]
    # the slow request leaves the 3 s window about 2.5 s from now, plus a 0.3 s control step
    assert 2 <= int(reply.headers["Retry-After"]) <= 3
    found = samples(server.url)
    assert found[("autoglm_batcher_best_effort_refusals_total", (("reason", "throttled"),))] == 1
    assert found[("autoglm_batcher_best_effort_throttled", ())] == 1
    assert found[("autoglm_batcher_online_latency_slack_seconds", ())] < 0
    assert online_requests(found, "rejected") == 0


def test_sigterm_drains_queued_best_effort_requests_with_the_online_ones() -> None:
    proc = batcher_process(
        *("--model", "tests.batcher.batcher_test_models:slow_echo", "--listen", "127.0.0.1:0"),
        *("--max-batch-size", "2", "--slo-seconds", "5", "--best-effort-max-queue", "32"),
    )
    try:
        logs = LogReader(proc)
        url = f"http://127.0.0.1:{logs.wait_for('serving')['port']}"
        replies: list[requests.Response] = []

        def post(i: int, best_effort: bool) -> None:
            extra = {"parameters": {"priority": "best-effort"}} if best_effort else {}
            body = json_request([[1, 2, 3]], [[i]], **extra)
            replies.append(requests.post(f"{url}/v2/models/echo/infer", json=body, timeout=60))

        # 20 best-effort requests, 2 online; batches of 2 at 0.2 s: seconds of queued work
        threads = [threading.Thread(target=post, args=(i, i < 20)) for i in range(22)]
        for t in threads:
            t.start()

        def all_accepted_best_effort_waiting() -> bool:
            found = samples(url)
            waiting = found[("autoglm_batcher_best_effort_queue_items", ())]
            accepted = (
                class_requests(found, "best_effort", "ok")
                + class_requests(found, "online", "ok")
                + waiting
                + found[("autoglm_batcher_queue_requests", ())]
                + found[("autoglm_batcher_in_flight_requests", ())]
            )
            return waiting > 0 and accepted == 22

        wait_until(
            all_accepted_best_effort_waiting,
            timeout=30,
            what="best-effort requests to be queued",
            interval=0.01,
        )
        proc.send_signal(signal.SIGTERM)
        logs.wait_for("draining")
        late = json_request([[1, 2, 3]], [[99]], parameters={"priority": "best-effort"})
        refused = requests.post(f"{url}/v2/models/echo/infer", json=late, timeout=30)
        for t in threads:
            t.join(timeout=60)
        assert logs.wait_for("stopped")["drained"] is True
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert refused.status_code == 503
    assert sorted(r.status_code for r in replies) == [200] * 22
    assert sorted(r.json()["outputs"][1]["data"][0] for r in replies) == list(range(22))
