"""A front worker process of ``--workers N``: HTTP, TLS, auth and the JSON codec, off the engine.

The engine process (:mod:`batcher.server`) starts these through :mod:`batcher.worker_pool`; each
gets a listening socket of its own on the public port (``SO_REUSEPORT``) and serves it as a
one-process server would, with the
shared web config (TLS through the :mod:`autoglm.web.listener`, basic auth and headers through the
:mod:`autoglm.web.guard`). An inference request is decoded here, checked against the model's
signature, and sent to the engine over the private channel in binary form
(:mod:`batcher.forwarding`), so the engine's loop never parses a JSON number and batches form
across the requests of every worker; the answer is encoded here in the form the client asked for.
Every other request (health, metadata, the repository API, ``/metrics``) is passed to the engine
over its private HTTP socket, so there is one truth for readiness, models and metrics.

Not meant to be started by hand: the engine gives it its arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import orjson
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from autoglm.logs import setup_logging
from autoglm.web.body import UnreadableBody, closing_if_unreadable, read_whole, refusal_status
from autoglm.web.body_timeout import BODY_TIMEOUT, BodyTimeout
from autoglm.web.guard import guard
from autoglm.web.listener import ConnectionMetrics, Listener
from autoglm.webconfig import WebConfig
from batcher import oip
from batcher.engine_channel import WorkerEnd
from batcher.forwarding import (
    SIGNATURE_CHANGED,
    ChannelError,
    Signature,
    engine_request,
    forward,
    outdated,
    read_binary_answer,
    sent_in_binary,
)
from batcher.request_body import read_body
from batcher.worker_pool import CHANNEL_SOCKET, FORWARDED_GRPC, HTTP_SOCKET, READY_LINE

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler

    from batcher.grpc_front import GrpcFront

log = logging.getLogger("batcher.front_worker")  # not __main__: it runs with -m

_PASSED_REQUEST_HEADERS = ("Accept", "Content-Type", oip.HEADER_LENGTH)
_PASSED_ANSWER_HEADERS = ("Content-Type", "Retry-After", oip.HEADER_LENGTH)


def _error(message: str, status: int) -> web.Response:
    return web.Response(
        status=status, body=oip.error_body(message), content_type="application/json"
    )


async def _no_route(request: web.Request) -> web.Response:
    """What the engine answers a path it does not serve, for the paths only workers may use."""
    return _error(
        f"no route for {request.method} {request.path}; the KServe v2 API is under /v2", 404
    )


def _unauthorized() -> web.Response:
    return _error("authentication required", 401)


class FrontServer:
    """The HTTP face of one worker, talking to the engine through ``channel_dir``'s sockets."""

    def __init__(
        self,
        worker: int,
        channel_dir: Path,
        web_config: WebConfig,
        *,
        max_body_bytes: int,
        body_timeout_seconds: float,
        drain_timeout_seconds: float,
        registry: CollectorRegistry,
    ) -> None:
        self.worker = str(worker)
        self.channel_dir = channel_dir
        self.web_config = web_config
        self.max_body_bytes = max_body_bytes
        self.drain_timeout_seconds = drain_timeout_seconds
        self.connection_metrics = ConnectionMetrics(registry)
        self.body_timeout = BodyTimeout(body_timeout_seconds, self.connection_metrics.body_timeouts)
        self.requests = Counter(
            "autoglm_batcher_worker_requests",
            "Requests answered by each front worker (--workers), by handler (infer: decoded "
            "here and batched by the engine; engine: passed to the engine as they came; grpc: a "
            "gRPC call, its code a status name) and code.",
            ["worker", "handler", "code"],
            registry=registry,
        )
        self._signatures: dict[tuple[str, str], Signature] = {}
        self._engine: WorkerEnd | None = None
        self._session: aiohttp.ClientSession | None = None
        self._runner: web.AppRunner | None = None
        self._listener: Listener | None = None

    @property
    def engine_gone(self) -> asyncio.Future[None]:
        """Done when the engine's channel closes (the engine exited)."""
        assert self._engine is not None
        return self._engine.closed

    def app(self) -> web.Application:
        checked = guard(self.web_config, "autoglm-batcher", _unauthorized, oip.HEALTH_PATHS)
        app = web.Application(
            middlewares=[self._count, checked],
            client_max_size=self.max_body_bytes,
        )
        app[BODY_TIMEOUT] = self.body_timeout
        for base in ("/v2/models/{name}", "/v2/models/{name}/versions/{version}"):
            app.router.add_post(base + "/infer", self._infer)
        # The engine's socket also answers the gRPC calls the workers pass on: not public.
        app.router.add_route("*", FORWARDED_GRPC + "{method:.*}", _no_route)
        app.router.add_route("*", "/{path:.*}", self._pass_to_engine)
        return app

    async def start(self, sock: socket.socket) -> None:
        """Connect to the engine, then accept on ``sock`` (listening, the engine's)."""
        self._engine = await WorkerEnd.connect(str(self.channel_dir / CHANNEL_SOCKET))
        self._session = aiohttp.ClientSession(
            connector=aiohttp.UnixConnector(path=str(self.channel_dir / HTTP_SOCKET)),
            auto_decompress=False,
        )
        self._runner = web.AppRunner(
            self.app(), access_log=None, shutdown_timeout=self.drain_timeout_seconds
        )
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        self._listener = Listener(
            server, lambda: len(server.connections), self.web_config, self.connection_metrics
        )
        await self._listener.start(sock)

    async def stop_accepting(self) -> None:
        """Stop accepting connections and finish the requests in progress (each answered)."""
        if self._listener is not None:
            await self._listener.close()
            self._listener = None
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def stop(self) -> None:
        """Stop accepting, finish the requests in progress (each answered), then disconnect."""
        await self.stop_accepting()
        if self._session is not None:
            await self._session.close()
        if self._engine is not None:
            self._engine.close()

    @web.middleware
    async def _count(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await handler(request)
        kind = "infer" if request.match_info.route.handler == self._infer else "engine"
        self.requests.labels(self.worker, kind, str(response.status)).inc()
        return response

    # --- inference ---------------------------------------------------------------------------

    async def _infer(self, request: web.Request) -> web.StreamResponse:
        """Decode against the signature this worker knows, forward, encode the answer. When the
        engine says that signature is no longer the model's (a reload this worker has not seen),
        on the call or, for a request that does not fit it, on a check, ask for the model's
        signature again and decode once more."""
        name = request.match_info["name"]
        version = request.match_info.get("version")
        key = (name, version or "1")
        engine = self._engine
        assert engine is not None
        body: bytes | None = None
        for last_try in (False, True):
            signature = await self._signature(name, version, request)
            if isinstance(signature, web.Response):
                return signature  # the engine's own answer: unknown model or version
            try:
                if body is None:
                    body = await read_body(request, self.max_body_bytes)
                parsed = oip.parse_infer_request(
                    body,
                    request.headers.get(oip.HEADER_LENGTH),
                    signature.inputs,
                    signature.outputs,
                )
            except oip.ProtocolError as exc:
                try:
                    stale = body is not None and await outdated(engine, key, signature)
                except ChannelError as gone:
                    return _error(f"the engine is not answering ({gone}); try again", 503)
                if stale and not last_try:
                    self._signatures.pop(key, None)
                    continue
                engine.notify({"invalid": name})
                return closing_if_unreadable(_error(str(exc), refusal_status(exc, 400)), exc)
            header_length = request.headers.get(oip.HEADER_LENGTH)
            as_sent = sent_in_binary(body, header_length, parsed)
            forwarded = (
                (body, int(header_length))
                if as_sent and header_length is not None
                else engine_request(parsed, signature)
            )
            try:
                answer, payload = await forward(engine, name, version, signature, forwarded)
            except ChannelError as exc:
                return _error(f"the engine is not answering ({exc}); try again", 503)
            if answer["status"] == SIGNATURE_CHANGED and not last_try:
                self._signatures.pop(key, None)
                continue
            return self._answer(signature, parsed, answer, payload, as_sent)
        raise AssertionError("unreachable: the last try returns")

    @property
    def engine(self) -> WorkerEnd:
        """The channel to the engine (connected by :meth:`start`)."""
        assert self._engine is not None
        return self._engine

    @property
    def session(self) -> aiohttp.ClientSession:
        """The engine's private HTTP socket (connected by :meth:`start`)."""
        assert self._session is not None
        return self._session

    @staticmethod
    def _answer(
        signature: Signature,
        parsed: oip.InferRequest,
        answer: dict,
        payload: bytes,
        as_sent: bool,
    ) -> web.Response:
        status = answer["status"]
        if status != 200:
            headers = {"Retry-After": answer["retry_after"]} if answer.get("retry_after") else None
            return web.Response(
                status=status, body=payload, content_type="application/json", headers=headers
            )
        if as_sent:  # the client asked for what the engine answered: binary, every output
            return web.Response(
                body=payload,
                content_type="application/octet-stream",
                headers={oip.HEADER_LENGTH: str(answer["header_length"])},
            )
        outputs = read_binary_answer(payload, answer["header_length"])
        try:
            body, header_length = oip.encode_infer_response(signature.name, parsed, outputs)
        except oip.ProtocolError as exc:
            log.error("model output cannot be encoded", extra={"error": str(exc)})
            return _error(str(exc), 500)
        if header_length is None:
            return web.Response(body=body, content_type="application/json")
        return web.Response(
            body=body,
            content_type="application/octet-stream",
            headers={oip.HEADER_LENGTH: str(header_length)},
        )

    async def _signature(
        self, name: str, version: str | None, request: web.Request
    ) -> Signature | web.Response:
        """The model's signature as the engine serves it, asked once and kept; the engine's
        answer itself when it has no such model or version."""
        try:
            signature = await self.signature(name, version)
        except (aiohttp.ClientError, OSError) as exc:
            return _error(f"the engine is not answering ({exc}); try again", 503)
        if isinstance(signature, Signature):
            return signature
        status, body, headers = signature
        return web.Response(status=status, body=body, headers=headers)

    async def signature(
        self, name: str, version: str | None
    ) -> Signature | tuple[int, bytes, dict[str, str]]:
        """The model's signature as the engine serves it, asked once and kept (forgotten with
        :meth:`forget_signature`); the engine's answer (status, body, headers) when it has no
        such model or version. ``aiohttp.ClientError`` or ``OSError``: the engine is gone."""
        key = (name, version or "1")
        known = self._signatures.get(key)
        if known is not None:
            return known
        path = f"/v2/models/{name}" + (f"/versions/{version}" if version else "")
        status, body, headers = await self._engine_http("GET", path, b"", {})
        if status != 200:
            return status, body, headers
        signature = Signature.from_metadata(orjson.loads(body))
        self._signatures[key] = signature
        return signature

    def forget_signature(self, key: tuple[str, str]) -> None:
        self._signatures.pop(key, None)

    # --- everything else ---------------------------------------------------------------------

    async def _pass_to_engine(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await read_whole(request)
        except UnreadableBody as exc:
            return closing_if_unreadable(_error(str(exc), exc.status), exc)
        headers = {k: request.headers[k] for k in _PASSED_REQUEST_HEADERS if k in request.headers}
        try:
            status, answer, answer_headers = await self._engine_http(
                request.method, request.path_qs, body, headers
            )
        except (aiohttp.ClientError, OSError) as exc:
            return _error(f"the engine is not answering ({exc}); try again", 503)
        return web.Response(status=status, body=answer, headers=answer_headers)

    async def _engine_http(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[int, bytes, dict[str, str]]:
        assert self._session is not None
        async with self._session.request(
            method, "http://engine" + path, data=body, headers=headers
        ) as answer:
            payload = await answer.read()
            kept = {k: answer.headers[k] for k in _PASSED_ANSWER_HEADERS if k in answer.headers}
            return answer.status, payload, kept


def _arguments(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="batcher.front_worker", description=__doc__)
    parser.add_argument("--worker", type=int, required=True)
    parser.add_argument("--socket-fd", type=int, required=True)
    parser.add_argument("--channel-dir", type=Path, required=True)
    parser.add_argument("--web-config-file", default="")
    parser.add_argument("--max-body-bytes", type=int, required=True)
    parser.add_argument("--body-timeout-seconds", type=float, required=True)
    parser.add_argument("--drain-timeout-seconds", type=float, required=True)
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--log-format", default="json")
    parser.add_argument("--grpc-listen", default="")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    parent = os.getppid()  # the engine; recorded before anything slow
    args = _arguments(argv)
    setup_logging("batcher", args.log_level, args.log_format, worker=args.worker)
    web_config = WebConfig.load(args.web_config_file or None)
    return asyncio.run(_serve(args, web_config, parent))


async def _serve(args: argparse.Namespace, web_config: WebConfig, parent: int) -> int:
    from autoglm.gc_pauses import freeze_startup_heap
    from batcher.cli import stop_when_orphaned

    registry = CollectorRegistry()  # multiprocess mode: the engine's /metrics reads the files
    server = FrontServer(
        args.worker,
        args.channel_dir,
        web_config,
        max_body_bytes=args.max_body_bytes,
        body_timeout_seconds=args.body_timeout_seconds,
        drain_timeout_seconds=args.drain_timeout_seconds,
        registry=registry,
    )
    grpc_front: GrpcFront | None = None
    if args.grpc_listen:  # grpc is imported only by the workers that serve it
        from batcher.grpc_front import GrpcFront

        grpc_front = GrpcFront(server, registry, listen=args.grpc_listen)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):  # before "ready": the engine may stop it at once
        loop.add_signal_handler(sig, stop.set)
    await server.start(socket.socket(fileno=args.socket_fd))
    if grpc_front is not None:
        await grpc_front.start()
    freeze_startup_heap()  # a full collection would hold every request in flight here
    sys.stdout.buffer.write(READY_LINE)
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # nothing else may fill the engine's pipe
    server.engine_gone.add_done_callback(lambda _: stop.set())
    orphaned = loop.create_task(stop_when_orphaned(stop, parent))
    await stop.wait()
    orphaned.cancel()
    log.info("front worker draining")
    # gRPC and HTTP stop accepting together and finish their calls; the channel closes after
    stopping = [server.stop_accepting()]
    if grpc_front is not None:
        stopping.append(grpc_front.stop(args.drain_timeout_seconds))
    await asyncio.gather(*stopping)
    await server.stop()
    log.info("front worker stopped")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
