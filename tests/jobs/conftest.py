"""Fixtures for the job runner tests: request files, the real batcher, a scriptable endpoint."""

from __future__ import annotations

import json
import random
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from autoglm.web.exchange import Request, Response
from autoglm.web.server import HTTPServer
from batcher.models.demo import factory as demo_factory
from tests.batcher.conftest import ServerThread

FEATURES = 16
MALFORMED = {5: "{not json", 9: '{"id": "no-inputs"}'}  # line number -> text


def write_requests(path: Path, count: int, malformed: dict[int, str] | None = None) -> Path:
    """``count`` lines of demo-model requests (ids ``r<line>``), some of them malformed."""
    rng = random.Random(count)
    bad = MALFORMED if malformed is None else malformed
    with path.open("w") as handle:
        for line in range(1, count + 1):
            if line in bad:
                handle.write(bad[line] + "\n")
                continue
            row = [round(rng.uniform(-1, 1), 4) for _ in range(FEATURES)]
            tensor = {"name": "input", "shape": [1, FEATURES], "datatype": "FP32", "data": row}
            handle.write(json.dumps({"id": f"r{line}", "inputs": [tensor]}) + "\n")
    return path


def expected_logits(path: Path) -> dict[int, list[float]]:
    """What the demo model answers for each well-formed line, computed directly."""
    model = demo_factory().eval()
    rows: dict[int, list[float]] = {}
    for number, raw in enumerate(path.read_text().splitlines(), start=1):
        try:
            rows[number] = json.loads(raw)["inputs"][0]["data"]
        except (json.JSONDecodeError, KeyError):
            continue
    with torch.no_grad():
        out = model(torch.tensor(list(rows.values()), dtype=torch.float32)).numpy()
    return {number: out[i].tolist() for i, number in enumerate(rows)}


def records(path: Path) -> list[dict]:
    return [json.loads(raw) for raw in path.read_text().splitlines()] if path.exists() else []


def assert_answers_match(out: list[dict], expected: dict[int, list[float]]) -> None:
    for record in out:
        got = np.array(record["outputs"][0]["data"], dtype=np.float32)
        np.testing.assert_allclose(got, expected[record["line"]], rtol=1e-4, atol=1e-5)


@pytest.fixture
def batcher() -> Iterator[Callable[..., ServerThread]]:
    """Start the real batcher serving the demo model as ``demo``; drained at teardown."""
    started: list[ServerThread] = []

    def start(web_config: object = None, **settings: object) -> ServerThread:
        settings.setdefault("model_name", "demo")
        settings.setdefault("warmup_repeats", 1)
        server = ServerThread(demo_factory(), web_config, **settings).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@dataclass
class ScriptedEndpoint:
    """A v2 endpoint whose answer to each request is chosen by ``decide`` (status, headers).

    Only for what the real batcher cannot be made to do on demand: refuse a given request,
    fail with a 5xx, refuse credentials.
    """

    decide: Callable[[dict, int], tuple[int, dict[str, str]]]
    metadata_status: int = 200
    attempts: dict[str, list[float]] = field(default_factory=dict)
    in_flight: int = 0
    max_in_flight: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)
    server: HTTPServer | None = None

    def _infer(self, request: Request) -> Response:
        body = json.loads(request.body)
        with self._lock:
            times = self.attempts.setdefault(body["id"], [])
            times.append(time.monotonic())
            attempt = len(times)
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            time.sleep(0.01)
            status, headers = self.decide(body, attempt)
            if status != 200:
                response = Response.json({"error": f"scripted {status}"}, status)
            else:
                answer = {"model_name": "fake", "outputs": [{"name": "echo", "data": [attempt]}]}
                response = Response.json({"id": body["id"], **answer})
            response.headers.update(headers)
            return response
        finally:
            with self._lock:
                self.in_flight -= 1

    def start(self) -> ScriptedEndpoint:
        routes = {
            "POST /v2/models/fake/infer": self._infer,
            "/v2": lambda _: Response.json({"name": "fake"}, self.metadata_status),
            "/v2/models/fake/ready": lambda _: Response.json({"ready": True}),
        }
        self.server = HTTPServer("127.0.0.1:0", routes, component="fake-endpoint")
        self.server.start()
        return self

    @property
    def url(self) -> str:
        assert self.server is not None
        return self.server.url


@pytest.fixture
def scripted() -> Iterator[Callable[..., ScriptedEndpoint]]:
    started: list[ScriptedEndpoint] = []

    def start(decide: Callable[[dict, int], tuple[int, dict[str, str]]], **kw) -> ScriptedEndpoint:
        endpoint = ScriptedEndpoint(decide, **kw).start()
        started.append(endpoint)
        return endpoint

    yield start
    for endpoint in started:
        assert endpoint.server is not None
        endpoint.server.stop()
