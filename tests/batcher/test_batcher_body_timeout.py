"""``--body-timeout-seconds`` on the batcher, against raw-socket clients: a stalled or trickled
body is answered 408 in the protocol's JSON and its connection closed, on the inference routes
(JSON and binary) and the repository's, in one process and through front workers; a large body
that keeps coming on a slow link is served; a bad value stops the start."""

from __future__ import annotations

import json

import pytest
import requests

from autoglm.web.body_timeout import MIN_BODY_RATE
from batcher import oip
from tests.batcher.batcher_test_models import EchoModel
from tests.batcher.test_batcher_cli import start_up_error
from tests.batcher.test_batcher_workers import ECHO, Served, metric_values
from tests.stalled_body import head, send_slowly, stall, trickle

pytestmark = pytest.mark.timeout(120)

TIMEOUT_S = 0.5
# The trickle's drip is far inside its pause bound, so a drip late on a busy machine is not cut
# as a stall before the minimum rate cuts the trickle.
TRICKLE_TIMEOUT_S = 2.0
INFER = "/v2/models/echo/infer"
TIMEOUTS_TOTAL = "autoglm_http_request_body_timeouts_total"
JSON_BODY = json.dumps(
    {
        "inputs": [
            {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
            {"name": "k", "shape": [1, 1], "datatype": "INT32", "data": [7]},
        ]
    }
).encode()

# Each way the batcher reads a body: the JSON and binary forms of an inference, and a
# repository request (read by its own handler, not the inference codec).
STALLED = {
    "json infer": ("POST", INFER, {"Content-Type": "application/json"}),
    "binary infer": ("POST", INFER, {oip.HEADER_LENGTH: "200"}),
    "repository": ("POST", "/v2/repository/index", {"Content-Type": "application/json"}),
}


def timeouts(metrics_text: str) -> float:
    return metric_values(metrics_text, TIMEOUTS_TOTAL).get(TIMEOUTS_TOTAL, 0.0)


@pytest.mark.parametrize("kind", STALLED)
def test_a_stalled_body_gets_408_in_json_and_never_reaches_the_model(serve, kind: str) -> None:
    model = EchoModel()
    server = serve(model, body_timeout_seconds=TIMEOUT_S)
    warmed_up = model.calls
    method, path, headers = STALLED[kind]
    answer = stall(server.server.port, head(method, path, 1000, headers), b'{"inputs": [')
    assert answer.status == 408
    assert answer.headers["connection"] == "close"
    error = json.loads(answer.body)["error"]
    assert error.startswith(f"request body timed out: nothing arrived for {TIMEOUT_S:g} s")
    assert model.calls == warmed_up
    assert timeouts(requests.get(f"{server.url}/metrics", timeout=10).text) == 1


def test_a_trickled_inference_body_gets_408(serve) -> None:
    server = serve(EchoModel(), body_timeout_seconds=TRICKLE_TIMEOUT_S)
    request = head("POST", INFER, 1 << 20, {"Content-Type": "application/json"})
    answer = trickle(server.server.port, request, every_s=0.1)
    assert answer.status == 408
    assert "slower than" in json.loads(answer.body)["error"]


def test_a_large_body_on_a_slow_link_is_served(serve) -> None:
    """Padded with whitespace to many times what the minimum rate sends within the timeout, and
    sent in pieces over about twice the timeout: served, as it keeps coming."""
    timeout_s, pieces, pause_s = 1.0, 10, 0.2
    padding = b" " * (int(2 * MIN_BODY_RATE * pause_s * pieces) - len(JSON_BODY))
    body = padding + JSON_BODY
    server = serve(EchoModel(), body_timeout_seconds=timeout_s)
    request = head(
        "POST", INFER, len(body), {"Content-Type": "application/json", "Connection": "close"}
    )
    answer = send_slowly(server.server.port, request, body, pieces, pause_s)
    assert answer.status == 200
    assert json.loads(answer.body)["outputs"][0]["data"] == [2, 4, 6]


@pytest.mark.slow
def test_front_workers_time_out_stalled_bodies_too(served: list[Served]) -> None:
    """Through a front worker: an inference it decodes itself, and a repository request it
    passes to the engine."""
    server = Served("--model", ECHO, "--workers", "1", "--body-timeout-seconds", str(TIMEOUT_S))
    served.append(server)
    for kind in ("json infer", "repository"):
        method, path, headers = STALLED[kind]
        answer = stall(server.port, head(method, path, 1000, headers), b"{")
        assert answer.status == 408, kind
        assert "request body timed out" in json.loads(answer.body)["error"]
    assert timeouts(server.metrics()) == 2
    assert requests.post(server.url + INFER, data=JSON_BODY, timeout=30).status_code == 200


@pytest.mark.slow
@pytest.mark.parametrize("how", ["flag", "config"])
def test_a_body_timeout_that_is_not_positive_stops_the_start(tmp_path, how: str) -> None:
    if how == "flag":
        line = start_up_error("--body-timeout-seconds", "0")
    else:
        config_file = tmp_path / "batcher.yml"
        config_file.write_text("body_timeout_seconds: 0\n")
        line = start_up_error("--config", str(config_file))
    assert ("--body-timeout-seconds" if how == "flag" else "body_timeout_seconds") in line
    assert "must be > 0, got 0" in line
