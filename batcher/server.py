"""The HTTP face of the runtime: KServe v2 endpoints, health, and /metrics, on aiohttp.

With ``grpc_listen`` set it also runs the gRPC face (:mod:`batcher.grpc_server`) on the same loop
and engine, started and stopped with it.

With ``workers`` (``--workers N``) this process does not accept public connections: it holds the
port and starts front worker processes (:mod:`batcher.worker_pool`) that serve it and hand each
inference over a private channel (:mod:`batcher.engine_channel`) in binary form; this process
answers those calls, and the rest of its routes on a private socket, and merges the workers'
metrics into its ``/metrics``. On shutdown the workers finish what they hold before the engine
drains.

One asyncio loop serves HTTP and runs the engine's dispatch; the model runs on its own thread, so
parsing and answering requests overlap with the device's work. TLS and basic auth come from the
shared web config file (:mod:`autoglm.webconfig`) through the kernel's plumbing, as for every
component: the :mod:`autoglm.web.listener` does the TLS handshake and refuses client
certificates outside ``client_allowed_sans``, the :mod:`autoglm.web.guard` middleware checks
credentials and adds the configured headers. On shutdown the server
reports not-ready at once (so load balancers stop sending), the engine drains what it accepted,
and only then does the listener close. Requests go to the engine of the model their path names,
as the :class:`~batcher.repository.ModelRepository` resolves it (one model with ``--model``,
several with ``--model-repository``, whose load and unload routes are
:mod:`batcher.repository_http`'s).

Every request on the public port is counted in ``autoglm_http_requests_total{path,code}`` and
timed in ``autoglm_http_request_duration_seconds{path}`` (:mod:`autoglm.web.request_metrics`, as
the other components count theirs), ``path`` being the route's template (``/v2/models/{name}``)
or ``other`` for an unknown path, so the label values are bounded. Inference requests that reach
a model are not counted there: ``autoglm_batcher_requests_total{model,outcome}`` counts each of
them already (a batch at a time, docs/batcher-serving.md "Metrics by the batch"), so the infer
routes show up here only with the requests no model answered (401: no credentials, 404: an
unknown model or version). Unknown paths and wrong methods get the protocol's JSON error, as
every other error. With ``--workers`` the workers count the public requests
(``autoglm_batcher_worker_requests_total``) and this process counts none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from aiohttp import web
from aiohttp.web_urldispatcher import AbstractResource
from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from autoglm.config import ConfigError, parse_listen
from autoglm.self_metrics import describe_self
from autoglm.version import package_version
from autoglm.web.binding import bind_socket
from autoglm.web.body import closing_if_unreadable, refusal_status
from autoglm.web.body_timeout import BODY_TIMEOUT, BODY_TIMEOUT_S, BodyTimeout
from autoglm.web.exposition import negotiated_encoder
from autoglm.web.guard import guard
from autoglm.web.listener import ConnectionMetrics, Listener
from autoglm.web.request_metrics import RequestMetrics
from autoglm.web.routes import OTHER_PATH
from autoglm.webconfig import WebConfig
from batcher import oip
from batcher.engine_channel import EngineEnd, Envelope
from batcher.errors import (
    BatcherError,
    DrainTimedOut,
    InvalidRequest,
    Rejected,
    RequestTimedOut,
    ShuttingDown,
    UnknownModel,
)
from batcher.forwarding import SIGNATURE_CHANGED, request_frame_limit, signature_tag
from batcher.grpc_face import GRPC_CODE_HEADER, GRPC_MODEL_HEADER
from batcher.grpc_server import GrpcInferenceServer
from batcher.model import ServedModel
from batcher.private_folder import PrivateFolder
from batcher.repository import LoadedModel, ModelRepository
from batcher.repository_http import RepositoryRoutes
from batcher.request_body import read_body
from batcher.worker_pool import (
    CHANNEL_SOCKET,
    FORWARDED_GRPC,
    HTTP_SOCKET,
    METRICS_FOLDER,
    WorkerPool,
    WorkerSettings,
)

log = logging.getLogger(__name__)


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        status=status, body=json.dumps(data).encode(), content_type="application/json"
    )


def _error(message: str, status: int, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        status=status,
        body=oip.error_body(message),
        content_type="application/json",
        headers=headers,
    )


# Why the engine did not serve a request -> the HTTP status; the first type that matches wins
# (ShuttingDown is a Rejected: 503, send it elsewhere, not 429, come back later).
_HTTP_STATUS: tuple[tuple[type[BatcherError], int], ...] = (
    (InvalidRequest, 400),
    (UnknownModel, 404),
    (ShuttingDown, 503),
    (Rejected, 429),
    (RequestTimedOut, 504),
    (DrainTimedOut, 503),
)


def http_status(error: BatcherError) -> int:
    """The HTTP status of a request the engine did not serve (500: the model failed)."""
    return next((status for kind, status in _HTTP_STATUS if isinstance(error, kind)), 500)


def _unauthorized() -> web.Response:
    return _error("authentication required", 401)


# The statuses of an inference that no model's requests_total counted (the guard's 401, the
# unknown model's 404): the only ones autoglm_http_requests_total counts on the infer routes.
_UNSERVED_INFER = frozenset({401, 404})


def _routing_error(request: web.Request, exc: web.HTTPError) -> web.Response:
    """aiohttp's refusal (no route: 404, wrong method: 405, ...) in the protocol's JSON shape."""
    if exc.status == 404:
        message = f"no route for {request.method} {request.path}; the KServe v2 API is under /v2"
    elif exc.status == 405:
        allowed = ", ".join(sorted(exc.headers.get("Allow", "").split(",")))
        message = f"method {request.method} not allowed on {request.path}; allowed: {allowed}"
    else:
        message = exc.reason.lower()
    kept = {k: v for k, v in exc.headers.items() if k not in ("Content-Type", "Content-Length")}
    return _error(message, exc.status, kept or None)


@dataclass(frozen=True)
class InferAnswer:
    """How the engine answered one inference, whichever way it came in."""

    status: int
    body: bytes
    header_length: int | None = None  # set for a binary answer: its JSON header's length
    retry_after: str | None = None

    def response(self) -> web.Response:
        if self.status != 200:
            headers = {"Retry-After": self.retry_after} if self.retry_after else None
            return web.Response(
                status=self.status, body=self.body, content_type="application/json", headers=headers
            )
        if self.header_length is None:
            return web.Response(body=self.body, content_type="application/json")
        return web.Response(
            body=self.body,
            content_type="application/octet-stream",
            headers={oip.HEADER_LENGTH: str(self.header_length)},
        )


def _refused(message: str, status: int, error: BatcherError | None = None) -> InferAnswer:
    headers = _refusal_headers(error) if error is not None else None
    return InferAnswer(status, oip.error_body(message), None, (headers or {}).get("Retry-After"))


def _refusal_headers(error: BatcherError) -> dict[str, str] | None:
    """``Retry-After`` (whole seconds, at least 1) for a request refused at admission."""
    if not isinstance(error, Rejected) or error.retry_after is None:
        return None
    return {"Retry-After": str(max(1, math.ceil(error.retry_after)))}


class BatcherServer:
    """Serves the models of a :class:`~batcher.repository.ModelRepository`, each through its
    own :class:`~batcher.engine.Batcher`."""

    def __init__(
        self,
        models: ModelRepository,
        registry: CollectorRegistry,
        *,
        listen: str = ":8000",
        web_config: WebConfig | None = None,
        max_body_bytes: int = 16 << 20,
        body_timeout_seconds: float = BODY_TIMEOUT_S,
        grpc_listen: str = "",
        workers: WorkerSettings | None = None,
    ) -> None:
        self.models = models
        self.registry = registry
        describe_self(registry, "batcher")
        self.listen = listen
        self.web_config = web_config or WebConfig()
        if self.web_config.watched:
            registry.register(self.web_config)  # its reload outcomes, on /metrics
        self.max_body_bytes = max_body_bytes
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None
        # With workers, they accept (and count) connections; the engine listens only privately.
        self.workers = (
            WorkerPool(workers, registry) if workers is not None and workers.count else None
        )
        self.connection_metrics = ConnectionMetrics(registry) if self.workers is None else None
        self.body_timeout = BodyTimeout(
            body_timeout_seconds,
            self.connection_metrics.body_timeouts if self.connection_metrics is not None else None,
        )
        # With workers they count the public requests: the engine's are theirs passed on.
        self.http_metrics: RequestMetrics | None = None
        self._route_labels: dict[AbstractResource | None, str] = {}
        self._infer_labels: frozenset[str] = frozenset()
        self._first_worker_socket: socket.socket | None = None
        self._grpc_socket: socket.socket | None = None  # holds the workers' gRPC port
        self._private: PrivateFolder | None = None
        self._channel: asyncio.Server | None = None
        self._channel_calls: set[asyncio.Task[None]] = set()
        self._signature_tags: dict[str, tuple[ServedModel, str]] = {}
        self._version = package_version()
        self.grpc = (
            GrpcInferenceServer(
                models,
                registry,
                listen=grpc_listen,
                web_config=self.web_config,
                max_message_bytes=max_body_bytes,
                version=self._version,
                behind_workers=self.workers is not None,
            )
            if grpc_listen
            else None
        )

    # --- lifecycle -------------------------------------------------------------------------

    def app(self, guarded: bool = True) -> web.Application:
        """The routes; ``guarded``: behind basic auth and the configured headers (all but the
        private socket the front workers pass requests through)."""
        checked = guard(self.web_config, "autoglm-batcher", _unauthorized, oip.HEALTH_PATHS)
        app = web.Application(
            middlewares=[self._observe, checked] if guarded else [self._observe],
            client_max_size=self.max_body_bytes,
        )
        app[BODY_TIMEOUT] = self.body_timeout
        model_paths = ("/v2/models/{name}", "/v2/models/{name}/versions/{version}")
        # aiohttp tries the routes under /v2/models in the order they were added: infer first,
        # so the hot path matches on its first try
        infer_routes = [app.router.add_post(base + "/infer", self._infer) for base in model_paths]
        app.router.add_get("/v2", self._server_metadata)
        app.router.add_get(oip.LIVE_PATH, self._live)
        app.router.add_get(oip.READY_PATH, self._ready)
        app.router.add_get("/metrics", self._metrics)
        for base in model_paths:
            app.router.add_get(base, self._model_metadata)
            app.router.add_get(base + "/ready", self._model_ready)
        RepositoryRoutes(self.models).register(app)
        if not guarded and self.grpc is not None:  # the gRPC calls the workers pass on
            app.router.add_post(FORWARDED_GRPC + "{method}", self._grpc_forwarded)
        if guarded and self.workers is None:
            self._count_requests(app, {route.resource for route in infer_routes})
        return app

    def _count_requests(self, app: web.Application, infer: set[AbstractResource | None]) -> None:
        """Count ``app``'s requests by route template (``other``: no route)."""
        labels: dict[AbstractResource | None, str] = {
            r: r.canonical for r in app.router.resources()
        }
        self._route_labels.update(labels)
        self._infer_labels = frozenset(labels[r] for r in infer)
        if self.http_metrics is None:
            self.http_metrics = RequestMetrics(self.registry, sorted(set(labels.values())))

    @web.middleware
    async def _observe(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        """aiohttp's own refusals in the protocol's JSON shape; each request counted and timed
        (on the public port), but for the inferences a model's requests_total counts."""
        started = time.perf_counter()
        try:
            response = await handler(request)
        except web.HTTPError as exc:  # no route, wrong method: before the guard adds headers
            response = _routing_error(request, exc)
            response.headers.update(self.web_config.headers)
        metrics = self.http_metrics
        if metrics is None:
            return response
        path = self._route_labels.get(request.match_info.route.resource, OTHER_PATH)
        if path in self._infer_labels and response.status not in _UNSERVED_INFER:
            return response
        metrics.observe(path, response.status, time.perf_counter() - started)
        return response

    async def start(self) -> None:
        """Start the engine and listen; raises :class:`ConfigError` if the port is taken."""
        host, port = parse_listen(self.listen)
        sock = bind_socket(host, port, reuse_port=self.workers is not None)
        await self.models.start()
        if self.workers is None:
            self._runner = web.AppRunner(self.app(), access_log=None)
            await self._runner.setup()
            server = self._runner.server
            assert server is not None
            assert self.connection_metrics is not None
            self._listener = Listener(
                server, lambda: len(server.connections), self.web_config, self.connection_metrics
            )
            await self._listener.start(sock)
            self.port = self._listener.port
        else:
            self._first_worker_socket = sock  # the pool closes it when the workers stop
            self.port = sock.getsockname()[1]
            try:
                await self._start_workers(host)
            except ConfigError:
                await self._close_http()
                raise
        if self.grpc is not None and self.workers is None:
            try:
                await self.grpc.start()
            except ConfigError:
                if self.workers is not None:
                    await self.workers.stop(timeout=5.0)
                await self._close_http()
                raise
        log.info(
            "serving",
            extra={
                "listen": self.listen,
                "port": self.port,
                "models": self.models.names,
                "tls": self.web_config.ssl_context() is not None,
                "workers": self.workers.pids if self.workers is not None else [],
            },
        )

    async def _start_workers(self, host: str) -> None:
        """The private folder (mode 0700) with the channel and HTTP sockets (0600), the
        workers' metrics read from there, then the workers themselves."""
        assert self.workers is not None
        self._private = PrivateFolder()
        private = self._private.path
        metrics_dir = private / METRICS_FOLDER
        metrics_dir.mkdir(mode=0o700)
        MultiProcessCollector(self.registry, path=str(metrics_dir))
        self._runner = web.AppRunner(self.app(guarded=False), access_log=None)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(private / HTTP_SOCKET)).start()
        frame_limit = request_frame_limit(self.max_body_bytes)
        self._channel = await asyncio.get_running_loop().create_unix_server(
            lambda: EngineEnd(
                self._channel_call, self._channel_notice, self._channel_calls, frame_limit
            ),
            str(private / CHANNEL_SOCKET),
        )
        for name in (HTTP_SOCKET, CHANNEL_SOCKET):
            os.chmod(private / name, 0o600)
        assert self._first_worker_socket is not None
        grpc_listen = ""
        if self.grpc is not None:
            # Bound, never listening: the port stays the workers' (each binds it with
            # SO_REUSEPORT, so the kernel spreads connections over them) while one is replaced.
            grpc_host, grpc_port = parse_listen(self.grpc.listen)
            try:
                self._grpc_socket = bind_socket(grpc_host, grpc_port, reuse_port=True)
            except ConfigError as exc:
                raise ConfigError(f"--grpc-listen: {exc}") from exc
            self.grpc.port = self._grpc_socket.getsockname()[1]
            grpc_listen = f"[{grpc_host}]:{self.grpc.port}"
        await self.workers.start(host, self._first_worker_socket, private, grpc_listen)
        if self.grpc is not None:
            log.info(
                "serving grpc",
                extra={
                    "listen": self.grpc.listen,
                    "port": self.grpc.port,
                    "tls": self.web_config.tls_material() is not None,
                    "workers": self.workers.count,
                },
            )

    async def shutdown(self, drain_timeout: float) -> bool:
        """Refuse new work, answer everything accepted, then close; True if all finished."""
        log.info("draining", extra={"queued_items": self.models.queued_items})
        workers_finished = True
        if self.workers is not None:  # they finish what they hold; the engine still answers
            workers_finished = await self.workers.stop(drain_timeout)
        finished = await self.models.drain(drain_timeout) and workers_finished
        if self.grpc is not None:
            await self.grpc.stop()
        await self._close_http()
        log.info("stopped", extra={"drained": finished, "batches": self.models.batches})
        return finished

    async def _close_http(self) -> None:
        if self._listener is not None:
            await self._listener.close()
        if self._channel is not None:
            self._channel.close()
        if self._runner is not None:
            await self._runner.cleanup()
        if self._first_worker_socket is not None:
            self._first_worker_socket.close()
        if self._grpc_socket is not None:
            self._grpc_socket.close()
        if self._private is not None:
            self._private.remove()

    # --- handlers --------------------------------------------------------------------------

    def _serving(self, request: web.Request) -> LoadedModel:
        """The model the path names; :class:`UnknownModel` (404) when it is not served."""
        return self.models.serving(
            request.match_info["name"], request.match_info.get("version", "1")
        )

    async def _server_metadata(self, request: web.Request) -> web.Response:
        return _json(oip.server_metadata(self._version))

    async def _live(self, request: web.Request) -> web.Response:
        return _json({"live": True})

    async def _ready(self, request: web.Request) -> web.Response:
        ready = self.models.accepting
        return _json({"ready": ready}, 200 if ready else 503)

    async def _model_ready(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            self._serving(request)
        except UnknownModel as exc:
            if not self.models.knows(name) or request.match_info.get("version", "1") != "1":
                return _error(str(exc), 404)
        ready = self.models.ready(name)  # a model of the repository not loaded: not ready
        return _json({"name": name, "ready": ready}, 200 if ready else 503)

    async def _model_metadata(self, request: web.Request) -> web.Response:
        try:
            model = self._serving(request).model
        except UnknownModel as exc:
            return _error(str(exc), 404)
        return _json(oip.model_metadata(model.name, model.inputs, model.outputs))

    async def _metrics(self, request: web.Request) -> web.Response:
        encoder, content_type = negotiated_encoder(request.headers.get("Accept"))
        return web.Response(body=encoder(self.registry), headers={"Content-Type": content_type})

    async def _infer(self, request: web.Request) -> web.Response:
        try:
            serving = self._serving(request)
        except UnknownModel as exc:
            return _error(str(exc), 404)
        try:
            body = await read_body(request, self.max_body_bytes)
        except oip.ProtocolError as exc:
            serving.batcher.metrics.answered("invalid", serving.batcher.slo_seconds)
            return closing_if_unreadable(_error(str(exc), refusal_status(exc, 400)), exc)
        answer = await self._run_infer(serving, body, request.headers.get(oip.HEADER_LENGTH))
        return answer.response()

    async def _run_infer(
        self, serving: LoadedModel, body: bytes, header_length: str | None
    ) -> InferAnswer:
        """Decode, batch, run and encode one request of ``serving``'s model."""
        model, batcher = serving.model, serving.batcher
        try:
            parsed = oip.parse_infer_request(body, header_length, model.inputs, model.outputs)
        except oip.ProtocolError as exc:
            batcher.metrics.answered("invalid", batcher.slo_seconds)
            return _refused(str(exc), 400)
        try:
            result = await batcher.submit(
                parsed.inputs,
                size=parsed.size,
                priority=parsed.priority,
                timeout=parsed.timeout_seconds,
            )
        except BatcherError as exc:
            return _refused(str(exc), http_status(exc), exc)
        try:
            encoded, encoded_header_length = oip.encode_infer_response(model.name, parsed, result)
        except oip.ProtocolError as exc:
            log.error("model output cannot be encoded", extra={"error": str(exc)})
            return _refused(str(exc), 500)
        return InferAnswer(200, encoded, encoded_header_length)

    # --- the front workers' channel ------------------------------------------------------------

    async def _channel_call(self, envelope: Envelope, payload: bytes) -> tuple[Envelope, bytes]:
        """One inference a worker decoded and sent in binary form (:mod:`batcher.forwarding`),
        or (``check``) whether the signature it decoded a refused request with is still the
        model's."""
        try:
            serving = self.models.serving(envelope["model"], envelope["version"])
        except UnknownModel as exc:
            answer = _refused(str(exc), 404)
        else:
            if envelope["signature"] != self._signature_tag(serving.model):
                answer = _refused(
                    "the model's signature changed; check the request again", SIGNATURE_CHANGED
                )
            elif envelope.get("check"):  # only: is this still the model's signature?
                answer = InferAnswer(200, b"")
            else:
                answer = await self._run_infer(serving, payload, str(envelope["header_length"]))
        head = {
            "status": answer.status,
            "header_length": answer.header_length,
            "retry_after": answer.retry_after,
        }
        return head, answer.body

    async def _grpc_forwarded(self, request: web.Request) -> web.Response:
        """A gRPC call other than ModelInfer that a worker admitted and passes on as it came
        (the serialized request); answered as the engine's own gRPC face answers it, the code,
        message and model label in headers, the serialized response in the body."""
        assert self.grpc is not None
        answer = await self.grpc.forwarded(request.match_info["method"], await request.read())
        return web.Response(
            body=answer.response or answer.message.encode(),
            headers={
                GRPC_CODE_HEADER: answer.code.name,
                GRPC_MODEL_HEADER: quote(answer.model, safe=""),
            },
        )

    def _channel_notice(self, envelope: Envelope) -> None:
        """A worker refused a request as invalid: counted as if the engine had."""
        try:
            batcher = self.models.serving(envelope["invalid"], "1").batcher
        except UnknownModel:
            return
        batcher.metrics.answered("invalid", batcher.slo_seconds)

    def _signature_tag(self, model: ServedModel) -> str:
        """The tag of ``model``'s metadata, as the workers compute it from ``GET`` (kept per
        model object, so a reloaded model gets its own)."""
        known = self._signature_tags.get(model.name)
        if known is not None and known[0] is model:
            return known[1]
        tag = signature_tag(oip.model_metadata(model.name, model.inputs, model.outputs))
        self._signature_tags[model.name] = (model, tag)
        return tag
