"""The gRPC face against a real server: tritonclient.grpc unchanged, and tritonclient's own stubs.

Each test starts the real HTTP + gRPC server (one engine) on 127.0.0.1 and talks to it with
``tritonclient.grpc`` (raw contents) or with tritonclient's generated stub (typed contents,
trailing metadata), independent implementations of the same protocol.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import grpc
import ml_dtypes
import numpy as np
import pytest
import requests
import tritonclient.grpc as triton
import yaml
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from autoglm.version import package_version
from autoglm.webconfig import WebConfig
from batcher.model import TensorSpec
from tests.batcher.batcher_test_models import EchoModel
from tests.batcher.conftest import ServerThread
from tests.batcher.test_batcher_best_effort_http import samples
from tests.batcher.test_batcher_cli import start_up_error
from tests.batcher.test_batcher_http import json_request
from tests.batcher.test_batcher_oip_datatypes import TaggedScaler, TextModel
from tests.batcher.web_configs import ALICE, web_config_file
from tests.selfsigned import ScratchCA
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(120), pytest.mark.slow]

NUMERIC = [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
    "FP16", "FP32", "FP64",
]  # fmt: skip


class Identity:
    """Batch callable answering each request's ``x`` as ``y``, for one datatype."""

    model_name = "identity"

    def __init__(self, datatype: str) -> None:
        self.input_specs = (TensorSpec("x", datatype, (3,)),)
        self.output_specs = (TensorSpec("y", datatype, (3,)),)

    def __call__(self, batch: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        return [{"y": payload["x"]} for payload in batch]


def grpc_url(server) -> str:
    return f"127.0.0.1:{server.server.grpc.port}"


def echo_inputs(x: np.ndarray, k: np.ndarray) -> list[triton.InferInput]:
    tx = triton.InferInput("x", list(x.shape), "FP32")
    tx.set_data_from_numpy(x)
    tk = triton.InferInput("k", list(k.shape), "INT32")
    tk.set_data_from_numpy(k)
    return [tx, tk]


def extremes(datatype: str) -> np.ndarray:
    """Two rows at the edges of the datatype's range, where a wrong width or sign shows."""
    if datatype == "BOOL":
        return np.array([[True, False, True], [False, False, True]])
    dtype = np.dtype(triton.triton_to_np_dtype(datatype))
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    return np.array([[info.min, 0, info.max], [1, info.max, info.min]], dtype=dtype)


def test_health_metadata_and_config_through_tritonclient(serve) -> None:
    server = serve(EchoModel(), warmup_repeats=0, grpc_listen="127.0.0.1:0", max_batch_size=16)
    client = triton.InferenceServerClient(grpc_url(server))
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("echo")
    with pytest.raises(InferenceServerException, match="serves 'echo' version '1'"):
        client.is_model_ready("echo", "2")
    metadata = client.get_server_metadata()
    assert "binary_tensor_data" in metadata.extensions
    assert metadata.version == package_version()
    meta = client.get_model_metadata("echo", as_json=True)
    assert meta["name"] == "echo"
    assert [(t["name"], t["datatype"], t["shape"]) for t in meta["inputs"]] == [
        ("x", "FP32", ["-1", "3"]),
        ("k", "INT32", ["-1", "1"]),
    ]
    config = client.get_model_config("echo").config
    assert config.max_batch_size == 16
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [
        ("x", triton.model_config_pb2.TYPE_FP32, [3]),
        ("k", triton.model_config_pb2.TYPE_INT32, [1]),
    ]
    with pytest.raises(InferenceServerException, match="unknown model 'nope'") as missing:
        client.get_model_metadata("nope")
    assert missing.value.status() == "StatusCode.NOT_FOUND"


@pytest.mark.parametrize("datatype", NUMERIC)
def test_every_numeric_datatype_round_trips_as_raw_contents(serve, datatype) -> None:
    server = serve(Identity(datatype), warmup_repeats=0, grpc_listen="127.0.0.1:0")
    client = triton.InferenceServerClient(grpc_url(server))
    x = extremes(datatype)
    tensor = triton.InferInput("x", list(x.shape), datatype)
    tensor.set_data_from_numpy(x)
    result = client.infer("identity", [tensor])
    y = result.as_numpy("y")
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y, x)
    assert result.get_output("y").datatype == datatype


def test_bytes_and_bf16_reach_the_model_as_bytes_and_exact_bfloat16(serve) -> None:
    model = TaggedScaler()
    server = serve(model, warmup_repeats=0, grpc_listen="127.0.0.1:0")
    client = triton.InferenceServerClient(grpc_url(server))
    tags = np.array([b"a\x00b", "héllo".encode()], dtype=object)
    x = np.array([[1.5, -2.25], [3.0, 0.1]], dtype=ml_dtypes.bfloat16)
    tag = triton.InferInput("tag", [2], "BYTES")
    tag.set_data_from_numpy(tags)
    values = triton.InferInput("x", [2, 2], "BF16")
    values.set_data_from_numpy(x)
    result = client.infer("scaler", [tag, values])
    seen_tags, seen_dtype = model.seen[0]
    assert seen_tags.tolist() == [b"a\x00b", "héllo".encode()]  # the NUL byte survives
    assert str(seen_dtype) == "torch.bfloat16"
    assert result.as_numpy("tag_upper").tolist() == [b"A\x00B", "HÉLLO".encode()]
    y = result.as_numpy("y")
    assert y.dtype == x.dtype
    np.testing.assert_array_equal(y.astype(np.float32), x.astype(np.float32) * 2)


def test_typed_contents_and_a_chosen_output_through_the_generated_stub(serve) -> None:
    server = serve(EchoModel(), warmup_repeats=0, grpc_listen="127.0.0.1:0")
    with grpc.insecure_channel(grpc_url(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        request = service_pb2.ModelInferRequest(model_name="echo", id="req-7")
        x = request.inputs.add(name="x", datatype="FP32", shape=[2, 3])
        x.contents.fp32_contents.extend([1, 2, 3, 4, 5, 6])
        k = request.inputs.add(name="k", datatype="INT32", shape=[2, 1])
        k.contents.int_contents.extend([7, -8])
        request.outputs.add(name="y")
        response = stub.ModelInfer(request, timeout=10)
    assert response.id == "req-7"
    assert [o.name for o in response.outputs] == ["y"]
    assert list(response.outputs[0].shape) == [2, 3]
    y = np.frombuffer(response.raw_output_contents[0], dtype="<f4")
    assert y.tolist() == [2, 4, 6, 8, 10, 12]


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        (lambda r: setattr(r.inputs[0], "datatype", "FP64"), "the model expects FP32"),
        (lambda r: r.inputs[0].shape.__setitem__(1, 4), "the model expects [-1, 3]"),
        (lambda r: r.raw_input_contents.__setitem__(0, b"\x00" * 5), "raw contents hold 5 bytes"),
        (lambda r: r.inputs.pop(), "missing input 'k'"),
        (lambda r: setattr(r.parameters["priority"], "string_param", "batch"), "request class"),
    ],
)
def test_bad_requests_are_invalid_argument_with_the_reason(serve, change, reason) -> None:
    server = serve(EchoModel(), warmup_repeats=0, grpc_listen="127.0.0.1:0")
    request = service_pb2.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    request.inputs.add(name="k", datatype="INT32", shape=[1, 1])
    request.raw_input_contents.extend([np.ones(3, "<f4").tobytes(), np.ones(1, "<i4").tobytes()])
    change(request)
    if len(request.inputs) == 1:
        request.raw_input_contents.pop()
    with grpc.insecure_channel(grpc_url(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelInfer(request, timeout=10)
    assert failed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert reason in failed.value.details()
    found = samples(server.url)
    code = (("code", "INVALID_ARGUMENT"), ("method", "ModelInfer"))
    assert found[("autoglm_batcher_grpc_requests_total", code)] == 1
    if "request class" not in reason:  # the engine judges the class name, and counts it itself
        assert found[("autoglm_batcher_requests_total", (("outcome", "invalid"),))] == 1


def test_grpc_and_http_requests_share_batches(serve) -> None:
    model = EchoModel()
    server = serve(model, warmup_repeats=0, grpc_listen="127.0.0.1:0", max_batch_size=8)
    url = f"{server.url}/v2/models/echo/infer"
    client = triton.InferenceServerClient(grpc_url(server))
    model.release.clear()
    answers: dict[str, object] = {}

    def over_http(key: str, value: float) -> None:
        body = json_request([[value, value, value]], [[1]])
        answers[key] = requests.post(url, json=body, timeout=30).json()["outputs"][0]["data"]

    def over_grpc(key: str, value: float) -> None:
        x = np.full((1, 3), value, dtype=np.float32)
        result = client.infer("echo", echo_inputs(x, np.ones((1, 1), dtype=np.int32)))
        answers[key] = result.as_numpy("y").ravel().tolist()

    first = threading.Thread(target=over_http, args=("first", 1.0))
    first.start()
    assert model.entered.wait(10)  # the first batch holds the device; the rest queue up
    queued = [
        threading.Thread(target=over_grpc, args=("g1", 2.0)),
        threading.Thread(target=over_grpc, args=("g2", 3.0)),
        threading.Thread(target=over_http, args=("h1", 4.0)),
    ]
    for thread in queued:
        thread.start()
    deadline = time.monotonic() + 10
    while server.batcher.queued_items < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    model.release.set()
    for thread in [first, *queued]:
        thread.join(30)
    assert answers == {"first": [2] * 3, "g1": [4] * 3, "g2": [6] * 3, "h1": [8] * 3}
    assert model.calls == 2  # the three queued requests, gRPC and HTTP, ran as one batch


def test_best_effort_refusal_is_resource_exhausted_with_retry_after(serve) -> None:
    server = serve(
        EchoModel(delay_seconds=0.03),
        warmup_repeats=0,
        slo_seconds=0.02,
        best_effort_window_seconds=3.0,
        grpc_listen="127.0.0.1:0",
    )
    client = triton.InferenceServerClient(grpc_url(server))
    x, k = np.ones((1, 3), dtype=np.float32), np.ones((1, 1), dtype=np.int32)
    client.infer("echo", echo_inputs(x, k))  # breaks the 20 ms SLO: best-effort is throttled
    time.sleep(0.5)  # past one control step (window / 10)
    with pytest.raises(InferenceServerException, match="best-effort work is paused") as refused:
        client.infer("echo", echo_inputs(x, k), priority=2)  # one level: 2 is best-effort
    assert refused.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    request = service_pb2.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    request.inputs.add(name="k", datatype="INT32", shape=[1, 1])
    request.raw_input_contents.extend([x.tobytes(), k.tobytes()])
    request.parameters["priority"].string_param = "best-effort"
    with grpc.insecure_channel(grpc_url(server)) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as failed:
            stub.ModelInfer(request, timeout=10)
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert 1 <= int(dict(failed.value.trailing_metadata())["retry-after"]) <= 3
    found = samples(server.url)
    assert found[("autoglm_batcher_best_effort_refusals_total", (("reason", "throttled"),))] == 2


def test_a_deadline_passed_in_the_queue_is_deadline_exceeded_and_never_run(serve) -> None:
    """A call whose client deadline (``client_timeout``) or request ``timeout`` passes while it
    waits behind a held batch: DEADLINE_EXCEEDED, the model never sees it, and it is counted
    (cancelled by the client, timed out by the engine); the next call is answered."""
    model = EchoModel()
    server = serve(model, warmup_repeats=0, grpc_listen="127.0.0.1:0", max_batch_size=1)
    client = triton.InferenceServerClient(grpc_url(server))
    x, k = np.ones((1, 3), dtype=np.float32), np.ones((1, 1), dtype=np.int32)
    model.release.clear()
    held = threading.Thread(target=client.infer, args=("echo", echo_inputs(x, k)))
    held.start()
    assert model.entered.wait(10)
    for deadline in ({"client_timeout": 0.5}, {"timeout": 500_000}):
        with pytest.raises(InferenceServerException) as expired:
            client.infer("echo", echo_inputs(x, k), **deadline)
        assert expired.value.status() == "StatusCode.DEADLINE_EXCEEDED", expired.value
    model.release.set()
    held.join(10)
    np.testing.assert_array_equal(client.infer("echo", echo_inputs(x, k)).as_numpy("y"), x * 2)
    assert model.items == 2
    found = samples(server.url)
    outcomes = {
        outcome: found[("autoglm_batcher_requests_total", (("outcome", outcome),))]
        for outcome in ("ok", "cancelled", "timeout")
    }
    assert outcomes == {"ok": 2, "cancelled": 1, "timeout": 1}


def test_draining_server_answers_unavailable_and_not_ready(serve) -> None:
    model = EchoModel()
    server = serve(model, warmup_repeats=0, grpc_listen="127.0.0.1:0")
    client = triton.InferenceServerClient(grpc_url(server))
    x, k = np.ones((1, 3), dtype=np.float32), np.ones((1, 1), dtype=np.int32)
    model.release.clear()
    held = threading.Thread(target=client.infer, args=("echo", echo_inputs(x, k)))
    held.start()
    assert model.entered.wait(10)
    drained = asyncio.run_coroutine_threadsafe(server.batcher.drain(10), server.loop)
    wait_until(
        lambda: not server.batcher.accepting,
        timeout=5,
        what="the drain to stop accepting",
        interval=0.01,
    )
    assert not client.is_server_ready()
    with pytest.raises(InferenceServerException) as refused:
        client.infer("echo", echo_inputs(x, k))
    assert refused.value.status() == "StatusCode.UNAVAILABLE"
    model.release.set()
    held.join(10)
    assert drained.result(10)


def test_tls_client_certificates_and_basic_auth_from_the_web_config(serve, tmp_path) -> None:
    ca = ScratchCA(tmp_path)
    allowed, stranger = ca.client("allowed", "reader.example"), ca.client("other", "x.example")
    config_file = web_config_file(ca, client_sans=["reader.example"])
    server = serve(TextModel(), web_config=WebConfig.load(config_file), grpc_listen="127.0.0.1:0")
    credentials = {"authorization": ALICE}

    def client(files) -> triton.InferenceServerClient:
        return triton.InferenceServerClient(
            f"localhost:{server.server.grpc.port}",
            ssl=True,
            root_certificates=str(ca.cert_file),
            private_key=str(files.key),
            certificate_chain=str(files.cert),
        )

    text = triton.InferInput("text", [1], "BYTES")
    text.set_data_from_numpy(np.array([b"tls"], dtype=object))
    result = client(allowed).infer("text", [text], headers=credentials)
    assert result.as_numpy("upper").tolist() == [b"TLS"]
    with pytest.raises(InferenceServerException) as unauthenticated:
        client(allowed).infer("text", [text])
    assert unauthenticated.value.status() == "StatusCode.UNAUTHENTICATED"
    # bytes that are no message are refused as such only once the caller is admitted
    with grpc.secure_channel(
        f"localhost:{server.server.grpc.port}",
        grpc.ssl_channel_credentials(
            ca.cert_file.read_bytes(), allowed.key.read_bytes(), allowed.cert.read_bytes()
        ),
    ) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        with pytest.raises(grpc.RpcError) as anonymous:
            call(b"\xff\xff\xff", timeout=10)
        assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as garbled:
            call(b"\xff\xff\xff", timeout=10, metadata=tuple(credentials.items()))
        assert garbled.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(InferenceServerException) as denied:
        client(stranger).infer("text", [text], headers=credentials)
    assert denied.value.status() == "StatusCode.PERMISSION_DENIED"
    plain = triton.InferenceServerClient(f"127.0.0.1:{server.server.grpc.port}")
    with pytest.raises(InferenceServerException):
        plain.is_server_live()


def test_a_grpc_port_in_use_is_refused_before_the_model_loads() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = start_up_error("--listen", "127.0.0.1:0", "--grpc-listen", f"127.0.0.1:{port}")
    assert f"--grpc-listen '127.0.0.1:{port}'" in line


def test_grpc_on_the_http_address_is_refused_at_once() -> None:
    line = start_up_error("--listen", "127.0.0.1:8123", "--grpc-listen", "127.0.0.1:8123")
    assert "give gRPC its own port" in line


def test_a_renewed_certificate_is_served_without_a_restart(serve, tmp_path) -> None:
    old_ca, new_ca = ScratchCA(tmp_path, "old CA"), ScratchCA(tmp_path, "new CA")
    served = old_ca.server()
    config_file = tmp_path / "web.yml"
    config_file.write_text(
        yaml.safe_dump(
            {"tls_server_config": {"cert_file": str(served.cert), "key_file": str(served.key)}}
        )
    )
    server = serve(EchoModel(), web_config=WebConfig.load(config_file), grpc_listen="127.0.0.1:0")
    address = f"localhost:{server.server.grpc.port}"

    def live_for(ca: ScratchCA) -> bool:
        client = triton.InferenceServerClient(
            address, ssl=True, root_certificates=str(ca.cert_file)
        )
        try:
            return client.is_server_live(client_timeout=5)
        except InferenceServerException:
            return False
        finally:
            client.close()

    assert live_for(old_ca) and not live_for(new_ca)
    renewed = new_ca.server("renewed")
    served.cert.write_bytes(renewed.cert.read_bytes())  # as cert-manager rewrites the files
    served.key.write_bytes(renewed.key.read_bytes())
    # The files are looked at once a second at most.
    wait_until(lambda: live_for(new_ca), timeout=10, what="the renewed certificate", interval=0.3)
    assert live_for(new_ca) and not live_for(old_ca)


def test_the_grpc_face_serves_on_a_uvloop_loop() -> None:
    """grpc.aio on uvloop (the loop ``uvloop.run`` gives the engine): health, infer, an abort
    with its code, and the drain's UNAVAILABLE all work as on asyncio's own loop."""
    uvloop = pytest.importorskip("uvloop")
    model = EchoModel()
    server = ServerThread(model, warmup_repeats=0, grpc_listen="127.0.0.1:0")
    server.loop.close()
    server.loop = uvloop.new_event_loop()
    server.thread = threading.Thread(target=server.loop.run_forever, name="batcher-test-uvloop")
    server.start()
    try:
        assert isinstance(server.loop, uvloop.Loop)
        client = triton.InferenceServerClient(grpc_url(server))
        assert client.is_server_live() and client.is_model_ready("echo")
        x, k = np.array([[1, 2, 3]], dtype=np.float32), np.array([[1]], dtype=np.int32)
        np.testing.assert_array_equal(client.infer("echo", echo_inputs(x, k)).as_numpy("y"), 2 * x)
        wide = triton.InferInput("x", [1, 3], "FP64")
        wide.set_data_from_numpy(x.astype(np.float64))
        with pytest.raises(InferenceServerException, match="the model expects FP32") as bad:
            client.infer("echo", [wide, echo_inputs(x, k)[1]])
        assert bad.value.status() == "StatusCode.INVALID_ARGUMENT"
        asyncio.run_coroutine_threadsafe(server.batcher.drain(10), server.loop).result(10)
        with pytest.raises(InferenceServerException) as refused:
            client.infer("echo", echo_inputs(x, k))
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
    finally:
        server.stop()
