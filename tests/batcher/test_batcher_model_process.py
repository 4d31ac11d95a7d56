"""``--model-process``: the model in a child process, its batches over a private socket pair."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import ml_dtypes
import numpy as np
import pytest
import requests
from prometheus_client import CollectorRegistry

from batcher.config import BatcherConfig
from batcher.engine import Batcher
from batcher.forwarding import FrameReader, frame
from batcher.memory import MemoryMonitor
from batcher.model_process import (
    ModelProcess,
    ModelProcessCollector,
    ModelProcessFailed,
    ReportedMemory,
    decode_payloads,
    encode_payloads,
)
from batcher.model_process_child import MemoryReport, serve_batches
from batcher.oip import DATATYPES
from tests.batcher.test_batcher_cli import LogReader, _alive, batcher_process, series
from tests.waiting import wait_until

EVERY_TYPE = "tests.batcher.batcher_test_models:every_type_echo"


def _payload(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal((rows, 2)).astype(np.float32)
    return {
        "f": values,
        "i": rng.integers(-(2**62), 2**62, (rows, 2), dtype=np.int64),
        "h": values.astype(ml_dtypes.bfloat16),
        "s": np.array([[b"", bytes([seed % 256]) * 3]] * rows, dtype=object),
        "b": values > 0,
    }


def _same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and a[k].shape == b[k].shape and a[k].tolist() == b[k].tolist()
        for k in a
    )


@pytest.mark.parametrize("datatype", sorted(DATATYPES))
def test_every_datatype_travels_bit_for_bit(datatype: str) -> None:
    dtype = DATATYPES[datatype]
    if datatype == "BYTES":
        array = np.array([[b"a", b""], [b"\x00\xff", b"xyz" * 100]], dtype=object)
    elif datatype == "BOOL":
        array = np.array([[True, False], [False, True]])
    else:
        array = (np.arange(4) * 3).reshape(2, 2).astype(dtype)
    payloads = [{"x": array, "y": array[:1]}, {"x": array[::-1]}]
    described, raw = encode_payloads(payloads)
    back = decode_payloads(described, raw)
    assert all(_same(p, q) for p, q in zip(payloads, back, strict=True))
    assert all(array.flags.writeable for payload in back for array in payload.values())


def test_nothing_to_send_is_an_empty_frame() -> None:
    assert encode_payloads([]) == ([], b"")
    assert decode_payloads([], b"") == []


def _process(model: str) -> ModelProcess:
    """A model process for ``model`` on the CPU, not started."""
    return ModelProcess(BatcherConfig(model=model, model_process=True, log_format="text"), "cpu")


@pytest.fixture
def process():
    started = _process(EVERY_TYPE)
    started.start()
    yield started
    started.close()


@pytest.mark.slow
def test_batches_run_in_the_child_and_come_back_whole(process: ModelProcess) -> None:
    assert process.name == "every_type" and [s.datatype for s in process.inputs] == [
        "FP32",
        "INT64",
        "BF16",
        "BYTES",
        "BOOL",
    ]
    payloads = [_payload(rows, seed) for seed, rows in enumerate((1, 3, 2))]

    async def run():
        # the second is sent while the first runs: it waits in the socket, answered in turn
        return list(await asyncio.gather(process.send(payloads), process.send(payloads[:1])))

    before = time.monotonic()
    first, second = asyncio.run(run())
    assert first.ok and first.seconds > 0 and len(first.results) == 3
    # the child's clock is this process's: when the batch finished, for the dispatch gap
    assert first.finished_at is not None and second.finished_at is not None
    assert before < first.finished_at < second.finished_at < time.monotonic()
    for sent, got in zip(payloads, first.results, strict=True):
        assert _same({f"{k}_out": v for k, v in sent.items()}, got)
    assert second.ok and len(second.results) == 1
    assert process.pid is not None and process.pid != os.getpid()


@pytest.mark.slow
def test_a_model_error_fails_only_its_batch(process: ModelProcess) -> None:
    bad = _payload(1, 0)
    bad["f"][0, 0] = -1

    async def run():
        return await process.execute([bad]), await process.execute([_payload(1, 1)])

    failed, after = asyncio.run(run())
    assert not failed.ok and "RuntimeError: asked to fail" in failed.error
    assert after.ok


@pytest.mark.slow
def test_a_child_that_dies_fails_its_batch_and_is_replaced(process: ModelProcess) -> None:
    lost_up = None
    exported: dict = {}

    async def run():
        batcher = Batcher(process, slo_seconds=5.0)  # readiness follows the process
        await batcher.start()
        assert (await process.execute([_payload(1, 0)])).ok
        assert batcher.accepting
        first_pid = process.pid
        assert first_pid is not None
        os.kill(first_pid, signal.SIGKILL)
        lost = await process.execute([_payload(1, 1)])
        nonlocal lost_up
        lost_up = process.up
        assert not batcher.accepting  # not ready while the model is away
        while_restarting = await process.execute([_payload(1, 2)])
        deadline = time.monotonic() + 120
        while process.restarts == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert batcher.accepting
        registry = CollectorRegistry()
        registry.register(ModelProcessCollector(process))
        labels = {"model": "every_type"}
        nonlocal exported
        exported = {
            "up": registry.get_sample_value("autoglm_batcher_model_process_up", labels),
            "restarts": registry.get_sample_value(
                "autoglm_batcher_model_process_restarts_total", labels
            ),
        }
        after = await process.execute([_payload(2, 3)])
        await batcher.drain(10)
        return first_pid, lost, while_restarting, after

    first_pid, lost, while_restarting, after = asyncio.run(run())
    assert "model process ended while running the batch" in lost.error
    assert "restarting" in while_restarting.error
    assert process.restarts == 1 and process.pid != first_pid
    assert lost_up is False
    assert exported == {"up": 1.0, "restarts": 1.0}
    assert after.ok and len(after.results) == 1
    assert not _alive(first_pid)


@pytest.mark.slow
def test_a_model_that_does_not_load_says_why_once(capfd) -> None:
    failing = _process("no_such_module:factory")
    with pytest.raises(ModelProcessFailed) as failed:
        failing.start()
    assert str(failed.value).startswith("--model 'no_such_module:factory': cannot import")
    assert "no_such_module" not in capfd.readouterr().err  # the parent says it, once


@pytest.mark.slow
@pytest.mark.parametrize("workers", [0, 1])
def test_the_server_answers_through_the_child_and_stops_it_on_sigterm(workers: int) -> None:
    """One process, or front workers before the engine: the model's child answers either way."""
    proc = batcher_process(
        *("--model", "tests.batcher.batcher_test_models:echo", "--model-process"),
        *("--listen", "127.0.0.1:0", "--warmup-repeats", "1", "--workers", str(workers)),
    )
    try:
        logs = LogReader(proc)
        loaded = logs.wait_for("model loaded")  # the child's line: marked as the child's
        child = logs.wait_for("model process ready")["pid"]
        port = logs.wait_for("serving")["port"]
        url = f"http://127.0.0.1:{port}/v2/models/echo"
        body = {
            "inputs": [
                {"name": "x", "shape": [2, 3], "datatype": "FP32", "data": [1, 2, 3, 4, 5, 6]},
                {"name": "k", "shape": [2, 1], "datatype": "INT32", "data": [7, 8]},
            ]
        }
        answer = requests.post(f"{url}/infer", json=body, timeout=30)
        metadata = requests.get(url, timeout=30).json()
        metrics = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert answer.status_code == 200, answer.text
    outputs = {o["name"]: o["data"] for o in answer.json()["outputs"]}
    assert outputs == {"y": [2, 4, 6, 8, 10, 12], "k_out": [7, 8]}
    assert [i["name"] for i in metadata["inputs"]] == ["x", "k"]
    assert child != proc.pid and not _alive(child)
    assert loaded["role"] == "model-process" and "role" not in logs.seen[-1]
    assert 'autoglm_batcher_model_process_up{model="echo"} 1.0' in metrics
    assert 'autoglm_batcher_model_process_restarts_total{model="echo"} 0.0' in metrics


class _FakeCudaMemory(MemoryMonitor):
    """A CUDA monitor whose allocator answers without a GPU."""

    def __init__(self) -> None:
        super().__init__("cuda", 30.0)
        self.released: list[float] = []

    def stats(self) -> dict[str, float]:
        return {"allocated_bytes": 5.0, "reserved_bytes": 8.0}

    def headroom_bytes(self) -> float | None:
        return 1e9

    def release(self, last_activity: float) -> bool:
        self.released.append(last_activity)
        return True


def test_the_child_reports_headroom_each_answer_and_statistics_each_second() -> None:
    now = [100.0]
    report = MemoryReport(_FakeCudaMemory(), clock=lambda: now[0])
    first, soon = report(), report()
    now[0] += 1.0
    later = report()
    assert first == {
        "headroom_bytes": 1e9,
        "stats": {"allocated_bytes": 5.0, "reserved_bytes": 8.0},
    }
    assert soon == {"headroom_bytes": 1e9}  # no statistics between two scrapes' worth of time
    assert "stats" in later
    assert MemoryReport(MemoryMonitor("cpu", 30.0))() == {}  # nothing to report on CPU


class _Written:
    def __init__(self) -> None:
        self.frames: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.frames.append(data)


def test_the_engine_reads_the_childs_memory_and_passes_release_on() -> None:
    process = _process(EVERY_TYPE)  # not started: its reports are set by hand
    memory = ReportedMemory(process, "cuda", idle_release_seconds=30.0)
    assert memory.stats() == {} and memory.headroom_bytes() is None  # nothing reported yet
    process._replied({"memory": {"headroom_bytes": 2e9, "stats": {"allocated_bytes": 3.0}}}, b"")
    process._replied({"memory": {"headroom_bytes": 1e9}}, b"")  # a later answer, no statistics
    assert memory.headroom_bytes() == 1e9 and memory.stats() == {"allocated_bytes": 3.0}
    assert memory.release_due(50.0) == 80.0
    assert not memory.release(50.0)  # no child to ask
    written = _Written()
    process._transport = written  # type: ignore[assignment]
    assert memory.release(60.0) and memory.releases == 1
    [(call_id, envelope, _)] = FrameReader(None).feed(written.frames[0])
    assert call_id == 0 and envelope == {"release": 60.0}
    assert memory.release_due(60.0) is None  # released since the last batch
    assert not ReportedMemory(process, "cpu", 30.0).release(70.0)  # CPU: nothing cached


def test_the_child_serves_release_without_answering() -> None:
    import socket
    import threading

    parent, child = socket.socketpair()
    memory = _FakeCudaMemory()
    served = threading.Thread(target=serve_batches, args=(child, None, memory))
    served.start()
    parent.sendall(frame(0, {"release": 12.5}))
    parent.close()  # the child's loop ends at end of stream
    served.join(timeout=30)
    assert memory.released == [12.5] and not served.is_alive()


@pytest.mark.slow
def test_ctrl_c_to_the_whole_group_still_answers_every_accepted_request() -> None:
    """SIGINT to the server and its model process at once (a terminal's Ctrl-C): the server
    drains, and the model process stays until the last accepted request is answered."""
    import subprocess
    import sys
    import threading

    from tests.batcher.test_batcher_cli import ROOT

    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "batcher.cli", "--model-process", "--listen", "127.0.0.1:0"),
            *("--model", "tests.batcher.batcher_test_models:slow_echo", "--max-batch-size", "2"),
            *("--slo-seconds", "5", "--warmup-repeats", "0"),
        ],
        cwd=ROOT,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a group of its own, as a terminal's job is
    )
    try:
        logs = LogReader(proc)
        child = logs.wait_for("model process ready")["pid"]
        port = logs.wait_for("serving")["port"]
        body = {
            "inputs": [
                {"name": "x", "shape": [1, 3], "datatype": "FP32", "data": [1, 2, 3]},
                {"name": "k", "shape": [1, 1], "datatype": "INT32", "data": [0]},
            ]
        }
        replies: list[int] = []

        def post() -> None:
            url = f"http://127.0.0.1:{port}/v2/models/echo/infer"
            replies.append(requests.post(url, json=body, timeout=60).status_code)

        threads = [threading.Thread(target=post) for _ in range(6)]
        for thread in threads:
            thread.start()
        metrics_url = f"http://127.0.0.1:{port}/metrics"

        def all_accepted_some_waiting() -> bool:  # 0.2 s a batch of two
            seen = series(requests.get(metrics_url, timeout=10).text)
            return seen["ok"] + seen["queued"] + seen["running"] == 6 and seen["queued"] > 0

        wait_until(
            all_accepted_some_waiting,
            timeout=60,
            what="all requests to be accepted, some waiting",
            interval=0.01,
            detail=lambda: f"seen: {series(requests.get(metrics_url, timeout=10).text)}",
        )
        os.killpg(proc.pid, signal.SIGINT)
        for thread in threads:
            thread.join(timeout=60)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert replies == [200] * 6
    assert not _alive(child)


@pytest.mark.slow
def test_a_restart_that_cannot_load_the_model_is_tried_again_until_it_can(
    tmp_path, monkeypatch
) -> None:
    blocker = tmp_path / "blocked"
    monkeypatch.setenv("AUTOGLM_TEST_BLOCK_LOAD", str(blocker))
    process = _process("tests.batcher.batcher_test_models:every_type_echo_unless_blocked")
    process.start()

    async def run():
        assert (await process.execute([_payload(1, 0)])).ok
        blocker.touch()  # the next child cannot load the model
        os.kill(process.pid, signal.SIGKILL)
        await process.execute([_payload(1, 1)])  # fails: the child is gone
        await asyncio.sleep(3)  # a child or two fail to load meanwhile
        failing_meanwhile = await process.execute([_payload(1, 2)])
        assert process.restarts == 0 and not process.up
        blocker.unlink()
        deadline = time.monotonic() + 120
        while process.restarts == 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        return failing_meanwhile, await process.execute([_payload(1, 3)])

    try:
        failing_meanwhile, after = asyncio.run(run())
    finally:
        process.close()
    assert "restarting" in failing_meanwhile.error
    assert process.restarts == 1 and after.ok
