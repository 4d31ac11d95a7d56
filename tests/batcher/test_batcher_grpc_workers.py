"""gRPC served by the front workers (``--workers 2 --grpc-listen``), as real processes.

The workers answer every RPC as the engine's own gRPC face does (compared call by call against a
one-process server: the same responses, the same codes and words), ``tritonclient.grpc`` works
unchanged, calls through both workers share batches, TLS and basic auth hold at the workers, the
calls are counted in the engine's series, and SIGTERM answers every accepted call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as triton
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc as pb_grpc
from tritonclient.utils import InferenceServerException

from tests.batcher.test_batcher_cli import series
from tests.batcher.test_batcher_workers import (
    ECHO,
    Served,
    metric_values,
    sigterm_once_all_accepted,
)
from tests.batcher.web_configs import ALICE, web_config_file
from tests.selfsigned import ScratchCA
from tests.waiting import wait_until

pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

GRPC_OK = 'autoglm_batcher_grpc_requests_total{code="OK",method="ModelInfer",model="echo"}'


def grpc_port(server: Served) -> int:
    return int(next(r for r in server.logs.seen if r.get("msg") == "serving grpc")["port"])


def stub(port: int, credentials: grpc.ChannelCredentials | None = None) -> Any:
    """A stub on a connection of its own (no subchannel shared with other channels): each new
    stub is a new connection, which the kernel gives to either worker."""
    options = [("grpc.use_local_subchannel_pool", 1)]
    target = f"127.0.0.1:{port}"
    channel = (
        grpc.insecure_channel(target, options=options)
        if credentials is None
        else grpc.secure_channel(target, credentials, options=options)
    )
    return pb_grpc.GRPCInferenceServiceStub(channel)


def infer_request(
    k: int = 0, rows: int = 1, features: int = 3, **fields: object
) -> pb.ModelInferRequest:
    x = np.arange(features * rows, dtype=np.float32).reshape(rows, features) + k
    request = pb.ModelInferRequest(model_name="echo", **fields)  # type: ignore[arg-type]
    request.inputs.add(name="x", datatype="FP32", shape=[rows, features])
    request.inputs.add(name="k", datatype="INT32", shape=[rows, 1])
    request.raw_input_contents.extend(
        [x.tobytes(), np.full((rows, 1), k, dtype=np.int32).tobytes()]
    )
    return request


def typed_request() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="echo", id="typed")
    x = request.inputs.add(name="x", datatype="FP32", shape=[2, 3])
    x.contents.fp32_contents.extend([1.5, -2, 3.25, 0, 1e-3, -7])
    k = request.inputs.add(name="k", datatype="INT32", shape=[2, 1])
    k.contents.int_contents.extend([4, -5])
    request.outputs.add(name="k_out")
    return request


def wrong_datatype() -> pb.ModelInferRequest:
    request = infer_request()
    request.inputs[0].datatype = "FP64"
    return request


def missing_input() -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="echo")
    request.inputs.add(name="x", datatype="FP32", shape=[1, 3])
    request.raw_input_contents.append(np.zeros(3, dtype=np.float32).tobytes())
    return request


CALLS: list[tuple[str, Callable[[], object]]] = [
    ("ServerLive", pb.ServerLiveRequest),
    ("ServerReady", pb.ServerReadyRequest),
    ("ServerMetadata", pb.ServerMetadataRequest),
    ("ModelReady", lambda: pb.ModelReadyRequest(name="echo")),
    ("ModelReady", lambda: pb.ModelReadyRequest(name="nope")),
    ("ModelReady", lambda: pb.ModelReadyRequest(name="echo", version="2")),
    ("ModelMetadata", lambda: pb.ModelMetadataRequest(name="echo")),
    ("ModelMetadata", lambda: pb.ModelMetadataRequest(name="nope")),
    ("ModelConfig", lambda: pb.ModelConfigRequest(name="echo")),
    ("RepositoryIndex", pb.RepositoryIndexRequest),
    ("RepositoryModelLoad", lambda: pb.RepositoryModelLoadRequest(model_name="echo")),
    ("ModelInfer", lambda: infer_request(3, rows=2, id="raw")),
    ("ModelInfer", typed_request),
    ("ModelInfer", wrong_datatype),
    ("ModelInfer", missing_input),
    ("ModelInfer", lambda: infer_request(model_version="7")),
    ("ModelInfer", lambda: pb.ModelInferRequest(model_name="nope")),
]


def outcome(call: Callable[[object], object], request: object) -> object:
    """The response, or the refusal's code and words."""
    try:
        return call(request)
    except grpc.RpcError as exc:
        return (exc.code(), exc.details())


def test_the_workers_answer_every_rpc_as_the_engines_own_face(served: list[Served]) -> None:
    alone = Served("--model", ECHO, "--grpc-listen", "127.0.0.1:0")
    fronted = Served("--model", ECHO, "--workers", "2", "--grpc-listen", "127.0.0.1:0")
    served += [alone, fronted]
    assert grpc_port(alone) != grpc_port(fronted)
    engine, workers = stub(grpc_port(alone)), stub(grpc_port(fronted))
    refusals = 0
    for method, make in CALLS:
        expected = outcome(getattr(engine, method), make())
        assert outcome(getattr(workers, method), make()) == expected, method
        refusals += isinstance(expected, tuple)
    assert refusals == 8  # NOT_FOUND, FAILED_PRECONDITION and INVALID_ARGUMENT among them
    answer = outcome(workers.ModelInfer, infer_request(3, rows=2, id="raw"))
    assert isinstance(answer, pb.ModelInferResponse) and answer.id == "raw"
    assert outcome(workers.ModelInfer, wrong_datatype()) == (
        grpc.StatusCode.INVALID_ARGUMENT,
        "input 'x' has datatype 'FP64'; the model expects FP32",
    )
    # Counted once, in the engine's series, with the workers' own count beside it.
    text = fronted.metrics()
    assert metric_values(text, GRPC_OK)[GRPC_OK] == 3
    assert text.count("# TYPE autoglm_batcher_grpc_requests_total counter") <= 1
    by_worker = metric_values(text, "autoglm_batcher_worker_requests_total{")
    assert sum(v for k, v in by_worker.items() if 'handler="grpc"' in k) == len(CALLS) + 2
    assert metric_values(text, 'autoglm_batcher_requests_total{model="echo",outcome="invalid"}')


def test_tritonclient_grpc_works_through_the_workers(served: list[Served]) -> None:
    server = Served("--model", ECHO, "--workers", "2", "--grpc-listen", "127.0.0.1:0")
    served.append(server)
    client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port(server)}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("echo")
    assert [t.name for t in client.get_model_metadata("echo").inputs] == ["x", "k"]
    assert client.get_model_config("echo").config.max_batch_size > 0
    x = np.array([[1.5, -2.0, 3.25], [0.0, 1e-3, -7.0]], dtype=np.float32)
    k = np.array([[4], [-5]], dtype=np.int32)
    inputs = [triton.InferInput("x", [2, 3], "FP32"), triton.InferInput("k", [2, 1], "INT32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(k)
    result = client.infer("echo", inputs, request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
    np.testing.assert_array_equal(result.as_numpy("k_out"), k)
    assert result.get_response().id == "r1"
    inputs[0] = triton.InferInput("x", [2, 3], "FP64")
    inputs[0].set_data_from_numpy(x.astype(np.float64))
    with pytest.raises(InferenceServerException, match="the model expects FP32") as refused:
        client.infer("echo", inputs)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_grpc_calls_through_both_workers_share_batches(served: list[Served]) -> None:
    """Rounds of eight concurrent calls, each on a new connection, into batches of exactly eight
    (fixed-delay: dispatch at the preferred size, never earlier); a round both workers took part
    in that made one batch of eight had calls of both in that batch."""
    server = Served(
        *("--model", ECHO, "--workers", "2", "--policy", "fixed-delay"),
        *("--max-batch-size", "8", "--preferred-batch-size", "8", "--grpc-listen", "127.0.0.1:0"),
        *("--max-queue-delay-seconds", "120", "--slo-seconds", "200", "--no-refuse-past-slo"),
    )
    served.append(server)
    port = grpc_port(server)
    batches = 'autoglm_batcher_batch_size_items_count{model="echo"}'
    small = 'autoglm_batcher_batch_size_items_bucket{le="4.0",model="echo"}'

    def by_worker(text: str) -> dict[str, float]:
        found = metric_values(text, "autoglm_batcher_worker_requests_total{")
        return {
            k.split('worker="')[1].split('"')[0]: v
            for k, v in found.items()
            if 'handler="grpc"' in k and 'code="OK"' in k
        }

    def a_round_on_both_workers() -> bool:
        before = server.metrics()
        answers: list[int] = []

        def call(i: int) -> None:
            response = stub(port).ModelInfer(infer_request(i), timeout=120)
            answers.append(int(np.frombuffer(response.raw_output_contents[1], np.int32)[0]))

        threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=150)
        after = server.metrics()
        assert sorted(answers) == list(range(8))
        took = {w: n - by_worker(before).get(w, 0.0) for w, n in by_worker(after).items()}
        count = metric_values(after, batches)[batches] - metric_values(before, batches).get(
            batches, 0.0
        )
        assert count == 1
        assert metric_values(after, small)[small] == metric_values(before, small).get(small, 0.0)
        return sum(1 for n in took.values() if n > 0) == 2

    wait_until(
        a_round_on_both_workers,
        timeout=120,
        what="a round on both workers (every round's connections went to one worker)",
        interval=0,
    )


def test_tls_and_basic_auth_hold_at_the_workers_grpc(served: list[Served], tmp_path) -> None:
    ca = ScratchCA(tmp_path)
    config_file = web_config_file(ca)
    server = Served(
        *("--model", ECHO, "--workers", "2", "--web-config-file", str(config_file)),
        *("--grpc-listen", "127.0.0.1:0"),
        tls=True,
    )
    served.append(server)
    port = grpc_port(server)
    credentials = grpc.ssl_channel_credentials(root_certificates=ca.cert_file.read_bytes())
    auth = (("authorization", ALICE),)
    for i in range(4):  # new connections: the kernel spreads them over both workers
        secure = stub(port, credentials)
        for method, request in (
            ("ServerLive", pb.ServerLiveRequest()),
            ("ModelInfer", infer_request(i)),
        ):
            with pytest.raises(grpc.RpcError) as denied:
                getattr(secure, method)(request, timeout=30)
            assert denied.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert secure.ServerLive(pb.ServerLiveRequest(), metadata=auth, timeout=30).live
        answer = secure.ModelInfer(infer_request(i), metadata=auth, timeout=30)
        assert np.frombuffer(answer.raw_output_contents[1], np.int32).tolist() == [i]
    with pytest.raises(grpc.RpcError) as plain:  # no TLS: no answer at all
        stub(port).ServerLive(pb.ServerLiveRequest(), metadata=auth, timeout=5)
    assert plain.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
    client = triton.InferenceServerClient(
        f"127.0.0.1:{port}", ssl=True, root_certificates=str(ca.cert_file)
    )
    assert client.is_server_ready(headers={"authorization": auth[0][1]})
    # Refused at the workers, counted as the engine's face counts them: under the served model.
    text = server.metrics(verify=str(ca.cert_file), headers={"Authorization": auth[0][1]})
    denied_live = (
        'autoglm_batcher_grpc_requests_total{code="UNAUTHENTICATED",method="ServerLive",'
        'model="echo"}'
    )
    assert metric_values(text, denied_live)[denied_live] == 4


def test_sigterm_answers_every_grpc_call_the_workers_accepted(served: list[Served]) -> None:
    server = Served(
        *("--model", "tests.batcher.batcher_test_models:slow_echo", "--workers", "2"),
        *("--max-batch-size", "2", "--slo-seconds", "5", "--grpc-listen", "127.0.0.1:0"),
    )
    served.append(server)
    port = grpc_port(server)

    def call(i: int) -> object:
        return outcome(lambda r: stub(port).ModelInfer(r, timeout=120), infer_request(i))

    # Ten calls at 0.2 s per batch of two: some wait when the signal comes.
    answers, stopped = sigterm_once_all_accepted(server, call)
    assert len(answers) == 10
    assert all(isinstance(a, pb.ModelInferResponse) for a in answers), answers
    got = sorted(int(np.frombuffer(a.raw_output_contents[1], np.int32)[0]) for a in answers)  # type: ignore[attr-defined]
    assert got == list(range(10))
    assert stopped["drained"] is True


def test_a_refusal_at_admission_is_resource_exhausted_through_the_workers(
    served: list[Served],
) -> None:
    """A full queue refuses at the engine (HTTP 429 on the channel): the client sees
    RESOURCE_EXHAUSTED with the engine's words, as from the engine's own face."""
    server = Served(
        *("--model", "tests.batcher.batcher_test_models:slow_echo", "--workers", "2"),
        *("--max-batch-size", "1", "--max-queue", "1", "--grpc-listen", "127.0.0.1:0"),
    )
    served.append(server)
    port = grpc_port(server)
    outcomes: list[object] = []

    def call(i: int) -> None:
        outcomes.append(outcome(lambda r: stub(port).ModelInfer(r, timeout=120), infer_request(i)))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=150)
    refused = [o for o in outcomes if isinstance(o, tuple)]
    assert len(outcomes) == 8 and 0 < len(refused) < 8, outcomes
    assert {code for code, _ in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
    assert all("queue" in words for _, words in refused), refused
    text = server.metrics()
    exhausted = (
        'autoglm_batcher_grpc_requests_total{code="RESOURCE_EXHAUSTED",method="ModelInfer",'
        'model="echo"}'
    )
    assert metric_values(text, exhausted)[exhausted] == len(refused)


def outcomes_counted(server: Served) -> dict[str, float]:
    """The engine's ``requests_total`` of the echo model, by outcome."""
    prefix = 'autoglm_batcher_requests_total{model="echo",outcome="'
    return {k[len(prefix) : -2]: v for k, v in metric_values(server.metrics(), prefix).items()}


def test_a_deadline_passed_in_the_engines_queue_is_deadline_exceeded_through_the_workers(
    served: list[Served],
) -> None:
    """A call whose client deadline (``client_timeout``) passes while it waits in the engine's
    queue behind a backlog: DEADLINE_EXCEEDED, as from the engine's own face; the engine never
    runs it and counts it as one process does (cancelled); the worker answers the next call."""
    server = Served(
        *("--model", "tests.batcher.batcher_test_models:slow_echo", "--workers", "2"),
        *("--max-batch-size", "1", "--slo-seconds", "60", "--grpc-listen", "127.0.0.1:0"),
    )
    served.append(server)
    port = grpc_port(server)
    client = triton.InferenceServerClient(f"127.0.0.1:{port}")  # one connection, one worker
    x, k = np.ones((1, 3), dtype=np.float32), np.ones((1, 1), dtype=np.int32)
    inputs = [triton.InferInput("x", [1, 3], "FP32"), triton.InferInput("k", [1, 1], "INT32")]
    inputs[0].set_data_from_numpy(x)
    inputs[1].set_data_from_numpy(k)
    client.infer("echo", inputs)  # its worker knows the signature: the late call goes straight on
    backlog = 16  # 0.2 s a call, one at a time
    answers: list[object] = []
    threads = [
        threading.Thread(
            target=lambda i=i: answers.append(
                outcome(lambda r: stub(port).ModelInfer(r, timeout=120), infer_request(i))
            )
        )
        for i in range(backlog)
    ]
    for thread in threads:
        thread.start()
    wait_until(
        lambda: series(server.metrics()).get("queued", 0) >= backlog // 2,  # 1.6 s of work ahead
        timeout=60,
        what="the backlog to queue",
        interval=0.01,
    )
    with pytest.raises(InferenceServerException) as expired:
        client.infer("echo", inputs, client_timeout=0.8)
    assert expired.value.status() == "StatusCode.DEADLINE_EXCEEDED", expired.value
    for thread in threads:
        thread.join(timeout=150)
    assert all(isinstance(a, pb.ModelInferResponse) for a in answers), answers
    np.testing.assert_array_equal(client.infer("echo", inputs).as_numpy("y"), x * 2)
    items = 'autoglm_batcher_batch_size_items_sum{model="echo"}'
    assert metric_values(server.metrics(), items)[items] == backlog + 2
    counted = outcomes_counted(server)
    assert (counted["ok"], counted.get("cancelled")) == (backlog + 2, 1)


def grpc_calls_by_worker(server: Served) -> dict[str, float]:
    """gRPC calls each worker answered, whatever their code."""
    found: dict[str, float] = {}
    for name, value in metric_values(
        server.metrics(), "autoglm_batcher_worker_requests_total{"
    ).items():
        if 'handler="grpc"' in name:
            worker = name.split('worker="')[1].split('"')[0]
            found[worker] = found.get(worker, 0.0) + value
    return found


def through_both_workers(server: Served, call: Callable[[Any], None]) -> None:
    """``call(stub)`` on new connections, four at a time, until both workers answered one."""
    before = grpc_calls_by_worker(server)

    def both_answered() -> bool:
        for _ in range(4):
            call(stub(grpc_port(server)))
        after = grpc_calls_by_worker(server)
        return sum(1 for w, n in after.items() if n > before.get(w, 0.0)) == 2

    wait_until(
        both_answered,
        timeout=60,
        what="both workers to answer (every connection went to one worker)",
        interval=0,
    )


def test_grpc_workers_follow_a_model_reloaded_with_another_signature(
    served: list[Served], tmp_path
) -> None:
    """Each worker keeps the signature it decoded calls with. After a reload with another one
    (tritonclient.grpc's repository calls), a call decoded for the old signature is checked
    again (the engine answers 409 on the channel; the worker asks for the new one) and refused
    with the engine's words; after a reload back, a call valid only for the new signature is
    answered, though the worker's kept signature refuses it. Both ways, on every worker."""
    folder = tmp_path / "models" / "echo"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"model: {ECHO}\n")
    server = Served(
        *("--model-repository", str(tmp_path / "models"), "--workers", "2"),
        *("--grpc-listen", "127.0.0.1:0"),
    )
    served.append(server)
    client = triton.InferenceServerClient(f"127.0.0.1:{grpc_port(server)}")

    def answered(features: int) -> Callable[[Any], None]:
        def call(worker: Any) -> None:
            response = worker.ModelInfer(infer_request(1, features=features), timeout=30)
            y = np.frombuffer(response.raw_output_contents[0], np.float32)
            assert y.tolist() == [2.0 * (i + 1) for i in range(features)]

        return call

    def refused(features: int, served_features: int) -> Callable[[Any], None]:
        def call(worker: Any) -> None:
            code, words = outcome(worker.ModelInfer, infer_request(features=features))  # type: ignore[misc]
            assert code == grpc.StatusCode.INVALID_ARGUMENT
            assert f"shape [1, {features}]; the model expects [-1, {served_features}]" in words

        return call

    def reload(factory: str) -> None:
        client.unload_model("echo")
        (folder / "config.yaml").write_text(f"model: tests.batcher.batcher_test_models:{factory}\n")
        client.load_model("echo")

    through_both_workers(server, answered(3))  # both workers keep the three-feature signature
    reload("wide_echo")
    through_both_workers(server, refused(3, 4))  # decoded for three features: 409, asked again
    through_both_workers(server, answered(4))
    reload("echo")
    through_both_workers(server, answered(3))  # refused by the kept four: checked, then served
    through_both_workers(server, refused(4, 3))
