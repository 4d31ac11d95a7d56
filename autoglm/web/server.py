"""An aiohttp server on a thread of its own, for components whose routes are synchronous code.

The exporter, predictor, autoscaler, job runner and local stack are threaded programs that serve
``/metrics``, health checks and small JSON APIs. :class:`HTTPServer` runs aiohttp's HTTP/1.1
(keep-alive, which Prometheus relies on) on an event loop in a background thread, accepts
through the shared :class:`~autoglm.web.listener.Listener` (TLS, client-certificate SANs, a
connection limit) and :func:`~autoglm.web.guard.guard` (basic auth, configured headers), and
runs each route handler on a worker thread, so a handler may block (on a lock, a file, a bcrypt)
without holding up other requests. ``start`` raises a clear error for a taken port; ``stop``
closes idle keep-alive connections and joins every thread the server started. The server counts
its own requests (:mod:`~autoglm.web.request_metrics`) and, at debug level, logs each one. A
request body that stops arriving is answered 408 after ``body_timeout_s``
(:mod:`~autoglm.web.body_timeout`).

When the web config has users, every path needs credentials (as in exporter-toolkit) unless it
is listed in ``open_paths``; see :mod:`~autoglm.web.routes` for how routes are matched.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from collections.abc import Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from http import HTTPStatus
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from aiohttp import web
from prometheus_client import CollectorRegistry

from autoglm.config import parse_listen
from autoglm.self_metrics import describe_self
from autoglm.web.binding import bind_socket, local_url
from autoglm.web.body import UnreadableBody, closing_if_unreadable, read_whole
from autoglm.web.body_timeout import BODY_TIMEOUT, BODY_TIMEOUT_S, BodyTimeout
from autoglm.web.exchange import Handler, Request, Response
from autoglm.web.guard import guard
from autoglm.web.listener import ConnectionMetrics, Listener
from autoglm.web.request_metrics import RequestMetrics
from autoglm.web.routes import RouteTable
from autoglm.webconfig import WebConfig

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler as AsyncHandler

log = logging.getLogger(__name__)

# Idle keep-alive connections are closed after this long.
CONNECTION_TIMEOUT_S = 60.0
MAX_BODY_BYTES = 1 << 20
# Open connections (handshakes included) beyond which new ones are closed at once; also the
# most handlers that run at the same time.
MAX_CONNECTIONS = 256
# How long ``stop`` lets requests in progress finish before closing their connections.
_STOP_TIMEOUT_S = 5.0


class HTTPServer:
    """Serve ``routes`` on ``listen`` (``HOST:PORT``; port 0 picks a free one) in the background."""

    def __init__(
        self,
        listen: str,
        routes: Mapping[str, Handler],
        web_config: WebConfig | None = None,
        component: str = "autoglm",
        registry: CollectorRegistry | None = None,
        open_paths: Collection[str] = (),
        max_body_bytes: int = MAX_BODY_BYTES,
        max_connections: int = MAX_CONNECTIONS,
        body_timeout_s: float = BODY_TIMEOUT_S,
    ) -> None:
        self.host, self._requested_port = parse_listen(listen)
        self.component = component
        self.web_config = web_config or WebConfig()
        self.open_paths = frozenset(open_paths)
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self._routes = RouteTable(routes)
        registry = registry or CollectorRegistry()
        describe_self(registry, component)
        self.metrics = RequestMetrics(registry, self._routes.paths)
        self.connection_metrics = ConnectionMetrics(registry)
        self.body_timeout = BodyTimeout(body_timeout_s, self.connection_metrics.body_timeouts)
        if self.web_config.watched:
            registry.register(self.web_config)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        self._bound_port = 0

    @property
    def port(self) -> int:
        """The port bound by :meth:`start` (kept after :meth:`stop`), else the one asked for."""
        return self._bound_port or self._requested_port

    @property
    def url(self) -> str:
        """Base URL for a client on this machine (tests, the local stack)."""
        return local_url(self.host, self.port, self.web_config.ssl_context() is not None)

    def start(self) -> None:
        """Bind and serve in a background thread; a taken port or bad address is a ConfigError."""
        if self._loop is not None:
            raise RuntimeError("HTTPServer already started")
        sock = bind_socket(self.host, self._requested_port)
        self._bound_port = sock.getsockname()[1]
        loop = asyncio.new_event_loop()
        executor = ThreadPoolExecutor(
            max_workers=self.max_connections, thread_name_prefix=f"{self.component}-http-handler"
        )
        loop.set_default_executor(executor)  # handlers and bcrypt checks run here
        thread = threading.Thread(
            target=loop.run_forever, name=f"{self.component}-http", daemon=True
        )
        self._loop, self._thread, self._executor = loop, thread, executor
        thread.start()
        try:
            asyncio.run_coroutine_threadsafe(self._serve(sock), loop).result()
        except BaseException:
            sock.close()
            self.stop()
            raise
        log.info(
            "serving HTTP",
            extra={
                "server": self.component,
                "listen": f"{self.host}:{self.port}",
                "tls": self.web_config.ssl_context() is not None,
                "basic_auth": self.web_config.auth_required,
            },
        )

    def stop(self) -> None:
        """Stop accepting, close open connections and join every thread this server started."""
        loop, thread, executor = self._loop, self._thread, self._executor
        if loop is None or thread is None or executor is None:
            return
        try:
            asyncio.run_coroutine_threadsafe(self._close(), loop).result()
        finally:
            loop.call_soon_threadsafe(loop.stop)
            thread.join()
            loop.close()
            executor.shutdown(wait=True)
            self._loop = self._thread = self._executor = None

    def __enter__(self) -> HTTPServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    async def _serve(self, sock: socket.socket) -> None:
        app = web.Application(
            middlewares=[
                self._observe,
                guard(self.web_config, self.component, _unauthorized, self.open_paths),
            ],
            client_max_size=self.max_body_bytes,
        )
        app[BODY_TIMEOUT] = self.body_timeout
        app.router.add_route("*", "/{path:.*}", self._dispatch)
        runner = web.AppRunner(
            app,
            access_log=None,
            keepalive_timeout=CONNECTION_TIMEOUT_S,
            shutdown_timeout=_STOP_TIMEOUT_S,
        )
        await runner.setup()
        self._runner = runner
        server = runner.server
        assert server is not None
        self._listener = Listener(
            server,
            lambda: len(server.connections),
            self.web_config,
            self.connection_metrics,
            max_connections=self.max_connections,
        )
        await self._listener.start(sock)

    async def _close(self) -> None:
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    @web.middleware
    async def _observe(self, request: web.Request, handler: AsyncHandler) -> web.StreamResponse:
        """Count and time each request and, at debug level, log it."""
        started = time.perf_counter()
        response = await handler(request)
        response.headers["Server"] = self.component
        # Counted before sending, so a client that has the response also sees it counted.
        elapsed = time.perf_counter() - started
        self.metrics.observe(self._routes.label(request.path), response.status, elapsed)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request",
                extra={
                    "method": request.method,
                    "path": request.path,
                    "status": response.status,
                    "duration_s": round(elapsed, 6),
                    "client": request.remote,
                },
            )
        return response

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        found = self._routes.find(request.method, request.path)
        if isinstance(found, Response):
            return _to_aiohttp(found)
        if "chunked" in request.headers.get("Transfer-Encoding", "").lower():
            return _text_refusal("send a Content-Length, not chunked", HTTPStatus.LENGTH_REQUIRED)
        try:
            body = await read_whole(request)
        except UnreadableBody as exc:
            return closing_if_unreadable(_text_refusal(str(exc), exc.status), exc)
        except web.HTTPRequestEntityTooLarge:
            return _text_refusal(
                f"request body over {self.max_body_bytes} bytes",
                HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
            )
        exchange = Request(
            method=request.method,
            path=request.path,
            query=parse_qs(request.query_string, keep_blank_values=True),
            headers=request.headers,
            body=body,
        )
        try:
            response = await asyncio.get_running_loop().run_in_executor(None, found, exchange)
        except Exception:
            log.exception(
                "request handler failed", extra={"path": request.path, "method": request.method}
            )
            response = Response.text("internal server error", HTTPStatus.INTERNAL_SERVER_ERROR)
        return _to_aiohttp(response)


def _to_aiohttp(response: Response) -> web.Response:
    return web.Response(
        status=response.status,
        body=response.body,
        headers={"Content-Type": response.content_type, **response.headers},
    )


def _text_refusal(message: str, status: int) -> web.StreamResponse:
    return _to_aiohttp(Response.text(message, status))


def _unauthorized() -> web.StreamResponse:
    return _text_refusal("unauthorized", HTTPStatus.UNAUTHORIZED)
