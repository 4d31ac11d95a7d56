"""The shared server's body timeout, against raw-socket clients: a body that stalls, or trickles
slower than the minimum rate, is answered 408 and its connection closed; one that keeps coming,
however slowly within the bounds, is served."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from autoglm.web.body_timeout import MIN_BODY_RATE
from autoglm.web.exchange import Request, Response
from autoglm.web.server import HTTPServer
from tests.stalled_body import head, send_slowly, stall, trickle

pytestmark = pytest.mark.timeout(60)

TIMEOUT_S = 0.5
# The trickle's drip is far inside its pause bound, so a drip late on a busy machine is not cut
# as a stall before the minimum rate cuts the trickle.
TRICKLE_TIMEOUT_S = 2.0
TIMEOUTS_TOTAL = "autoglm_http_request_body_timeouts_total"


def body_size(request: Request) -> Response:
    return Response.json({"received": len(request.body)})


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


def started(registry: CollectorRegistry, timeout_s: float) -> HTTPServer:
    routes = {"POST /upload": body_size, "/metrics": lambda request: Response.text("ok")}
    return HTTPServer("127.0.0.1:0", routes, registry=registry, body_timeout_s=timeout_s)


@pytest.fixture
def server(registry: CollectorRegistry) -> Iterator[HTTPServer]:
    with started(registry, TIMEOUT_S) as running:
        yield running


@pytest.fixture
def trickle_server(registry: CollectorRegistry) -> Iterator[HTTPServer]:
    with started(registry, TRICKLE_TIMEOUT_S) as running:
        yield running


@pytest.mark.parametrize("path", ["/upload", "/metrics"])
def test_a_stalled_body_gets_408_and_its_connection_closed(
    server: HTTPServer, registry: CollectorRegistry, caplog: pytest.LogCaptureFixture, path: str
) -> None:
    """Any routed request, a GET of /metrics with a body included: the server reads the body
    before it runs the route."""
    method = "POST" if path == "/upload" else "GET"
    with caplog.at_level(logging.INFO):
        answer = stall(server.port, head(method, path, 100), b"abc")
    assert answer.status == 408
    assert answer.headers["connection"] == "close"
    assert answer.body.decode().startswith(
        f"request body timed out: nothing arrived for {TIMEOUT_S:g} s (3 of 100 bytes received)"
    )
    assert registry.get_sample_value(TIMEOUTS_TOTAL) == 1
    assert (
        registry.get_sample_value("autoglm_http_requests_total", {"path": path, "code": "408"}) == 1
    )
    logged = [r for r in caplog.records if r.getMessage() == "request body timed out"]
    assert [(r.path, r.received_bytes, r.reason) for r in logged] == [(path, 3, "stalled")]  # type: ignore[attr-defined]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_a_body_trickled_slower_than_the_minimum_rate_gets_408(
    trickle_server: HTTPServer, registry: CollectorRegistry
) -> None:
    """A byte every twentieth of the timeout never pauses long enough to be cut for stalling:
    the minimum rate cuts it (slowloris)."""
    answer = trickle(trickle_server.port, head("POST", "/upload", 1 << 20), every_s=0.1)
    assert answer.status == 408
    assert "slower than" in answer.body.decode()
    assert registry.get_sample_value(TIMEOUTS_TOTAL) == 1


def test_a_slow_body_that_keeps_coming_is_served(registry: CollectorRegistry) -> None:
    """Sent in pieces over about twice the timeout, at twice the minimum rate: never cut."""
    timeout_s, pieces, pause_s = 1.0, 10, 0.2
    body = b"x" * int(2 * MIN_BODY_RATE * pause_s * pieces)
    with HTTPServer(
        "127.0.0.1:0", {"POST /upload": body_size}, registry=registry, body_timeout_s=timeout_s
    ) as server:
        request = head("POST", "/upload", len(body), {"Connection": "close"})
        answer = send_slowly(server.port, request, body, pieces, pause_s)
    assert answer.status == 200
    assert json.loads(answer.body) == {"received": len(body)}
    assert registry.get_sample_value(TIMEOUTS_TOTAL) == 0
