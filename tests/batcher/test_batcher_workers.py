"""``autoglm-batcher --workers 2`` as real processes: the engine and two front workers.

Every test here starts processes (slow tier): requests through the workers are answered as a
one-process server answers them (JSON and binary, with tritonclient), TLS and basic auth hold at
the workers, requests from both workers share batches, a killed worker is replaced, and SIGTERM
answers everything accepted.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.http as triton

from batcher.open_inference import predict_v2_pb2 as pb
from tests.batcher.test_batcher_cli import LogReader, batcher_process, series, start_up_error
from tests.batcher.web_configs import ALICE, web_config_file
from tests.selfsigned import ScratchCA
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

ECHO = "tests.batcher.batcher_test_models:echo"


def body(k: int = 0) -> dict:
    return {
        "inputs": [
            {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
            {"name": "k", "shape": [1, 1], "datatype": "INT32", "data": [k]},
        ]
    }


def metric_values(text: str, prefix: str) -> dict[str, float]:
    """The samples whose line starts with ``prefix`` (name and labels) -> value."""
    found = {}
    for line in text.splitlines():
        if line.startswith(prefix):
            name, _, value = line.rpartition(" ")
            found[name] = float(value)
    return found


def worker_infers(text: str) -> dict[str, float]:
    """Inference answers (200) by worker id."""
    found = {}
    for name, value in metric_values(text, "autoglm_batcher_worker_requests_total{").items():
        if 'handler="infer"' in name and 'code="200"' in name:
            found[name.split('worker="')[1].split('"')[0]] = value
    return found


class Served:
    """A batcher process with workers, its log followed; stopped (SIGKILL if need be) at the end."""

    def __init__(self, *args: str, tls: bool = False) -> None:
        self.proc = batcher_process(
            *("--listen", "127.0.0.1:0", "--warmup-repeats", "0", "--log-format", "json"), *args
        )
        self.logs = LogReader(self.proc)
        self.serving = self.logs.wait_for("serving", timeout=120)
        self.port = self.serving["port"]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"

    def metrics(self, **options: object) -> str:
        return requests.get(f"{self.url}/metrics", timeout=30, **options).text  # type: ignore[arg-type]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def sigterm_once_all_accepted(
    server: Served, send: Callable[[int], object], n: int = 10
) -> tuple[list[object], dict]:
    """Send ``n`` requests at once (``send(i)``, each from a thread of its own), SIGTERM the
    server once all are accepted and some still wait in its queue, and return their outcomes
    (in the order they came back) and the server's "stopped" record, after it exited with 0.
    The server should be slow enough (a slow model, small batches) for the queue to fill."""
    outcomes: list[object] = []
    threads = [threading.Thread(target=lambda i=i: outcomes.append(send(i))) for i in range(n)]
    for thread in threads:
        thread.start()

    def all_accepted_some_waiting() -> bool:
        seen = series(server.metrics())
        return seen["ok"] + seen["queued"] + seen["running"] == n and seen["queued"] > 0

    wait_until(
        all_accepted_some_waiting,
        timeout=60,
        what="all requests to be accepted, some waiting",
        interval=0.01,
        detail=lambda: f"seen: {series(server.metrics())}",
    )
    server.proc.send_signal(signal.SIGTERM)
    for thread in threads:
        thread.join(timeout=120)
    stopped = server.logs.wait_for("stopped")
    assert server.proc.wait(timeout=60) == 0
    return outcomes, stopped


def test_workers_serve_json_and_binary_as_one_process_does(served: list[Served]) -> None:
    server = Served("--model", ECHO, "--workers", "2")
    served.append(server)
    assert len(server.serving["workers"]) == 2
    client = triton.InferenceServerClient(f"127.0.0.1:{server.port}")
    assert client.is_server_live() and client.is_server_ready() and client.is_model_ready("echo")
    assert [t["name"] for t in client.get_model_metadata("echo")["inputs"]] == ["x", "k"]
    x = np.array([[1.5, -2.0, 3.25], [0.0, 1e-3, -7.0]], dtype=np.float32)
    k = np.array([[4], [5]], dtype=np.int32)
    for binary in (False, True):
        inputs = [triton.InferInput("x", [2, 3], "FP32"), triton.InferInput("k", [2, 1], "INT32")]
        inputs[0].set_data_from_numpy(x, binary_data=binary)
        inputs[1].set_data_from_numpy(k, binary_data=binary)
        outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("y", "k_out")]
        result = client.infer("echo", inputs, outputs=outputs, request_id="r1")
        np.testing.assert_array_equal(result.as_numpy("y"), x * 2)
        np.testing.assert_array_equal(result.as_numpy("k_out"), k)
        assert result.get_response()["id"] == "r1"
    # The same refusals, in the same words, as a one-process server gives.
    wrong = body()
    wrong["inputs"][0]["datatype"] = "FP64"
    refused = requests.post(f"{server.url}/v2/models/echo/infer", json=wrong, timeout=30)
    assert refused.status_code == 400
    assert refused.json()["error"] == "input 'x' has datatype 'FP64'; the model expects FP32"
    unknown = requests.post(f"{server.url}/v2/models/nope/infer", json=body(), timeout=30)
    assert unknown.status_code == 404 and "nope" in unknown.json()["error"]
    unreadable = requests.post(
        f"{server.url}/v2/models/echo/infer",
        data=json.dumps(body()),
        headers={"Content-Encoding": "gzip"},
        timeout=30,
    )
    assert unreadable.status_code == 400 and unreadable.headers["Connection"] == "close"
    assert "Content-Encoding" in unreadable.json()["error"]
    # One scrape of either worker sees the engine's series and every worker's.
    text = server.metrics()
    assert series(text)["ok"] == 2
    assert metric_values(text, 'autoglm_batcher_requests_total{model="echo",outcome="invalid"}')
    assert sum(worker_infers(text).values()) == 2


def test_tls_and_basic_auth_hold_at_the_workers(served: list[Served], tmp_path) -> None:
    ca = ScratchCA(tmp_path)
    config_file = web_config_file(ca)
    server = Served(
        *("--model", ECHO, "--workers", "2", "--web-config-file", str(config_file)), tls=True
    )
    served.append(server)
    url = server.url
    auth = {"Authorization": ALICE}
    for _ in range(4):  # new connections: the kernel spreads them over both workers
        denied = requests.post(
            f"{url}/v2/models/echo/infer", json=body(), verify=str(ca.cert_file), timeout=30
        )
        assert denied.status_code == 401
        assert denied.headers["WWW-Authenticate"] == 'Basic realm="autoglm-batcher"'
        assert (
            requests.get(f"{url}/metrics", verify=str(ca.cert_file), timeout=30).status_code == 401
        )
        allowed = requests.post(
            f"{url}/v2/models/echo/infer",
            json=body(7),
            verify=str(ca.cert_file),
            headers=auth,
            timeout=30,
        )
        assert allowed.status_code == 200 and allowed.json()["outputs"][1]["data"] == [7]
    for path in ("/v2/health/live", "/v2/health/ready"):  # open to probes, at every worker
        for _ in range(4):
            probe = requests.get(f"{url}{path}", verify=str(ca.cert_file), timeout=30)
            assert probe.status_code == 200
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{server.port}/v2/health/live", timeout=30)

    def handshake_errors() -> float:
        text = server.metrics(verify=str(ca.cert_file), headers=auth)
        return sum(metric_values(text, "autoglm_http_tls_handshake_errors_total").values())

    wait_until(
        lambda: handshake_errors() >= 1,  # the plain-HTTP attempt, counted by a worker
        timeout=60,
        what="the failed handshake to be counted",
        interval=0.2,
    )


def test_requests_from_both_workers_share_batches(served: list[Served]) -> None:
    """Rounds of eight concurrent requests, each on a new connection, into batches of exactly
    eight (fixed-delay: dispatch at the preferred size, never earlier); a round that both workers
    took part in and that made one batch of eight had requests of both in that batch."""
    server = Served(
        *("--model", ECHO, "--workers", "2", "--policy", "fixed-delay"),
        *("--max-batch-size", "8", "--preferred-batch-size", "8"),
        *("--max-queue-delay-seconds", "120", "--slo-seconds", "200", "--no-refuse-past-slo"),
    )
    served.append(server)
    batches = 'autoglm_batcher_batch_size_items_count{model="echo"}'
    small = 'autoglm_batcher_batch_size_items_bucket{le="4.0",model="echo"}'

    def a_round_on_both_workers() -> bool:
        before = server.metrics()
        replies: list[int] = []

        def post(i: int) -> None:
            url = f"{server.url}/v2/models/echo/infer"
            replies.append(requests.post(url, json=body(i), timeout=120).status_code)

        threads = [threading.Thread(target=post, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=150)
        after = server.metrics()
        assert replies == [200] * 8
        took = {
            w: worker_infers(after)[w] - worker_infers(before).get(w, 0.0)
            for w in worker_infers(after)
        }
        one_batch_of_eight = metric_values(after, batches)[batches] - metric_values(
            before, batches
        ).get(batches, 0.0) == 1 and metric_values(after, small)[small] == metric_values(
            before, small
        ).get(small, 0.0)
        assert one_batch_of_eight
        return sum(1 for n in took.values() if n > 0) == 2

    wait_until(
        a_round_on_both_workers,
        timeout=120,
        what="a round on both workers (every round's connections went to one worker)",
        interval=0,
    )


def test_a_killed_worker_is_replaced_and_its_socket_waits_for_the_replacement(
    served: list[Served],
) -> None:
    """Connections made while a worker is dead wait in its socket, which the engine keeps, and
    are answered by the replacement: none is refused or reset."""
    server = Served("--model", ECHO, "--workers", "2")
    served.append(server)
    victim = server.serving["workers"][0]
    os.kill(victim, signal.SIGKILL)
    exited = server.logs.wait_for("front worker exited; starting another")
    assert exited["pid"] == victim and exited["exit_code"] == -signal.SIGKILL
    replies: dict[int, requests.Response] = {}

    def post(i: int) -> None:
        url = f"{server.url}/v2/models/echo/infer"
        replies[i] = requests.post(url, json=body(i), timeout=120)

    # New connections while the replacement starts: the kernel puts some on the dead one's socket.
    threads = [threading.Thread(target=post, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    replacement = server.logs.wait_for("front worker listening")
    assert replacement["worker"] == exited["worker"] and replacement["pid"] != victim
    for thread in threads:
        thread.join(timeout=150)
    assert sorted(replies) == list(range(12))
    for i, reply in replies.items():
        assert reply.status_code == 200 and reply.json()["outputs"][1]["data"] == [i]
    text = server.metrics()
    restarts = metric_values(text, "autoglm_batcher_worker_restarts_total")
    assert restarts["autoglm_batcher_worker_restarts_total"] == 1
    took = worker_infers(text)
    assert took[str(exited["worker"])] > 0  # the replacement answered some of them


def test_sigterm_answers_everything_the_workers_accepted(served: list[Served]) -> None:
    server = Served(
        *("--model", "tests.batcher.batcher_test_models:slow_echo", "--workers", "2"),
        *("--max-batch-size", "2", "--slo-seconds", "5"),
    )
    served.append(server)

    def post(i: int) -> requests.Response:
        return requests.post(f"{server.url}/v2/models/echo/infer", json=body(i), timeout=120)

    # Ten requests at 0.2 s per batch of two: some wait when the signal comes.
    outcomes, stopped = sigterm_once_all_accepted(server, post)
    replies = [r for r in outcomes if isinstance(r, requests.Response)]
    assert sorted(r.status_code for r in replies) == [200] * 10
    assert sorted(r.json()["outputs"][1]["data"][0] for r in replies) == list(range(10))
    assert stopped["drained"] is True


@pytest.mark.parametrize("value", ["-1", "65", "two"])
def test_a_bad_worker_count_is_one_line_and_exit_2(value: str) -> None:
    line = start_up_error("--workers", value)
    assert "--workers" in line


def test_workers_config_key_mirrors_the_flag(tmp_path) -> None:
    config_file = tmp_path / "batcher.yml"
    config_file.write_text(json.dumps({"workers": -3}))
    line = start_up_error("--config", str(config_file))
    assert "workers" in line


def test_a_worker_logs_with_its_id(served: list[Served]) -> None:
    server = Served("--model", ECHO, "--workers", "1")
    served.append(server)
    server.proc.send_signal(signal.SIGTERM)
    stopped = server.logs.wait_for("front worker stopped")
    assert stopped["worker"] == 0 and stopped["component"] == "batcher"
    assert server.proc.wait(timeout=60) == 0


def test_workers_follow_a_model_reloaded_with_another_signature(
    served: list[Served], tmp_path
) -> None:
    """Each worker keeps the signature it checked requests against; after the model is reloaded
    with another one (through the repository API, passed to the engine), every worker serves
    the new signature and refuses the old with the engine's words."""
    folder = tmp_path / "models" / "echo"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"model: {ECHO}\n")
    server = Served("--model-repository", str(tmp_path / "models"), "--workers", "2")
    served.append(server)
    infer = f"{server.url}/v2/models/echo/infer"
    for i in range(8):  # new connections: both workers learn the three-feature signature
        assert requests.post(infer, json=body(i), timeout=30).status_code == 200
    repository = f"{server.url}/v2/repository/models/echo"
    assert requests.post(f"{repository}/unload", timeout=60).status_code == 200
    (folder / "config.yaml").write_text("model: tests.batcher.batcher_test_models:wide_echo\n")
    assert requests.post(f"{repository}/load", timeout=60).status_code == 200
    wide = body()
    wide["inputs"][0].update(shape=[1, 4], data=[1, 2, 3, 4])
    for i in range(8):
        wide["inputs"][1]["data"] = [i]
        reply = requests.post(infer, json=wide, timeout=30)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [2, 4, 6, 8]
    for _ in range(4):
        old = requests.post(infer, json=body(), timeout=30)
        assert old.status_code == 400
        assert "the model expects [-1, 4]" in old.json()["error"]


def test_workers_belong_to_the_process_not_to_a_model_config(tmp_path) -> None:
    from batcher.config import BatcherConfig
    from batcher.errors import ModelConfigInvalid
    from batcher.repository_folder import model_config

    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.yaml").write_text(f"model: {ECHO}\nworkers: 2\n")
    with pytest.raises(ModelConfigInvalid, match=r"whole process.* give --workers"):
        model_config(str(tmp_path), "m", BatcherConfig())


def test_the_engines_private_sockets_are_this_users_alone(served: list[Served]) -> None:
    """The engine's sockets answer without basic auth, so only their folder's owner may reach
    them: a folder of mode 0700 holding sockets of mode 0600, gone once the engine exits."""
    server = Served("--model", ECHO, "--workers", "1")
    served.append(server)
    pid = server.proc.pid
    inodes = {
        os.readlink(f"/proc/{pid}/fd/{fd}")[len("socket:[") : -1]
        for fd in os.listdir(f"/proc/{pid}/fd")
        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:[")
    }
    paths = []
    for line in Path("/proc/net/unix").read_text().splitlines()[1:]:
        fields = line.split()
        if len(fields) == 8 and fields[6] in inodes:
            paths.append(Path(fields[7]))
    assert {p.name for p in paths} == {"engine.sock", "http.sock"}
    folder = paths[0].parent
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in paths)
    server.proc.send_signal(signal.SIGTERM)
    assert server.proc.wait(timeout=60) == 0
    assert not folder.exists()


def listening_sockets(pid: int, port: int) -> set[str]:
    """The sockets of process ``pid`` listening on TCP ``port`` (their inodes)."""
    listening = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":
                listening.add(fields[9])
    held = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            held.add(target[len("socket:[") : -1])
    return listening & held


def test_grpc_is_served_by_the_workers_beside_rest(served: list[Served]) -> None:
    """With workers, the workers listen on the gRPC port and the engine does not; gRPC and REST
    requests share the engine's series, and the worker counts its gRPC calls."""
    import tritonclient.grpc as triton_grpc

    server = Served("--model", ECHO, "--workers", "1", "--grpc-listen", "127.0.0.1:0")
    served.append(server)
    grpc_port = next(r for r in server.logs.seen if r.get("msg") == "serving grpc")["port"]
    assert listening_sockets(server.serving["workers"][0], grpc_port)
    assert not listening_sockets(server.proc.pid, grpc_port)
    client = triton_grpc.InferenceServerClient(f"127.0.0.1:{grpc_port}")
    x = triton_grpc.InferInput("x", [1, 3], "FP32")
    x.set_data_from_numpy(np.array([[1, 2, 3]], dtype=np.float32))
    k = triton_grpc.InferInput("k", [1, 1], "INT32")
    k.set_data_from_numpy(np.array([[9]], dtype=np.int32))
    np.testing.assert_array_equal(client.infer("echo", [x, k]).as_numpy("y"), [[2, 4, 6]])
    rest = requests.post(f"{server.url}/v2/models/echo/infer", json=body(3), timeout=30)
    assert rest.status_code == 200
    text = server.metrics()
    assert series(text)["ok"] == 2
    grpc_calls = 'autoglm_batcher_worker_requests_total{code="OK",handler="grpc",worker="0"}'
    assert metric_values(text, grpc_calls)[grpc_calls] == 1
    # The engine's own route for the calls the workers pass on is not on the public port: an
    # unload sent there as raw protobuf is refused, and the model stays loaded.
    unload = pb.RepositoryModelUnloadRequest(model_name="echo").SerializeToString()
    passed = requests.post(f"{server.url}/grpc/RepositoryModelUnload", data=unload, timeout=30)
    assert passed.status_code == 404 and "no route for POST" in passed.json()["error"]
    assert client.is_model_ready("echo")
