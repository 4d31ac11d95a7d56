"""The demo's best-effort job and the local Service in front of the workers.

The job runs through the real job runner, the Service and a real batcher (in-process, serving
the stack's model) as best-effort traffic; the Service is also checked on the answers a Service
must pass through unchanged: a worker's 429 with its Retry-After, and a 503 while no worker is
ready.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from autoglm.web.exchange import Response
from autoglm.web.server import HTTPServer
from batcher.oip import parse_infer_request
from stack.job import BestEffortJob, request_lines, write_requests
from stack.loadgen import FEATURES
from stack.model import factory
from stack.service import LocalService
from tests.batcher.conftest import ServerThread
from tests.waiting import wait_until


@pytest.fixture
def service():
    started = LocalService("127.0.0.1", 0)
    started.start()
    yield started
    started.stop()


def test_request_lines_are_v2_requests_the_workers_model_accepts(tmp_path: Path) -> None:
    path = write_requests(tmp_path / "job" / "requests.jsonl", 50)
    lines = path.read_text().splitlines()
    assert len(lines) == 50 and len({json.loads(x)["id"] for x in lines}) == 50
    assert lines == list(request_lines(50))  # the same backlog every time
    model = factory()
    for raw in lines[:3]:
        request = parse_infer_request(raw.encode(), None, model.input_specs, model.output_specs)
        assert request.size == 1 and request.inputs["input"].shape == (1, FEATURES)


def test_service_answers_503_with_retry_after_while_no_worker_is_ready(service) -> None:
    response = requests.post(f"{service.url}/v2/models/demo/infer", json={}, timeout=5)
    assert response.status_code == 503 and response.headers["Retry-After"] == "1"
    assert "no worker is ready" in response.json()["error"]


def worker(status: int, retry_after: str = "") -> HTTPServer:
    """A stand-in worker that answers every inference with ``status``."""
    body = b'{"error": "no idle capacity"}' if status == 429 else b'{"outputs": []}'
    headers = {"Retry-After": retry_after} if retry_after else {}
    answer = Response(status, body, "application/json", headers)
    server = HTTPServer(
        "127.0.0.1:0", {"POST /v2/models/demo/infer": lambda _: answer}, component="test-worker"
    )
    server.start()
    return server


def test_service_tries_the_next_worker_when_one_refuses(service) -> None:
    busy, idle = worker(429, "3"), worker(200)
    try:
        service.set_endpoints([f"127.0.0.1:{busy.port}", f"127.0.0.1:{idle.port}"])
        codes = [
            requests.post(f"{service.url}/v2/models/demo/infer", json={}, timeout=5).status_code
            for _ in range(4)
        ]
    finally:
        busy.stop()
        idle.stop()
    assert codes == [200] * 4


def test_service_passes_a_refusal_through_when_every_worker_refuses(service) -> None:
    refusing = [worker(429, "3"), worker(429, "3")]
    try:
        service.set_endpoints([f"127.0.0.1:{w.port}" for w in refusing])
        response = requests.post(f"{service.url}/v2/models/demo/infer", json={}, timeout=5)
    finally:
        for w in refusing:
            w.stop()
    assert response.status_code == 429 and response.headers["Retry-After"] == "3"
    assert response.json() == {"error": "no idle capacity"}


def test_service_passes_on_the_refusal_whose_capacity_returns_soonest(service) -> None:
    # whichever worker the round-robin tries first, the job hears the earliest Retry-After
    refusing = [worker(429, "9"), worker(429, "2"), worker(429, "5"), worker(429)]
    try:
        service.set_endpoints([f"127.0.0.1:{w.port}" for w in refusing])
        waits = [
            requests.post(f"{service.url}/v2/models/demo/infer", json={}, timeout=5).headers.get(
                "Retry-After"
            )
            for _ in range(len(refusing))
        ]
    finally:
        for w in refusing:
            w.stop()
    assert waits == ["2"] * len(refusing)


@pytest.mark.timeout(120)
def test_job_runs_in_rounds_on_a_real_batcher_as_best_effort(tmp_path: Path, service) -> None:
    worker = ServerThread(factory(), model_name="demo", warmup_repeats=1).start()
    job = BestEffortJob(tmp_path / "job", service.url, "demo", lines=30)
    try:
        service.set_endpoints([worker.url.removeprefix("http://")])
        job.prepare()
        job.start()
        wait_until(
            lambda: job.rounds >= 3 or job.error is not None,
            timeout=90,
            what="three rounds of the job (or its error)",
            interval=0.2,
        )
        metrics = requests.get(f"{worker.url}/metrics", timeout=5).text
    finally:
        job.stop()
        worker.stop()
    assert job.error is None
    assert job.rounds >= 3  # the backlog never runs dry: the job starts again when it ends
    first = (tmp_path / "job" / "answers-1.jsonl").read_text().splitlines()
    second = (tmp_path / "job" / "answers-2.jsonl").read_text().splitlines()
    assert len(first) == len(second) == 30
    assert job.done() >= 60
    # The batcher served them as best-effort work, on its own counters.
    served = [
        float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("autoglm_batcher_class_busy_seconds_total")
        and 'class="best_effort"' in line
    ]
    assert served and served[0] > 0
