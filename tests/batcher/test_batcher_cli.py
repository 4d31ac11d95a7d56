"""``autoglm-batcher`` as a real process: start-up errors, serving, and draining on SIGTERM."""

from __future__ import annotations

import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests
import torch
import yaml
from prometheus_client.parser import text_string_to_metric_families

from tests.batcher.web_configs import web_config_file
from tests.selfsigned import ScratchCA
from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]


def batcher_process(*args: str) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.Popen(
        [sys.executable, "-m", "batcher.cli", *args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


# A guard against a hang, not a measure: a batcher that imports torch (and, with
# --model-process, a child that imports it again) took over 60 s to log its first line in a CI
# rehearsal on 2 cores busy with the slow tier's bench smokes, where it takes 5 s alone.
START_TIMEOUT_SECONDS = 180.0


class LogReader:
    """Reads the process's JSON log lines on a thread so the test can wait for one."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.lines: queue.Queue[dict] = queue.Queue()
        self.seen: list[dict] = []
        self.thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self.thread.start()

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            try:
                self.lines.put(json.loads(line))
            except json.JSONDecodeError:
                self.lines.put({"msg": line.strip()})

    def wait_for(self, msg: str, timeout: float = START_TIMEOUT_SECONDS) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                record = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            self.seen.append(record)
            if record.get("msg") == msg:
                return record
        raise AssertionError(f"no {msg!r} log line; saw {self.seen[-5:]}")


def series(metrics: str) -> dict[str, float]:
    wanted = {
        'autoglm_batcher_requests_total{model="echo",outcome="ok"}': "ok",
        'autoglm_batcher_queue_requests{model="echo"}': "queued",
        'autoglm_batcher_in_flight_requests{model="echo"}': "running",
    }
    found = {}
    for line in metrics.splitlines():
        name, _, value = line.rpartition(" ")
        if name in wanted:
            found[wanted[name]] = float(value)
    return found


def test_bad_settings_exit_2_with_one_line() -> None:
    proc = batcher_process("--max-batch-size", "0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "--max-batch-size must be >= 1, got 0" in err


def test_unimportable_model_exits_2_naming_the_fix() -> None:
    proc = batcher_process("--model", "no_such_module:factory", "--listen", "127.0.0.1:0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2
    assert "cannot import 'no_such_module'" in err and "PYTHONPATH" in err


def start_up_error(*args: str) -> str:
    """The one stderr line of a start-up refused with exit code 2 (and no model ever loaded)."""
    proc = batcher_process(*args)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "model loaded" not in err and "Traceback" not in err
    return lines[0]


@pytest.mark.parametrize(
    ("tls", "refused"),
    [
        ({"min_version": "TLS13"}, "min_version TLS13"),
        ({"max_version": "TLS12"}, "max_version TLS12"),
        ({"cipher_suites": ["TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256"]}, "cipher_suites"),
    ],
)
def test_tls_settings_grpc_cannot_enforce_are_refused_with_grpc_listen(
    tmp_path, tls: dict, refused: str
) -> None:
    """HTTP enforces TLS versions and ciphers; grpcio takes none, so a web config asking for
    them would hold on one port and not the other: refused at start when gRPC is asked for."""
    path = web_config_file(ScratchCA(tmp_path))
    config = yaml.safe_load(path.read_text())
    config["tls_server_config"] |= tls
    path.write_text(yaml.safe_dump(config))
    listen = ("--listen", "127.0.0.1:0", "--web-config-file", str(path))
    line = start_up_error(*listen, "--grpc-listen", "127.0.0.1:0")
    assert refused in line and "cannot enforce" in line and "--grpc-listen" in line
    served = batcher_process(*listen, "--warmup-repeats", "0")  # REST alone enforces them
    try:
        assert LogReader(served).wait_for("serving", timeout=120)["port"]
    finally:
        served.kill()
        served.wait()


def test_missing_checkpoint_is_refused_before_the_model_loads(tmp_path) -> None:
    line = start_up_error("--checkpoint", str(tmp_path / "nope.pt"), "--listen", "127.0.0.1:0")
    assert "--checkpoint" in line and "no such file" in line and "torch.save" in line


def test_a_folder_given_as_checkpoint_is_refused(tmp_path) -> None:
    line = start_up_error("--checkpoint", str(tmp_path), "--listen", "127.0.0.1:0")
    assert "is not a file" in line


def test_a_file_that_is_not_a_checkpoint_gets_one_line_naming_it(tmp_path) -> None:
    bogus = tmp_path / "weights.pt"
    bogus.write_text("these are not weights\n")
    line = start_up_error("--checkpoint", str(bogus), "--listen", "127.0.0.1:0")
    assert f"--checkpoint {str(bogus)!r} could not be loaded by batcher.models.demo:factory" in line
    assert "give a checkpoint saved for this model" in line


def test_a_checkpoint_of_another_model_gets_one_line_naming_it(tmp_path) -> None:
    other = tmp_path / "other.pt"
    torch.save({"weight": torch.zeros(2, 2)}, other)
    line = start_up_error("--checkpoint", str(other), "--listen", "127.0.0.1:0")
    assert "could not be loaded" in line and "RuntimeError" in line


def test_a_good_checkpoint_still_loads(tmp_path) -> None:
    from batcher.models.demo import DemoMLP

    good = tmp_path / "demo.pt"
    torch.save(DemoMLP().state_dict(), good)
    proc = batcher_process("--checkpoint", str(good), "--listen", "127.0.0.1:0")
    try:
        LogReader(proc).wait_for("serving", timeout=120)
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@contextmanager
def serving(model_process: bool, *args: str) -> Iterator[tuple[subprocess.Popen, dict, int]]:
    """A batcher started with ``args`` (and ``--model-process``), once it serves: its process,
    the log line that says its model is loaded, and its port."""
    extra = ("--model-process",) if model_process else ()
    proc = batcher_process(*args, "--listen", "127.0.0.1:0", *extra)
    try:
        logs = LogReader(proc)
        loaded = logs.wait_for("model process ready" if model_process else "model loaded")
        yield proc, loaded, logs.wait_for("serving")["port"]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def mapped_torch(pid: int) -> bool:
    """Whether process ``pid`` has loaded torch's libraries."""
    return "libtorch" in Path(f"/proc/{pid}/maps").read_text()


@pytest.mark.parametrize("model_process", [False, True], ids=["in-process", "model-process"])
def test_a_model_that_is_not_a_torch_module_is_served_without_torch(model_process: bool) -> None:
    """A numpy batch callable under the default ``--device auto``: torch's libraries are never
    mapped, in the server or in the model's child, and the device reported is the CPU.
    ``--torch-threads`` has nothing to set then, and does not load torch either."""
    model = ("--model", "tests.batcher.batcher_test_models:echo", "--torch-threads", "2")
    with serving(model_process, *model) as (proc, loaded, port):
        body = {
            "inputs": [
                {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                {"name": "k", "shape": [1, 1], "datatype": "INT32", "data": [7]},
            ]
        }
        url = f"http://127.0.0.1:{port}/v2/models/echo/infer"
        reply = requests.post(url, json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [2, 4, 6]
        for pid in [proc.pid, *([loaded["pid"]] if model_process else [])]:
            assert not mapped_torch(pid), f"process {pid} loaded torch"
        assert loaded["device"] == "cpu"


@pytest.mark.parametrize("model_process", [False, True], ids=["in-process", "model-process"])
def test_torch_threads_reach_the_thread_that_runs_a_torch_model(model_process: bool) -> None:
    """``--torch-threads 3`` (not this machine's default) is the count the model's batches run
    with, in the server or in its child; with ``--model-process`` the server itself, which only
    forwards batches, never loads torch."""
    model = ("--model", "tests.batcher.batcher_test_models:torch_threads", "--device", "cpu")
    with serving(model_process, *model, "--torch-threads", "3") as (proc, loaded, port):
        body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0]}]}
        url = f"http://127.0.0.1:{port}/v2/models/threads/infer"
        reply = requests.post(url, json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        assert reply.json()["outputs"][0]["data"] == [3]
        assert mapped_torch(loaded["pid"] if model_process else proc.pid)
        if model_process:
            assert not mapped_torch(proc.pid), "a --model-process server loaded torch"


@pytest.mark.parametrize(
    ("factory", "loads_torch"), [("torch_threads", True), ("echo", False)], ids=["torch", "numpy"]
)
def test_a_repository_sets_torch_threads_as_each_model_loads(
    tmp_path: Path, factory: str, loads_torch: bool
) -> None:
    """A model repository applies ``--torch-threads`` once each model is loaded, as the one-model
    server does: a torch model's batches run with the count, and a repository of numpy models
    on the CPU never loads torch for the flag."""
    folder = tmp_path / "models" / "threads"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"model: tests.batcher.batcher_test_models:{factory}\n")
    args = ("--model-repository", str(tmp_path / "models"), "--device", "cpu")
    proc = batcher_process(*args, "--torch-threads", "3", "--listen", "127.0.0.1:0")
    try:
        logs = LogReader(proc)
        logs.wait_for("model loaded")
        port = logs.wait_for("serving")["port"]
        assert mapped_torch(proc.pid) is loads_torch
        if loads_torch:
            body = {"inputs": [{"name": "x", "shape": [1, 1], "datatype": "FP32", "data": [0]}]}
            reply = requests.post(
                f"http://127.0.0.1:{port}/v2/models/threads/infer", json=body, timeout=60
            )
            assert reply.status_code == 200, reply.text
            assert reply.json()["outputs"][0]["data"] == [3]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA: the flag is valid")
def test_cuda_on_a_machine_without_cuda_is_refused_at_once() -> None:
    line = start_up_error("--device", "cuda", "--listen", "127.0.0.1:0")
    assert "--device cuda" in line and "--device cpu" in line


def test_a_port_in_use_is_refused_before_the_model_loads() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        line = start_up_error("--listen", f"127.0.0.1:{port}")
    assert f"--listen '127.0.0.1:{port}'" in line and "choose another --listen" in line


@pytest.mark.timeout(120)
def test_sigterm_drains_queued_and_running_requests_then_exits() -> None:
    proc = batcher_process(
        "--model",
        "tests.batcher.batcher_test_models:slow_echo",
        "--listen",
        "127.0.0.1:0",
        "--max-batch-size",
        "2",
        "--slo-seconds",
        "5",
    )
    try:
        logs = LogReader(proc)
        port = logs.wait_for("serving")["port"]
        frozen = logs.wait_for("start-up heap frozen")["objects"]
        url = f"http://127.0.0.1:{port}"
        gc_series = {
            (s.name, s.labels.get("generation")): s.value
            for family in text_string_to_metric_families(
                requests.get(f"{url}/metrics", timeout=10).text
            )
            for s in family.samples
            if s.name.startswith("autoglm_batcher_gc_")
        }
        body = {
            "inputs": [
                {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                {"name": "k", "shape": [1, 1], "datatype": "INT32", "data": [0]},
            ]
        }
        replies: list[requests.Response] = []

        def post(i: int) -> None:
            payload = json.loads(json.dumps(body))
            payload["inputs"][1]["data"] = [i]
            replies.append(requests.post(f"{url}/v2/models/echo/infer", json=payload, timeout=60))

        threads = [threading.Thread(target=post, args=(i,)) for i in range(10)]
        for t in threads:
            t.start()
        # Ten requests at 0.2 s per batch of two: signal once all ten are accepted and some wait.

        def all_accepted_some_waiting() -> bool:
            seen = series(requests.get(f"{url}/metrics", timeout=10).text)
            return seen["ok"] + seen["queued"] + seen["running"] == 10 and seen["queued"] > 0

        wait_until(
            all_accepted_some_waiting,
            timeout=30,
            what="all requests to be accepted, some waiting",
            interval=0.01,
            detail=lambda: f"seen: {series(requests.get(f'{url}/metrics', timeout=10).text)}",
        )
        proc.send_signal(signal.SIGTERM)
        logs.wait_for("draining")
        refused = requests.post(f"{url}/v2/models/echo/infer", json=body, timeout=30)
        ready = requests.get(f"{url}/v2/health/ready", timeout=30)
        for t in threads:
            t.join(timeout=60)
        stopped = logs.wait_for("stopped")
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert refused.status_code == 503 and "shutting down" in refused.json()["error"]
    assert ready.status_code == 503
    assert sorted(r.status_code for r in replies) == [200] * 10
    assert sorted(r.json()["outputs"][1]["data"][0] for r in replies) == list(range(10))
    assert stopped["drained"] is True
    # the start-up heap is out of the collector's way, and collections are timed from then on
    assert frozen > 10_000 and gc_series["autoglm_batcher_gc_frozen_objects", None] > 10_000
    assert {("autoglm_batcher_gc_pause_seconds_count", g) for g in "012"} <= set(gc_series)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie waiting for its new parent to reap it does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def test_a_worker_with_exit_with_parent_stops_when_its_supervisor_is_killed(tmp_path) -> None:
    """``autoglm up`` killed with SIGKILL cannot stop its workers; they notice and drain."""
    log_file = tmp_path / "worker.log"
    supervisor = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time\n"
            "worker = subprocess.Popen([sys.executable, '-m', 'batcher.cli', '--model',"
            " 'tests.batcher.batcher_test_models:slow_echo', '--listen', '127.0.0.1:0',"
            " '--warmup-repeats', '0', '--exit-with-parent'],"
            f" stderr=open({str(log_file)!r}, 'w'), start_new_session=True)\n"
            "print(worker.pid, flush=True)\n"
            "time.sleep(600)\n",
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        text=True,
    )
    assert supervisor.stdout is not None
    worker = int(supervisor.stdout.readline())
    try:
        deadline = time.monotonic() + 60
        while '"serving"' not in log_file.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert _alive(worker)
        supervisor.kill()
        supervisor.wait()
        wait_until(
            lambda: not _alive(worker),
            timeout=30,
            what="the worker to exit (it outlived its supervisor)",
            interval=0.2,
        )
        assert "parent process gone; draining and exiting" in log_file.read_text()
    finally:
        if _alive(worker):
            os.kill(worker, signal.SIGKILL)
