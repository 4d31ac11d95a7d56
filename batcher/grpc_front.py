"""The gRPC face of a front worker (``--workers N`` with ``--grpc-listen``).

Every worker serves ``inference.GRPCInferenceService`` on the gRPC port (``SO_REUSEPORT``), so
grpc.aio's cost per call (about as much as a whole REST request in the engine, see
docs/batcher-serving.md) runs on the workers' cores, not on the engine's loop. A ``ModelInfer``
is admitted (TLS client names, basic auth), decoded and checked here with the codec the engine's
own gRPC face uses (:mod:`batcher.grpc_face`), and sent over the worker's channel to the engine in
binary form, like a REST request the worker decoded (:mod:`batcher.forwarding`); the engine's
binary answer becomes ``raw_output_contents`` without a copy into arrays. Refusals carry the
codes and words of the engine's gRPC face (its HTTP status mapped by
:func:`~batcher.grpc_face.code_for_status`). Every other RPC is passed to the engine as it came
(``POST /grpc/METHOD`` on its private HTTP socket) and answered by the engine's own face, so
readiness, metadata, configs and the repository have one truth. The calls are counted here, in
the series the engine's face would count them in (multiprocess mode).
"""

from __future__ import annotations

import logging
from typing import Any, Protocol
from urllib.parse import unquote

import aiohttp
import grpc
import orjson

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
)
from batcher.grpc_face import (
    FORWARDED_METHODS,
    GRPC_CODE_HEADER,
    GRPC_MODEL_HEADER,
    GrpcFace,
    code_for_status,
    decode_infer_request,
    message_type,
)
from batcher.open_inference import predict_v2_pb2 as pb
from batcher.open_inference import predict_v2_pb2_grpc as pb_grpc
from batcher.worker_pool import FORWARDED_GRPC

log = logging.getLogger(__name__)
UNAVAILABLE = grpc.StatusCode.UNAVAILABLE


def _message(body: bytes) -> str:
    """The words of an engine refusal (``{"error": ...}``), or the body as text."""
    try:
        return str(orjson.loads(body)["error"])
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body.decode(errors="replace")


def _engine_gone(exc: Exception) -> str:
    return f"the engine is not answering ({exc}); try again"


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):
    """ModelInfer decoded here; the other RPCs the engine implements, passed on."""

    def __init__(self, owner: GrpcFront) -> None:
        self.owner = owner
        for method in FORWARDED_METHODS:
            setattr(self, method, self._forwarder(method))

    def _forwarder(self, method: str) -> Any:
        async def forward(request: Any, context: grpc.aio.ServicerContext) -> Any:
            return await self.owner.forward(method, request, context)

        return forward

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        return await self.owner.infer(request, context)


class FrontServer(Protocol):
    """What the gRPC face needs of its worker (:class:`batcher.front_worker.FrontServer`, which
    imports this module): its settings and counter, the engine's channel and private socket, and
    the signatures it knows."""

    worker: str
    web_config: WebConfig
    max_body_bytes: int
    requests: Any  # a prometheus Counter labelled (worker, handler, outcome)

    @property
    def engine(self) -> WorkerEnd: ...

    @property
    def session(self) -> aiohttp.ClientSession: ...

    async def signature(
        self, name: str, version: str | None
    ) -> Signature | tuple[int, bytes, dict[str, str]]: ...

    def forget_signature(self, key: tuple[str, str]) -> None: ...


class GrpcFront(GrpcFace):
    """One worker's gRPC server, talking to the engine through ``front``'s channel and socket."""

    def __init__(self, front: FrontServer, registry: Any, *, listen: str) -> None:
        super().__init__(
            registry,
            listen=listen,
            web_config=front.web_config,
            max_message_bytes=front.max_body_bytes,
            reuse_port=True,
        )
        self.front = front
        self._server_model = ""  # the label of server-wide calls, as the engine last gave it

    def add_servicer(self, server: grpc.aio.Server) -> None:
        self.serve_rpcs(_Servicer(self), server)

    def default_model(self) -> str:
        return self._server_model

    def count(self, method: str, code: grpc.StatusCode, model: str | None = None) -> None:
        """In the engine's gRPC series, and in this worker's requests (handler "grpc")."""
        super().count(method, code, model)
        self.front.requests.labels(self.front.worker, "grpc", code.name).inc()

    async def start(self) -> None:
        """Learn the label of server-wide calls (a call refused here before any reached the
        engine counts under it, as on the engine's face), then listen."""
        try:
            await self._ask_engine("ServerLive", pb.ServerLiveRequest())
        except (aiohttp.ClientError, OSError, KeyError) as exc:
            log.warning("the engine did not answer a first gRPC call", extra={"error": str(exc)})
        await super().start()

    async def _ask_engine(self, method: str, request: Any) -> tuple[grpc.StatusCode, bytes, str]:
        """The engine's face's answer to ``request``: code, body, model label."""
        async with self.front.session.post(
            f"http://engine{FORWARDED_GRPC}{method}", data=request.SerializeToString()
        ) as answer:
            body = await answer.read()
            code = grpc.StatusCode[answer.headers[GRPC_CODE_HEADER]]
            model = unquote(answer.headers[GRPC_MODEL_HEADER])
        if not (getattr(request, "name", "") or getattr(request, "model_name", "")):
            self._server_model = model
        return code, body, model

    async def forward(self, method: str, request: Any, context: grpc.aio.ServicerContext) -> Any:
        """Pass ``request`` to the engine's gRPC face and answer as it did."""
        await self.admit(context, method)
        try:
            code, body, model = await self._ask_engine(method, request)
        except (aiohttp.ClientError, OSError, KeyError) as exc:
            await self.fail(context, method, grpc.StatusCode.UNAVAILABLE, _engine_gone(exc))
        if code != grpc.StatusCode.OK:
            await self.fail(context, method, code, body.decode(errors="replace"), model)
        return self.answered(method, message_type(method, "output").FromString(body), model)

    async def infer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        """Decode against the signature this worker knows, forward, answer with raw contents;
        asked again once when the engine says the model's signature changed (as on REST)."""
        method = "ModelInfer"
        await self.admit(context, method)
        front, engine = self.front, self.front.engine
        name, version = request.model_name, request.model_version or None
        key = (name, version or "1")
        for last_try in (False, True):
            try:
                signature = await front.signature(name, version)
            except (aiohttp.ClientError, OSError) as exc:
                await self.fail(
                    context, method, grpc.StatusCode.UNAVAILABLE, _engine_gone(exc), name
                )
            if not isinstance(signature, Signature):
                status, body, _ = signature  # the engine's refusal: unknown model or version
                await self.fail(context, method, code_for_status(status), _message(body), name)
            try:
                parsed = decode_infer_request(request, signature.inputs, signature.outputs)
            except oip.ProtocolError as exc:
                try:
                    stale = await outdated(engine, key, signature)
                except ChannelError as gone:
                    await self.fail(context, method, UNAVAILABLE, _engine_gone(gone), name)
                if stale and not last_try:
                    front.forget_signature(key)
                    continue
                engine.notify({"invalid": name})
                await self.fail(context, method, grpc.StatusCode.INVALID_ARGUMENT, str(exc), name)
            try:
                answer, payload = await forward(
                    engine, name, version, signature, engine_request(parsed, signature)
                )
            except ChannelError as exc:
                await self.fail(
                    context, method, grpc.StatusCode.UNAVAILABLE, _engine_gone(exc), name
                )
            status = answer["status"]
            if status == SIGNATURE_CHANGED and not last_try:
                front.forget_signature(key)
                continue
            if status != 200:
                if answer.get("retry_after"):
                    context.set_trailing_metadata((("retry-after", answer["retry_after"]),))
                await self.fail(context, method, code_for_status(status), _message(payload), name)
            response = self._response(signature.name, parsed, payload, answer["header_length"])
            return self.answered(method, response, signature.name)
        raise AssertionError("unreachable: the last try returns")

    @staticmethod
    def _response(
        model_name: str, request: oip.InferRequest, body: bytes, header_length: int
    ) -> pb.ModelInferResponse:
        """The engine's binary answer (every output asked for as binary, in the request's order)
        as the engine's gRPC face encodes it: the same raw bytes, sliced, not decoded."""
        header = orjson.loads(body[:header_length])
        response = pb.ModelInferResponse(
            model_name=model_name, model_version="1", id=request.id or ""
        )
        offset = header_length
        for tensor in header["outputs"]:
            size = tensor["parameters"]["binary_data_size"]
            response.outputs.add(
                name=tensor["name"], datatype=tensor["datatype"], shape=tensor["shape"]
            )
            response.raw_output_contents.append(body[offset : offset + size])
            offset += size
        return response
