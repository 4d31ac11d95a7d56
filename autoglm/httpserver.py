"""A small threaded HTTP/1.1 server for /metrics, health checks and simple JSON endpoints.

Every component serves a handful of fixed paths; this module gives them one server with the
things each would otherwise get wrong on its own: keep-alive (Prometheus reuses connections),
TLS and basic auth from a web config (:mod:`autoglm.webconfig`), the TLS handshake done on the
connection's own thread (a slow client never stalls ``accept``), a clear error for a taken port,
a ``stop`` that closes idle keep-alive connections and joins every thread, and the server's own
request metrics.

Routes are matched by exact path. A key ``"/path"`` serves ``GET`` (and ``HEAD``, with the body
dropped); a key ``"POST /path"`` serves that method. Any other method on a known path gets 405
with an ``Allow`` header; an unknown path gets 404. When the web config has users, every path
needs credentials (as in exporter-toolkit) unless it is listed in ``open_paths``.
"""

from __future__ import annotations

import contextlib
import gzip
import json
import logging
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import choose_encoder, gzip_accepted

from autoglm.config import ConfigError, parse_listen
from autoglm.webconfig import WebConfig

log = logging.getLogger(__name__)

# Idle keep-alive connections and slow TLS handshakes give up their thread after this long.
CONNECTION_TIMEOUT_S = 60.0
TLS_HANDSHAKE_TIMEOUT_S = 10.0
MAX_BODY_BYTES = 1 << 20
# Each connection holds a thread; beyond this many, new connections are closed at once.
MAX_CONNECTIONS = 256
_STOP_JOIN_TIMEOUT_S = 5.0
_OTHER_PATH = "other"


@dataclass
class Request:
    """What a route handler sees of one request."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]  # case-insensitive
    body: bytes


@dataclass
class Response:
    """What a route handler returns."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, data: Any, status: int = 200) -> Response:
        """A JSON body, for the small API endpoints components expose."""
        return cls(status=status, body=json.dumps(data).encode(), content_type="application/json")

    @classmethod
    def text(cls, text: str, status: int = 200) -> Response:
        """A plain-text body ending in a newline, for health checks and error messages."""
        return cls(status=status, body=(text.rstrip("\n") + "\n").encode())

    def with_header(self, name: str, value: str) -> Response:
        """Add a response header; returns ``self`` so it chains."""
        self.headers[name] = value
        return self


Handler = Callable[[Request], Response]


def registry_route(registry: CollectorRegistry) -> Handler:
    """A handler exposing ``registry``: Prometheus text, or OpenMetrics when the Accept header
    asks for it; gzip when the client accepts it; ``?name[]=`` restricts to some metrics."""

    def serve_registry(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        names = request.query.get("name[]")
        source = registry.restricted_registry(names) if names else registry
        body = encoder(source)
        headers = {}
        if gzip_accepted(request.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        return Response(body=body, content_type=content_type, headers=headers)

    return serve_registry


class _ServerMetrics:
    """The server's own request metrics; children are resolved once per (path, code)."""

    def __init__(self, registry: CollectorRegistry, paths: Collection[str]) -> None:
        self.requests = Counter(
            "autoglm_http_requests",
            "HTTP requests served, by route path (other: unknown paths) and status code.",
            ["path", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "autoglm_http_request_duration_seconds",
            "Time from the end of a request's headers until its response is ready to send.",
            ["path"],
            registry=registry,
        )
        self.tls_handshake_errors = Counter(
            "autoglm_http_tls_handshake_errors",
            "TLS connections closed before a request: failed handshake, refused client "
            "certificate or SAN not allowed.",
            registry=registry,
        )
        self.connections_refused = Counter(
            "autoglm_http_connections_refused",
            "Connections closed on arrival because the server already had its maximum open.",
            registry=registry,
        )
        self._durations = {p: self.duration.labels(path=p) for p in [*paths, _OTHER_PATH]}
        self._counts: dict[tuple[str, int], Any] = {}

    def observe(self, path: str, code: int, seconds: float) -> None:
        child = self._counts.get((path, code))
        if child is None:
            child = self._counts.setdefault((path, code), self.requests.labels(path, str(code)))
        child.inc()
        self._durations[path].observe(seconds)


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
    ) -> None:
        self.host, self._requested_port = parse_listen(listen)
        self.component = component
        self.web_config = web_config or WebConfig()
        self.open_paths = frozenset(open_paths)
        self.max_body_bytes = max_body_bytes
        self.max_connections = max_connections
        self._routes: dict[str, dict[str, Handler]] = {}
        for key, handler in routes.items():
            method, path = _parse_route_key(key)
            self._routes.setdefault(path, {})[method] = handler
            if method == "GET":
                self._routes[path].setdefault("HEAD", handler)
        registry = registry or CollectorRegistry()
        self.metrics = _ServerMetrics(registry, self._routes)
        if self.web_config.watched:
            registry.register(self.web_config)
        self._server: _ThreadingServer | None = None
        self._thread: threading.Thread | None = None
        self._bound_port = 0

    @property
    def port(self) -> int:
        """The port bound by :meth:`start` (kept after :meth:`stop`), else the one asked for."""
        return self._bound_port or self._requested_port

    @property
    def url(self) -> str:
        """Base URL for a client on this machine (tests, the local stack)."""
        scheme = "https" if self.web_config.ssl_context() else "http"
        host = self.host
        if host in ("0.0.0.0", ""):
            host = "127.0.0.1"
        elif host == "::":
            host = "::1"
        if ":" in host:
            host = f"[{host}]"
        return f"{scheme}://{host}:{self.port}"

    def start(self) -> None:
        """Bind and serve in a background thread; a taken port or bad address is a ConfigError."""
        if self._server is not None:
            raise RuntimeError("HTTPServer already started")
        where = f"{self.host}:{self._requested_port}"
        try:
            infos = socket.getaddrinfo(
                self.host, self._requested_port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
            )
        except socket.gaierror as exc:
            raise ConfigError(
                f"cannot listen on {where}: unknown host {self.host!r} ({exc.strerror}); "
                "use an IP address of this machine, e.g. 127.0.0.1:PORT or :PORT for all"
            ) from exc
        family, _, _, _, address = infos[0]
        try:
            server = _ThreadingServer(address, family, self)
        except OSError as exc:
            raise ConfigError(
                f"cannot listen on {where}: {exc.strerror or exc}; "
                "stop whatever holds the port or choose another --listen HOST:PORT"
            ) from exc
        self._server = server
        self._bound_port = server.server_address[1]
        self._thread = threading.Thread(
            target=server.serve_forever,
            kwargs={"poll_interval": 0.2},
            name=f"{self.component}-http",
            daemon=True,
        )
        self._thread.start()
        log.info(
            "serving HTTP",
            extra={
                "listen": f"{self.host}:{self.port}",
                "tls": self.web_config.ssl_context() is not None,
                "basic_auth": self.web_config.auth_required,
            },
        )

    def stop(self) -> None:
        """Stop accepting, close open connections and join every thread this server started."""
        server, thread = self._server, self._thread
        if server is None or thread is None:
            return
        server.shutdown()
        thread.join()
        server.server_close()
        server.close_connections()
        self._server = None
        self._thread = None

    def __enter__(self) -> HTTPServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _dispatch(self, request: Request) -> tuple[Response, str]:
        """Pick and run the handler; return the response and the path label for metrics."""
        methods = self._routes.get(request.path)
        if methods is None:
            label = _OTHER_PATH
            if not self._authorized(request):
                return self._unauthorized(), label
            return Response.text("not found", HTTPStatus.NOT_FOUND), label
        label = request.path
        if request.path not in self.open_paths and not self._authorized(request):
            return self._unauthorized(), label
        handler = methods.get(request.method)
        if handler is None:
            allow = ", ".join(sorted(methods))
            return Response.text(
                f"method {request.method} not allowed on {request.path}; allowed: {allow}",
                HTTPStatus.METHOD_NOT_ALLOWED,
            ).with_header("Allow", allow), label
        try:
            response = handler(request)
        except Exception:
            log.exception(
                "request handler failed", extra={"path": request.path, "method": request.method}
            )
            return Response.text("internal server error", HTTPStatus.INTERNAL_SERVER_ERROR), label
        return response, label

    def _authorized(self, request: Request) -> bool:
        return self.web_config.authorized(request.headers.get("Authorization"))

    def _unauthorized(self) -> Response:
        return Response.text("unauthorized", HTTPStatus.UNAUTHORIZED).with_header(
            "WWW-Authenticate", f'Basic realm="{self.component}"'
        )


def _parse_route_key(key: str) -> tuple[str, str]:
    method, sep, path = key.partition(" ")
    if not sep:
        method, path = "GET", key
    if not path.startswith("/") or not method.isupper():
        raise ValueError(f"route {key!r} must be '/path' or 'METHOD /path'")
    return method, path


class _ThreadingServer(ThreadingHTTPServer):
    """ThreadingHTTPServer that tracks its connections so ``stop`` can close and join them."""

    daemon_threads = True
    block_on_close = False

    def __init__(self, address: tuple[Any, ...], family: int, owner: HTTPServer) -> None:
        self.address_family = family
        self.owner = owner
        self._connections: dict[threading.Thread, socket.socket] = {}
        self._connections_lock = threading.Lock()
        self._closing = False
        super().__init__(address, _RequestHandler)

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the host's FQDN, which can wait on DNS; not needed.
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)
        self.server_name = str(self.server_address[0])
        self.server_port = self.server_address[1]

    def process_request(self, request: Any, client_address: Any) -> None:
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name=f"{self.owner.component}-http-conn",
            daemon=True,
        )
        with self._connections_lock:
            refuse = self._closing or len(self._connections) >= self.owner.max_connections
            if not refuse:
                self._connections[thread] = request
        if refuse:
            if not self._closing:
                self.owner.metrics.connections_refused.inc()
                log.debug("too many open connections", extra={"client": client_address[0]})
            self.shutdown_request(request)
            return
        thread.start()

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._connections_lock:
                self._connections.pop(threading.current_thread(), None)

    def finish_request(self, request: Any, client_address: Any) -> None:
        context = self.owner.web_config.ssl_context()
        if context is None:
            request.settimeout(CONNECTION_TIMEOUT_S)
            self.RequestHandlerClass(request, client_address, self)
            return
        tls = self._tls_handshake(request, context, client_address)
        if tls is None:
            return
        try:
            tls.settimeout(CONNECTION_TIMEOUT_S)
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            _close_quietly(tls)

    def _tls_handshake(
        self, raw: socket.socket, context: ssl.SSLContext, client_address: Any
    ) -> ssl.SSLSocket | None:
        raw.settimeout(TLS_HANDSHAKE_TIMEOUT_S)
        try:
            tls = context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError) as exc:
            self.owner.metrics.tls_handshake_errors.inc()
            log.debug(
                "TLS handshake failed", extra={"client": client_address[0], "error": str(exc)}
            )
            return None
        if not self.owner.web_config.client_certificate_allowed(tls.getpeercert()):
            self.owner.metrics.tls_handshake_errors.inc()
            log.debug(
                "client certificate SAN not in client_allowed_sans",
                extra={"client": client_address[0]},
            )
            _close_quietly(tls)
            return None
        with self._connections_lock:
            closing = self._closing
            if not closing:
                self._connections[threading.current_thread()] = tls
        if closing:
            _close_quietly(tls)
            return None
        return tls

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.debug("connection error", extra={"client": client_address[0]}, exc_info=True)

    def close_connections(self) -> None:
        """Close idle keep-alive connections so their threads end, then join them."""
        with self._connections_lock:
            self._closing = True
            connections = dict(self._connections)
        for sock in connections.values():
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        for thread in connections:
            thread.join(_STOP_JOIN_TIMEOUT_S)
            if thread.is_alive():
                log.warning("HTTP connection thread did not stop", extra={"thread": thread.name})


def _close_quietly(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


class _RequestHandler(BaseHTTPRequestHandler):
    """Turns each HTTP/1.1 request into a :class:`Request` for the owning :class:`HTTPServer`."""

    protocol_version = "HTTP/1.1"
    # Headers and body go out in two writes; with Nagle on, the body waits for the client's
    # delayed ACK of the headers (~40 ms per keep-alive request).
    disable_nagle_algorithm = True
    error_content_type = "text/plain; charset=utf-8"
    error_message_format = "%(code)d %(message)s\n"
    server: _ThreadingServer

    def version_string(self) -> str:
        return self.server.owner.component

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Per-request logging happens in :meth:`_handle` at debug level."""

    def log_message(self, format: str, *args: Any) -> None:
        log.debug(format % args, extra={"client": self.client_address[0]})

    def do_GET(self) -> None:
        self._handle()

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = do_GET

    def _handle(self) -> None:
        started = time.perf_counter()
        owner = self.server.owner
        split = urlsplit(self.path)
        body = self._read_body(owner.max_body_bytes)
        if body is None:
            return
        request = Request(
            method=self.command,
            path=split.path,
            query=parse_qs(split.query, keep_blank_values=True),
            headers=self.headers,
            body=body,
        )
        response, label = owner._dispatch(request)
        # Counted before sending, so a client that has the response also sees it counted.
        elapsed = time.perf_counter() - started
        owner.metrics.observe(label, response.status, elapsed)
        if log.isEnabledFor(logging.DEBUG):
            log.debug(
                "request",
                extra={
                    "method": self.command,
                    "path": split.path,
                    "status": response.status,
                    "duration_s": round(elapsed, 6),
                    "client": self.client_address[0],
                },
            )
        self._write(response, owner.web_config.headers)

    def _read_body(self, limit: int) -> bytes | None:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            self.send_error(HTTPStatus.LENGTH_REQUIRED, "send a Content-Length, not chunked")
            return None
        length_header = self.headers.get("Content-Length")
        if not length_header:
            return b""
        try:
            length = int(length_header)
        except ValueError:
            self.send_error(HTTPStatus.BAD_REQUEST, "Content-Length is not a number")
            return None
        if length < 0 or length > limit:
            self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"request body over {limit} bytes")
            return None
        return self.rfile.read(length)

    def _write(self, response: Response, extra_headers: Mapping[str, str]) -> None:
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for name, value in extra_headers.items():
            self.send_header(name, value)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD" and response.body:
            self.wfile.write(response.body)
