"""The gRPC face of the runtime: the Open Inference Protocol's ``inference.GRPCInferenceService``.

It serves the same models through the same engines as the HTTP face (each call resolves its model
in the :class:`~batcher.repository.ModelRepository`), on the same asyncio loop (``grpc.aio``), so
a gRPC request goes straight to its model's queue and is batched together with HTTP requests: one
admission, one best-effort class, one set of metrics. The model repository extension
(``RepositoryIndex``, ``RepositoryModelLoad``, ``RepositoryModelUnload``) answers as the HTTP
routes of :mod:`batcher.repository_http` do, with NOT_FOUND, INVALID_ARGUMENT,
FAILED_PRECONDITION, RESOURCE_EXHAUSTED (would not fit) or INTERNAL for a refusal.
``tritonclient.grpc`` works against it unchanged, which is why the service also answers Triton's
``ModelConfig`` and reads the priority as Triton sends it (``uint64_param``).

Tensors travel as ``raw_input_contents``/``raw_output_contents`` (the same little-endian layout
as the HTTP binary extension, decoded by :mod:`batcher.oip`, with no per-element Python objects)
or, for requests, as typed ``contents``. Answers always use raw contents, as Triton's do.
Failures are gRPC status codes carrying the same message the HTTP face would send:
INVALID_ARGUMENT for a malformed request, NOT_FOUND for another model, RESOURCE_EXHAUSTED for a
refusal at admission (with ``retry-after`` seconds in the trailing metadata, as HTTP's
``Retry-After``), UNAVAILABLE while draining, DEADLINE_EXCEEDED for a request not started in its
time. TLS and basic auth come from the shared web config: the server certificate, key and client
CA are served with dynamic credentials, so a renewed certificate is picked up as on HTTP.

The codec, TLS, auth and counting live in :mod:`batcher.grpc_face`, shared with the front
workers' gRPC face (:mod:`batcher.grpc_front`). With ``--workers N`` the workers serve the port
and this face only answers the RPCs they pass on (:meth:`GrpcInferenceServer.forwarded`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry

from autoglm.webconfig import WebConfig
from batcher import oip
from batcher.errors import (
    BatcherError,
    DrainTimedOut,
    InvalidRequest,
    LoadFailed,
    LoadRefused,
    ModelConfigInvalid,
    NotInRepository,
    Rejected,
    RepositoryBusy,
    RepositoryError,
    RequestTimedOut,
    ShuttingDown,
    UnknownModel,
)
from batcher.grpc_face import (
    FORWARDED_METHODS,
    ForwardedAnswer,
    GrpcFace,
    decode_infer_request,
    encode_infer_response,
    message_type,
    parameter_value,
)
from batcher.model import ServedModel
from batcher.open_inference import predict_v2_pb2 as pb
from batcher.open_inference import predict_v2_pb2_grpc as pb_grpc
from batcher.repository import LoadedModel, ModelRepository

log = logging.getLogger(__name__)
__all__ = [
    "GrpcInferenceServer",
    "code_for",
    "decode_infer_request",  # the codec lives in batcher.grpc_face, shared with the workers
    "encode_infer_response",
    "model_config",
    "parameter_value",
]

# Why the engine did not serve a request -> the gRPC code a client of the protocol expects; the
# first type that matches wins (ShuttingDown is a Rejected).
_CODES: tuple[tuple[type[BatcherError], grpc.StatusCode], ...] = (
    (InvalidRequest, grpc.StatusCode.INVALID_ARGUMENT),
    (UnknownModel, grpc.StatusCode.NOT_FOUND),
    (ShuttingDown, grpc.StatusCode.UNAVAILABLE),
    (Rejected, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (RequestTimedOut, grpc.StatusCode.DEADLINE_EXCEEDED),
    (DrainTimedOut, grpc.StatusCode.UNAVAILABLE),
)
# A repository refusal -> its gRPC code (the first type that matches; FAILED_PRECONDITION else).
_REPOSITORY_CODES: tuple[tuple[type[RepositoryError], grpc.StatusCode], ...] = (
    (NotInRepository, grpc.StatusCode.NOT_FOUND),
    (ModelConfigInvalid, grpc.StatusCode.INVALID_ARGUMENT),
    (RepositoryBusy, grpc.StatusCode.FAILED_PRECONDITION),
    (LoadRefused, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (LoadFailed, grpc.StatusCode.INTERNAL),
)
_CONFIG_TYPES = {name: f"TYPE_{name}" for name in oip.DATATYPES} | {"BYTES": "TYPE_STRING"}


def code_for(error: BatcherError) -> grpc.StatusCode:
    """The gRPC status code of a request the engine did not serve."""
    return next(
        (code for kind, code in _CODES if isinstance(error, kind)), grpc.StatusCode.INTERNAL
    )


def model_config(model: ServedModel, max_batch_size: int) -> pb.ModelConfig:
    """Triton's ``ModelConfig`` for the served model (dims without the batch dimension)."""
    return pb.ModelConfig(
        name=model.name,
        platform="pytorch",
        backend="autoglm-batcher",
        max_batch_size=max_batch_size,
        input=[
            pb.ModelInput(name=s.name, data_type=_CONFIG_TYPES[s.datatype], dims=s.shape)
            for s in model.inputs
        ],
        output=[
            pb.ModelOutput(name=s.name, data_type=_CONFIG_TYPES[s.datatype], dims=s.shape)
            for s in model.outputs
        ],
    )


class _Aborted(Exception):
    """A forwarded call ended with a code other than OK."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class _ForwardedContext:
    """What the RPCs use of a ``grpc.aio`` context, for a call a front worker forwarded."""

    async def abort(self, code: grpc.StatusCode, message: str) -> None:
        raise _Aborted(code, message)

    def set_trailing_metadata(self, metadata: Any) -> None:
        pass  # only ModelInfer sets it, and it takes the channel


class _Servicer(pb_grpc.GRPCInferenceServiceServicer):
    """The RPCs; everything they need comes from the :class:`GrpcInferenceServer`."""

    def __init__(self, owner: GrpcInferenceServer) -> None:
        self.owner = owner

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        await self.owner.admit(context, "ServerLive")
        return self.owner.answered("ServerLive", pb.ServerLiveResponse(live=True))

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        await self.owner.admit(context, "ServerReady")
        ready = pb.ServerReadyResponse(ready=self.owner.models.accepting)
        return self.owner.answered("ServerReady", ready)

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        await self.owner.admit(context, "ModelReady")
        if self.owner.models.knows(request.name) and request.version in ("", "1"):
            ready = self.owner.models.ready(request.name)  # not loaded: not ready, as in Triton
            response = pb.ModelReadyResponse(ready=ready)
            return self.owner.answered("ModelReady", response, request.name)
        await self.owner.serving(context, "ModelReady", request.name, request.version)
        raise AssertionError("serving() answers NOT_FOUND for a model it does not know")

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        await self.owner.admit(context, "ServerMetadata")
        metadata = pb.ServerMetadataResponse(**oip.server_metadata(self.owner.version))
        return self.owner.answered("ServerMetadata", metadata)

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        await self.owner.admit(context, "ModelMetadata")
        serving = await self.owner.serving(context, "ModelMetadata", request.name, request.version)
        model = serving.model
        metadata = pb.ModelMetadataResponse(
            **oip.model_metadata(model.name, model.inputs, model.outputs)
        )
        return self.owner.answered("ModelMetadata", metadata, model.name)

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        await self.owner.admit(context, "ModelConfig")
        serving = await self.owner.serving(context, "ModelConfig", request.name, request.version)
        config = model_config(serving.model, serving.batcher.max_batch_size)
        return self.owner.answered(
            "ModelConfig", pb.ModelConfigResponse(config=config), serving.model.name
        )

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        return await self.owner.infer(request, context)

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        await self.owner.admit(context, "RepositoryIndex")
        response = pb.RepositoryIndexResponse()
        for entry in self.owner.models.index(ready_only=request.ready):
            response.models.add(
                name=entry.name, version=entry.version, state=entry.state, reason=entry.reason
            )
        return self.owner.answered("RepositoryIndex", response)

    async def RepositoryModelLoad(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelLoadResponse:
        method = "RepositoryModelLoad"
        await self.owner.admit(context, method)
        overrides = sorted(k for k in request.parameters if k == "config" or k.startswith("file:"))
        if overrides:
            await self.owner.fail(
                context,
                method,
                grpc.StatusCode.INVALID_ARGUMENT,
                f"load parameter {overrides[0]!r} is not supported: models are loaded from the "
                "repository folder; put the model's files and config.yaml there",
            )
        await self.owner.repository_call(context, method, self.owner.models.load, request)
        return self.owner.answered(method, pb.RepositoryModelLoadResponse(), request.model_name)

    async def RepositoryModelUnload(
        self, request: Any, context: Any
    ) -> pb.RepositoryModelUnloadResponse:
        method = "RepositoryModelUnload"
        await self.owner.admit(context, method)
        await self.owner.repository_call(context, method, self.owner.models.unload, request)
        return self.owner.answered(method, pb.RepositoryModelUnloadResponse(), request.model_name)


class GrpcInferenceServer(GrpcFace):
    """Serves a :class:`~batcher.repository.ModelRepository`'s models over gRPC, on the
    running loop.

    ``behind_workers``: the front workers of ``--workers`` serve the port, admit the callers and
    count the calls; this process answers what they forward (:meth:`forwarded`) and does not
    listen itself.
    """

    def __init__(
        self,
        models: ModelRepository,
        registry: CollectorRegistry,
        *,
        listen: str,
        web_config: WebConfig | None = None,
        max_message_bytes: int = 16 << 20,
        version: str = "0.0.0",
        behind_workers: bool = False,
    ) -> None:
        super().__init__(
            None if behind_workers else registry,
            listen=listen,
            web_config=web_config,
            max_message_bytes=max_message_bytes,
        )
        self.models = models
        self.version = version
        self.behind_workers = behind_workers
        self._servicer = _Servicer(self)

    def add_servicer(self, server: grpc.aio.Server) -> None:
        self.serve_rpcs(self._servicer, server)

    def default_model(self) -> str:
        names = self.models.names
        return names[0] if len(names) == 1 else ""

    async def admit(self, context: grpc.aio.ServicerContext, method: str) -> None:
        if not self.behind_workers:  # else the worker the call came to admitted it
            await super().admit(context, method)

    async def forwarded(self, method: str, data: bytes) -> ForwardedAnswer:
        """Answer a call a front worker forwards (``method``, the serialized request) as this
        face answers it; :data:`FORWARDED_METHODS` only (ModelInfer takes the channel)."""
        if method not in FORWARDED_METHODS:
            return ForwardedAnswer(grpc.StatusCode.UNIMPLEMENTED, f"no method {method!r}")
        try:
            request = message_type(method, "input").FromString(data)
        except DecodeError as exc:
            return ForwardedAnswer(grpc.StatusCode.INVALID_ARGUMENT, f"unreadable request: {exc}")
        named = getattr(request, "name", None) or getattr(request, "model_name", None)
        model = named if named else self.default_model()
        context = _ForwardedContext()
        try:
            response = await getattr(self._servicer, method)(request, context)
        except _Aborted as exc:
            return ForwardedAnswer(exc.code, exc.message, model=model)
        return ForwardedAnswer(grpc.StatusCode.OK, "", response.SerializeToString(), model)

    async def serving(
        self, context: grpc.aio.ServicerContext, method: str, name: str, version: str
    ) -> LoadedModel:
        """The model a call names; NOT_FOUND when it is not served."""
        try:
            return self.models.serving(name, version)
        except UnknownModel as exc:
            await self.fail(context, method, grpc.StatusCode.NOT_FOUND, str(exc), name)

    async def repository_call(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        action: Callable[[str], Awaitable[None]],
        request: Any,
    ) -> None:
        """Load or unload the model ``request`` names; a refusal ends the call with its code."""
        try:
            await action(request.model_name)
        except RepositoryError as exc:
            code = next(
                (c for kind, c in _REPOSITORY_CODES if isinstance(exc, kind)),
                grpc.StatusCode.FAILED_PRECONDITION,
            )
            await self.fail(context, method, code, str(exc), request.model_name)

    async def infer(
        self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
    ) -> pb.ModelInferResponse:
        method = "ModelInfer"
        await self.admit(context, method)
        serving = await self.serving(context, method, request.model_name, request.model_version)
        model, batcher = serving.model, serving.batcher
        try:
            parsed = decode_infer_request(request, model.inputs, model.outputs)
        except oip.ProtocolError as exc:
            batcher.metrics.answered("invalid", batcher.slo_seconds)
            await self.fail(context, method, grpc.StatusCode.INVALID_ARGUMENT, str(exc), model.name)
        try:
            result = await batcher.submit(
                parsed.inputs,
                size=parsed.size,
                priority=parsed.priority,
                timeout=parsed.timeout_seconds,
            )
        except BatcherError as exc:
            if isinstance(exc, Rejected) and exc.retry_after is not None:
                seconds = str(max(1, math.ceil(exc.retry_after)))
                context.set_trailing_metadata((("retry-after", seconds),))
            await self.fail(context, method, code_for(exc), str(exc), model.name)
        try:
            response = encode_infer_response(model.name, parsed, result)
        except oip.ProtocolError as exc:
            log.error("model output cannot be encoded", extra={"error": str(exc)})
            await self.fail(context, method, grpc.StatusCode.INTERNAL, str(exc), model.name)
        return self.answered(method, response, model.name)
