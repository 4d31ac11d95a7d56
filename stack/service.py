"""One address in front of the ready workers, as a Kubernetes Service is in front of its pods.

The best-effort job talks to a single endpoint (in a cluster: the batchers' Service), while the
local workers come and go on ports of their own. This forwards each request, unchanged, to the
next ready worker in turn and passes the answer back with its status and ``Retry-After``. A
refusal for lack of capacity (429) is tried on the next worker first, as a proxy with a retry
policy on 429 does (Envoy's retriable status codes in a service mesh), so one busy worker does not
turn the job away while another has idle time; the job runner sees a 429 only when every ready
worker refused (the refusal whose ``Retry-After`` comes soonest, when the first of them expects
idle capacity), and a 503 with ``Retry-After`` while no worker is ready. The load generator keeps
its own round-robin: it plays the online users, who reach the fleet the same way.
"""

from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Sequence

import aiohttp
from aiohttp import web

from jobs.concurrency import parse_retry_after
from stack.loadgen import RoundRobin

log = logging.getLogger(__name__)

FORWARDED_HEADERS = ("Content-Type", "Retry-After")
NO_WORKER_RETRY_AFTER = "1"
REFUSED = 429
UPSTREAM_TIMEOUT_SECONDS = 30.0


class LocalService:
    """A round-robin HTTP proxy on ``host:port`` (0: a free port) to the ready workers."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.router = RoundRobin()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._session: aiohttp.ClientSession | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def set_endpoints(self, endpoints: Sequence[str]) -> None:
        """``HOST:PORT`` of the workers that may take requests now."""
        self.router.set(endpoints)

    def start(self) -> None:
        """Listen in a background thread with its own event loop; OSError if the port is taken."""
        self._thread = threading.Thread(target=self._run, name="autoglm-up-service", daemon=True)
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10.0)

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._listen())
        except BaseException as exc:  # reported to start(), which raises it
            self._error = exc
            self._ready.set()
            loop.close()
            return
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.run_until_complete(self._shutdown())
            loop.close()

    async def _listen(self) -> None:
        app = web.Application(client_max_size=64 * 1024 * 1024)
        app.router.add_route("*", "/{path:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port, reuse_address=True)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=UPSTREAM_TIMEOUT_SECONDS),
            connector=aiohttp.TCPConnector(limit=0),
            auto_decompress=False,
        )

    async def _shutdown(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.Response:
        assert self._session is not None
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k in ("Content-Type", "Accept")}
        answer = _unavailable("no worker is ready")
        refusal: web.Response | None = None
        for _ in range(max(1, self.router.size)):
            endpoint = self.router.pick()
            if endpoint is None:
                break
            try:
                async with self._session.request(
                    request.method,
                    f"http://{endpoint}{request.rel_url}",
                    data=body,
                    headers=headers,
                ) as upstream:
                    payload = await upstream.read()
                    kept = {
                        k: upstream.headers[k] for k in FORWARDED_HEADERS if k in upstream.headers
                    }
                    answer = web.Response(status=upstream.status, body=payload, headers=kept)
            except (aiohttp.ClientError, TimeoutError) as exc:
                # The worker is stopping (taken out of rotation a moment ago) or gone.
                log.debug("forward failed", extra={"endpoint": endpoint, "error": str(exc)[:200]})
                answer = _unavailable(f"worker {endpoint} did not answer")
                continue
            if answer.status != REFUSED:
                return answer
            refusal = sooner(refusal, answer)
        return refusal or answer


def sooner(first: web.Response | None, second: web.Response) -> web.Response:
    """Of two workers' refusals, the one whose Retry-After comes sooner: a job refused by every
    worker should come back when the first of them expects idle capacity, not the last. A
    refusal without a usable Retry-After counts as the longest."""

    def wait(answer: web.Response) -> float:
        seconds = parse_retry_after(answer.headers.get("Retry-After"))
        return math.inf if seconds is None else seconds

    return second if first is None or wait(second) < wait(first) else first


def _unavailable(reason: str) -> web.Response:
    return web.json_response(
        {"error": f"{reason}; retry later"},
        status=503,
        headers={"Retry-After": NO_WORKER_RETRY_AFTER},
    )
