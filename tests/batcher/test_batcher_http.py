"""The running server on 127.0.0.1, driven by real clients: requests and tritonclient.http."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable

import numpy as np
import pytest
import requests
import torch
import tritonclient.http as triton
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from autoglm.version import package_version
from autoglm.webconfig import WebConfig
from batcher.models.demo import factory as demo_factory
from tests.batcher.batcher_test_models import EchoModel
from tests.batcher.web_configs import ALICE, web_config_file
from tests.selfsigned import ScratchCA
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(120)


def json_request(x: list[list[float]], k: list[list[int]], **extra) -> dict:
    return {
        "inputs": [
            {"name": "x", "shape": [len(x), 3], "datatype": "FP32", "data": x},
            {"name": "k", "shape": [len(k), 1], "datatype": "INT32", "data": k},
        ],
        **extra,
    }


def triton_inputs(x: np.ndarray, k: np.ndarray, binary: bool) -> list[triton.InferInput]:
    tx = triton.InferInput("x", list(x.shape), "FP32")
    tx.set_data_from_numpy(x, binary_data=binary)
    tk = triton.InferInput("k", list(k.shape), "INT32")
    tk.set_data_from_numpy(k, binary_data=binary)
    return [tx, tk]


def test_health_and_metadata_with_requests_and_tritonclient(serve) -> None:
    server = serve(EchoModel())
    assert requests.get(f"{server.url}/v2/health/live", timeout=5).status_code == 200
    assert requests.get(f"{server.url}/v2/health/ready", timeout=5).json() == {"ready": True}
    meta = requests.get(f"{server.url}/v2", timeout=5).json()
    assert meta["name"] == "autoglm-batcher"
    assert meta["version"] == package_version()  # the installed release, as --version says
    assert {"binary_tensor_data", "model_repository"} <= set(meta["extensions"])

    client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        assert client.is_server_live() and client.is_server_ready()
        assert client.is_model_ready("echo")
        assert not client.is_model_ready("other")
        model = client.get_model_metadata("echo")
        assert model["inputs"] == [
            {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "k", "datatype": "INT32", "shape": [-1, 1]},
        ]
        assert [o["name"] for o in model["outputs"]] == ["y", "k_out"]
    finally:
        client.close()


def test_infer_with_json_over_requests(serve) -> None:
    server = serve(EchoModel())
    body = json_request([[1, 2, 3], [4, 5, 6]], [[7], [8]], id="req-1")
    reply = requests.post(f"{server.url}/v2/models/echo/infer", json=body, timeout=10)
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert answer["id"] == "req-1" and answer["model_name"] == "echo"
    outputs = {o["name"]: o for o in answer["outputs"]}
    assert outputs["y"] == {
        "name": "y",
        "datatype": "FP32",
        "shape": [2, 3],
        "data": [2, 4, 6, 8, 10, 12],
    }
    assert outputs["k_out"]["datatype"] == "INT32" and outputs["k_out"]["data"] == [7, 8]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer_with_tritonclient(serve, binary: bool) -> None:
    server = serve(EchoModel(), priority_levels=2, best_effort_priority=4)
    client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        x = np.arange(12, dtype=np.float32).reshape(4, 3)
        k = np.arange(4, dtype=np.int32).reshape(4, 1)
        outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("y", "k_out")]
        result = client.infer(
            "echo",
            triton_inputs(x, k, binary),
            outputs=outputs,
            priority=1,
            timeout=5_000_000,
        )
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        np.testing.assert_array_equal(result.as_numpy("k_out"), k)
        with pytest.raises(InferenceServerException, match="priority 3 is neither an online"):
            client.infer("echo", triton_inputs(x, k, binary), priority=3)
    finally:
        client.close()


def test_torch_module_results_match_the_model_called_directly(serve) -> None:
    server = serve(demo_factory(), model_name="demo")
    rows = np.random.default_rng(0).normal(size=(5, 16)).astype(np.float32)
    results = []

    def call(i: int) -> None:
        client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
        try:
            inp = triton.InferInput("input", [1, 16], "FP32")
            inp.set_data_from_numpy(rows[i : i + 1])
            results.append((i, client.infer("demo", [inp]).as_numpy("logits")))
        finally:
            client.close()

    # Concurrent callers: their rows may share a batch; each must get its own answer.
    threads = [threading.Thread(target=call, args=(i,)) for i in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    with torch.inference_mode():
        expected = demo_factory()(torch.from_numpy(rows)).numpy()
    assert len(results) == 5
    for i, logits in results:
        np.testing.assert_allclose(logits, expected[i : i + 1], rtol=1e-5, atol=1e-6)


MALFORMED = [
    ("not json", b"{inputs:", "not valid JSON"),
    ("not an object", b"[1, 2]", "JSON object"),
    ("no inputs", b'{"inputs": []}', "non-empty"),
    (
        "wrong datatype",
        json.dumps(json_request([[1, 2, 3]], [[1]]) | {}).replace('"FP32"', '"FP64"').encode(),
        "datatype 'FP64'; the model expects FP32",
    ),
    (
        "wrong shape",
        json.dumps(
            {
                "inputs": [
                    {"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]},
                    {"name": "k", "shape": [1, 1], "datatype": "INT32", "data": [1]},
                ]
            }
        ).encode(),
        "has shape [1, 4]; the model expects [-1, 3]",
    ),
    (
        "missing input",
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]}]}
        ).encode(),
        "missing input 'k'",
    ),
    (
        "unknown input",
        json.dumps(
            json_request([[1, 2, 3]], [[1]])
            | {
                "inputs": [
                    *json_request([[1, 2, 3]], [[1]])["inputs"],
                    {"name": "z", "shape": [1], "datatype": "FP32", "data": [1]},
                ]
            }
        ).encode(),
        "unknown input 'z'",
    ),
    (
        "too few values",
        json.dumps(
            {
                "inputs": [
                    {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3]},
                    {"name": "k", "shape": [2, 1], "datatype": "INT32", "data": [1, 2]},
                ]
            }
        ).encode(),
        "data has 3 values but shape [2, 3] needs 6",
    ),
    (
        "batch dimensions disagree",
        json.dumps(json_request([[1, 2, 3], [4, 5, 6]], [[1]])).encode(),
        "disagree on the batch dimension",
    ),
    (
        "float for an integer input",
        json.dumps(json_request([[1, 2, 3]], [[1.5]])).encode(),
        "INT32 data must be integers",
    ),
    (
        "bad timeout",
        json.dumps(json_request([[1, 2, 3]], [[1]], parameters={"timeout": -5})).encode(),
        "timeout must be a positive integer of microseconds",
    ),
    (
        # Past any tensor's depth, and deep enough to exhaust the C stack of a recursive parser.
        "nested 200,000 levels deep",
        b'{"inputs": ' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        "nested too deeply",
    ),
]


@pytest.mark.parametrize(
    ("body", "reason"), [m[1:] for m in MALFORMED], ids=[m[0] for m in MALFORMED]
)
def test_malformed_requests_get_400_and_never_reach_the_model(
    serve, body: bytes, reason: str
) -> None:
    model = EchoModel()
    server = serve(model)
    warmed_up = model.calls  # the start-up warm-up's calls
    reply = requests.post(
        f"{server.url}/v2/models/echo/infer",
        data=body,
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert reply.status_code == 400
    assert reason in reply.json()["error"]
    assert model.calls == warmed_up


def test_a_client_leaving_mid_body_is_no_error_and_the_server_serves_on(serve, caplog) -> None:
    """A client that closes its connection before the end of the body has gone away; aiohttp
    would log that as an error with a traceback, a page for nothing broken."""
    model = EchoModel()
    server = serve(model)
    warmed_up = model.calls
    host, port = server.url.removeprefix("http://").split(":")
    with caplog.at_level("INFO"), socket.create_connection((host, int(port))) as sock:
        sock.sendall(
            b"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n"
            b'Content-Type: application/json\r\n\r\n{"inputs": ['
        )
    body = json_request([[1, 2, 3]], [[1]])
    wait_until(
        lambda: requests.post(f"{server.url}/v2/models/echo/infer", json=body, timeout=10).ok,
        timeout=30,
        what="the next request to be served",
    )
    assert model.calls == warmed_up + 1
    assert not [r for r in caplog.records if r.levelname in ("ERROR", "CRITICAL")]


def test_binary_sizes_that_do_not_add_up_get_400(serve) -> None:
    model = EchoModel()
    server = serve(model)
    warmed_up = model.calls  # the start-up warm-up's calls
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1, 3],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": 12},
                },
                {
                    "name": "k",
                    "shape": [1, 1],
                    "datatype": "INT32",
                    "parameters": {"binary_data_size": 4},
                },
            ]
        }
    ).encode()
    body = header + np.zeros(3, np.float32).tobytes()  # k's 4 bytes are missing
    reply = requests.post(
        f"{server.url}/v2/models/echo/infer",
        data=body,
        headers={"Inference-Header-Content-Length": str(len(header))},
        timeout=10,
    )
    assert reply.status_code == 400
    assert "binary data ends after 0 of 4 bytes" in reply.json()["error"]
    assert model.calls == warmed_up


def test_oversized_body_gets_400(serve) -> None:
    model = EchoModel()
    server = serve(model, max_body_bytes=2048)
    warmed_up = model.calls  # the start-up warm-up's calls
    rows = [[1.0, 2.0, 3.0]] * 200
    reply = requests.post(
        f"{server.url}/v2/models/echo/infer",
        json=json_request(rows, [[1]] * 200),
        timeout=10,
    )
    assert reply.status_code == 400
    assert "--max-body-bytes" in reply.json()["error"]
    assert model.calls == warmed_up


def test_unknown_model_gets_404(serve) -> None:
    server = serve(EchoModel())
    reply = requests.post(
        f"{server.url}/v2/models/nope/infer", json=json_request([[1, 2, 3]], [[1]]), timeout=10
    )
    assert reply.status_code == 404 and "serves 'echo'" in reply.json()["error"]


def http_requests(text: str) -> dict[tuple[str, str], float]:
    """autoglm_http_requests_total of an exposition, by (path, code)."""
    return {
        (sample.labels["path"], sample.labels["code"]): sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "autoglm_http_requests"
        for sample in family.samples
        if sample.name == "autoglm_http_requests_total"
    }


def test_http_requests_are_counted_by_route_and_code_unknown_paths_as_other(serve) -> None:
    server = serve(EchoModel())
    for path in ("/nope", "/v2/nope/deeper", "/v2/models/echo/infer/extra"):
        reply = requests.get(server.url + path, timeout=10)
        assert reply.status_code == 404
        assert reply.headers["Content-Type"].startswith("application/json")
        assert reply.json() == {"error": f"no route for GET {path}; the KServe v2 API is under /v2"}
    wrong = requests.delete(f"{server.url}/v2/health/live", timeout=10)
    assert wrong.status_code == 405 and wrong.headers["Allow"] == "GET,HEAD"
    assert wrong.json() == {
        "error": "method DELETE not allowed on /v2/health/live; allowed: GET, HEAD"
    }
    for _ in range(2):
        assert requests.get(f"{server.url}/v2/health/ready", timeout=10).ok
    assert requests.get(f"{server.url}/v2/models/echo", timeout=10).ok
    assert requests.get(f"{server.url}/v2/models/other", timeout=10).status_code == 404
    body = json_request([[1, 2, 3]], [[1]])
    for model in ("echo", "echo", "other"):
        requests.post(f"{server.url}/v2/models/{model}/infer", json=body, timeout=10)
    assert (
        requests.post(f"{server.url}/v2/models/echo/infer", data=b"{", timeout=10).status_code
        == 400
    )

    text = requests.get(f"{server.url}/metrics", timeout=10).text
    # Inferences a model answered are its requests_total, not counted twice; the one no model
    # answered (unknown model) is counted here, as is every other route.
    assert http_requests(text) == {
        ("other", "404"): 3.0,
        ("other", "405"): 1.0,
        ("/v2/health/ready", "200"): 2.0,
        ("/v2/models/{name}", "200"): 1.0,
        ("/v2/models/{name}", "404"): 1.0,
        ("/v2/models/{name}/infer", "404"): 1.0,
    }
    assert 'autoglm_batcher_requests_total{model="echo",outcome="ok"} 2.0' in text
    assert 'autoglm_batcher_requests_total{model="echo",outcome="invalid"} 1.0' in text
    assert 'autoglm_http_request_duration_seconds_count{path="other"} 4.0' in text
    assert "/nope" not in text and "/v2/models/other" not in text  # never the raw path
    assert ("/metrics", "200") in http_requests(
        requests.get(f"{server.url}/metrics", timeout=10).text
    )


def test_full_queue_is_refused_with_429_and_accepted_work_completes(serve) -> None:
    """The queue bound counts what waits: one request runs (held), the next is sent to wait
    behind it on the device (the look-ahead), one waits in the queue, the fourth is refused."""
    model = EchoModel()
    server = serve(model, max_batch_size=1, max_queue=1)
    model.entered.clear()  # set by the start-up warm-up
    model.release.clear()  # the first batch holds the device until released
    url = f"{server.url}/v2/models/echo/infer"
    replies: dict[str, requests.Response] = {}

    def post(tag: str) -> None:
        replies[tag] = requests.post(url, json=json_request([[1, 2, 3]], [[1]]), timeout=30)

    def wait_for(condition: Callable[[], bool]) -> None:
        deadline = time.monotonic() + 10
        while not condition() and time.monotonic() < deadline:
            time.sleep(0.01)

    threads = {tag: threading.Thread(target=post, args=(tag,)) for tag in ("running", "next")}
    threads["running"].start()
    assert model.entered.wait(timeout=10)
    threads["next"].start()
    wait_for(lambda: server.batcher.in_flight_requests == 2)
    threads["queued"] = threading.Thread(target=post, args=("queued",))
    threads["queued"].start()
    wait_for(lambda: server.batcher.queued_items == 1)
    refused = requests.post(url, json=json_request([[1, 2, 3]], [[1]]), timeout=10)
    model.release.set()
    for thread in threads.values():
        thread.join(timeout=30)
    assert refused.status_code == 429
    assert "queue full" in refused.json()["error"]
    assert int(refused.headers["Retry-After"]) >= 1
    assert {tag: reply.status_code for tag, reply in replies.items()} == dict.fromkeys(
        ("running", "next", "queued"), 200
    )


def test_a_request_predicted_past_the_slo_is_refused_with_429_and_retry_after(serve) -> None:
    # Every batch takes 0.4 s; SLO 0.6 s. Sent within 0.2 s of a batch starting, a new request
    # would finish after 0.6 s: refused at once. One with its own 10 s timeout is served.
    model = EchoModel(delay_seconds=0.4)
    server = serve(model, max_batch_size=2, slo_seconds=0.6, warmup_repeats=2)
    model.entered.clear()  # set by the start-up warm-up
    url = f"{server.url}/v2/models/echo/infer"
    replies: dict[str, requests.Response] = {}

    def post(tag: str, **extra: object) -> None:
        body = json_request([[1, 2, 3]], [[1]], **extra)
        replies[tag] = requests.post(url, json=body, timeout=30)

    first = threading.Thread(target=post, args=("running",))
    first.start()
    assert model.entered.wait(timeout=10)
    refused = requests.post(url, json=json_request([[1, 2, 3]], [[1]]), timeout=10)
    patient = threading.Thread(
        target=post, args=("patient",), kwargs={"parameters": {"timeout": 10_000_000}}
    )
    patient.start()
    first.join(timeout=30)
    patient.join(timeout=30)
    assert refused.status_code == 429
    error = refused.json()["error"]
    assert "past the 0.600 s latency SLO" in error and "another replica" in error
    assert int(refused.headers["Retry-After"]) >= 1
    assert replies["running"].status_code == 200 and replies["patient"].status_code == 200
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    assert 'autoglm_batcher_rejections_total{model="echo",reason="past_deadline"} 1.0' in text
    assert 'autoglm_batcher_rejections_total{model="echo",reason="queue_full"} 0.0' in text
    assert 'autoglm_batcher_requests_total{model="echo",outcome="rejected"} 1.0' in text


def test_metrics_endpoint_counts_outcomes(serve) -> None:
    server = serve(EchoModel())
    url = f"{server.url}/v2/models/echo/infer"
    for _ in range(3):
        assert requests.post(url, json=json_request([[1, 2, 3]], [[1]]), timeout=10).ok
    assert requests.post(url, data=b"nope", timeout=10).status_code == 400
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    assert 'autoglm_batcher_requests_total{model="echo",outcome="ok"} 3.0' in text
    assert 'autoglm_batcher_requests_total{model="echo",outcome="invalid"} 1.0' in text
    assert 'autoglm_build_info{component="batcher",' in text  # the server says what it runs
    for name in (
        "process_start_time_seconds",
        "process_resident_memory_bytes",
        "autoglm_batcher_queue_items",
        "autoglm_batcher_batch_size_items_bucket",
        "autoglm_batcher_queue_latency_seconds_bucket",
        "autoglm_batcher_compute_latency_seconds_bucket",
        "autoglm_batcher_request_latency_seconds_bucket",
        "autoglm_batcher_batch_cap_items",
        "autoglm_batcher_device_busy_seconds_total",
        "autoglm_batcher_device_busy_ratio",
        "autoglm_batcher_oom_events_total",
        "autoglm_batcher_batch_splits_total",
        "autoglm_batcher_slo_seconds",
        "autoglm_batcher_ready",
        "autoglm_batcher_in_flight_requests",
    ):
        assert name in text, name
    assert 'autoglm_batcher_request_latency_seconds_count{model="echo"} 3.0' in text
    # On CPU the allocator statistics do not apply, so they are absent rather than zero.
    assert "autoglm_batcher_memory_reserved_bytes" not in text
    openmetrics = requests.get(
        f"{server.url}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0"},
        timeout=10,
    )
    assert openmetrics.headers["Content-Type"].startswith("application/openmetrics-text")
    assert openmetrics.text.rstrip().endswith("# EOF")
    odd = requests.get(  # an Accept prometheus_client cannot read: the text format
        f"{server.url}/metrics",
        headers={"Accept": "application/openmetrics-text; version=abc"},
        timeout=10,
    )
    assert odd.status_code == 200 and odd.headers["Content-Type"].startswith("text/plain")


def test_tls_and_basic_auth_from_the_web_config(serve, tmp_path) -> None:
    ca = ScratchCA(tmp_path)
    config_file = web_config_file(ca)
    server = serve(EchoModel(), web_config=WebConfig.load(config_file))
    url = f"https://127.0.0.1:{server.server.port}/v2/models/echo/infer"
    body = json_request([[1, 2, 3]], [[1]])
    denied = requests.post(url, json=body, verify=str(ca.cert_file), timeout=10)
    assert denied.status_code == 401
    assert denied.headers["WWW-Authenticate"] == 'Basic realm="autoglm-batcher"'
    assert denied.json() == {"error": "authentication required"}
    allowed = requests.post(
        url,
        json=body,
        verify=str(ca.cert_file),
        headers={"Authorization": ALICE},
        timeout=10,
    )
    assert allowed.status_code == 200
    assert allowed.json()["outputs"][0]["data"] == [2, 4, 6]
    metrics = requests.get(
        url.replace("/v2/models/echo/infer", "/metrics"),
        verify=str(ca.cert_file),
        headers={"Authorization": ALICE},
        timeout=10,
    )
    # The web config follows its file: its reload outcomes are the batcher's metrics too.
    assert "autoglm_web_config_last_reload_successful 1.0" in metrics.text
    # The refused inference reached no model: counted as an HTTP request, the served one is not.
    assert http_requests(metrics.text) == {("/v2/models/{name}/infer", "401"): 1.0}
    # Health stays open, as a kubelet probe sends no credentials; nothing else does.
    base = url.removesuffix("/v2/models/echo/infer")
    for path in ("/v2/health/live", "/v2/health/ready"):
        assert requests.get(base + path, verify=str(ca.cert_file), timeout=10).status_code == 200
    for path in ("/v2", "/v2/models/echo", "/v2/models/echo/ready", "/v2/repository/index"):
        method = requests.post if path.endswith("index") else requests.get
        assert method(base + path, verify=str(ca.cert_file), timeout=10).status_code == 401


def test_client_certificates_and_headers_from_the_web_config(serve, tmp_path) -> None:
    """The batcher accepts TLS through the kernel's listener, as every component does: a client
    certificate whose SAN is not allowed is refused at the handshake and counted."""
    ca = ScratchCA(tmp_path)
    reader, intruder = ca.client("reader", "reader.example"), ca.client("x", "intruder.example")
    config_file = web_config_file(
        ca, basic_auth=False, client_sans=["reader.example"], headers={"X-Frame-Options": "deny"}
    )
    server = serve(EchoModel(), web_config=WebConfig.load(config_file))
    base = f"https://127.0.0.1:{server.server.port}"
    as_reader = {"verify": str(ca.cert_file), "cert": (str(reader.cert), str(reader.key))}
    ready = requests.get(f"{base}/v2/health/ready", timeout=10, **as_reader)
    assert ready.status_code == 200
    assert ready.headers["X-Frame-Options"] == "deny"
    unknown = requests.get(f"{base}/nope", timeout=10, **as_reader)  # aiohttp's own refusal
    assert unknown.status_code == 404 and unknown.headers["X-Frame-Options"] == "deny"
    assert "no route for GET /nope" in unknown.json()["error"]
    with pytest.raises(requests.exceptions.RequestException):
        requests.get(
            f"{base}/v2/health/ready",
            verify=str(ca.cert_file),
            cert=(str(intruder.cert), str(intruder.key)),
            timeout=10,
        )
    with pytest.raises(requests.exceptions.RequestException):
        requests.get(f"{base}/v2/health/ready", verify=str(ca.cert_file), timeout=10)

    def refusals_counted() -> bool:
        metrics = requests.get(f"{base}/metrics", timeout=10, **as_reader).text
        return "autoglm_http_tls_handshake_errors_total 2.0" in metrics

    # The server counts a refusal just after the client has seen it: poll.
    wait_until(refusals_counted, timeout=30, what="the two refused handshakes to be counted")
