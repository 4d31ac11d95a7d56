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
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn, TypeVar

import grpc
import numpy as np
from prometheus_client import CollectorRegistry, Counter

from autoglm.config import ConfigError, parse_listen
from autoglm.web.guard import authorized
from autoglm.webconfig import TLSMaterial, WebConfig
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
from batcher.model import ServedModel, TensorSpec
from batcher.open_inference import predict_v2_pb2 as pb
from batcher.open_inference import predict_v2_pb2_grpc as pb_grpc
from batcher.repository import LoadedModel, ModelRepository

log = logging.getLogger(__name__)
T = TypeVar("T")

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
# Which typed-contents field carries each datatype (FP16 and BF16 have none: raw only).
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
# The type each numeric field holds its values in: read into an array of it in one call, exactly.
_CONTENTS_DTYPE = {
    "bool_contents": np.dtype(np.bool_),
    "int_contents": np.dtype(np.int32),
    "int64_contents": np.dtype(np.int64),
    "uint_contents": np.dtype(np.uint32),
    "uint64_contents": np.dtype(np.uint64),
    "fp32_contents": np.dtype(np.float32),
    "fp64_contents": np.dtype(np.float64),
}
_CONFIG_TYPES = {name: f"TYPE_{name}" for name in oip.DATATYPES} | {"BYTES": "TYPE_STRING"}


def code_for(error: BatcherError) -> grpc.StatusCode:
    """The gRPC status code of a request the engine did not serve."""
    return next(
        (code for kind, code in _CODES if isinstance(error, kind)), grpc.StatusCode.INTERNAL
    )


def parameter_value(parameter: pb.InferParameter) -> Any:
    """The Python value an ``InferParameter`` holds (None when it holds nothing)."""
    choice = parameter.WhichOneof("parameter_choice")
    return None if choice is None else getattr(parameter, choice)


def decode_infer_request(
    request: pb.ModelInferRequest, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]
) -> oip.InferRequest:
    """Decode and validate ``request`` against the model's signature, as the HTTP face does.

    Raises :class:`~batcher.oip.ProtocolError` (INVALID_ARGUMENT) naming the problem.
    """
    parameters = {key: parameter_value(value) for key, value in request.parameters.items()}
    if not request.inputs:
        raise oip.ProtocolError("request needs at least one input tensor")
    raw_contents = request.raw_input_contents
    if raw_contents and len(raw_contents) != len(request.inputs):
        raise oip.ProtocolError(
            f"raw_input_contents holds {len(raw_contents)} entries for {len(request.inputs)} "
            "inputs; give one per input, in the order of inputs"
        )
    specs = {spec.name: spec for spec in inputs}
    decoded: dict[str, np.ndarray] = {}
    for index, tensor in enumerate(request.inputs):
        name = tensor.name
        if name in decoded:
            raise oip.ProtocolError(f"input {name!r} is given twice")
        spec = specs.get(name)
        if spec is None:
            raise oip.ProtocolError(f"unknown input {name!r}; the model takes: {', '.join(specs)}")
        dtype, shape, count = oip.check_tensor(spec, tensor.datatype, list(tensor.shape))
        if raw_contents:
            if tensor.HasField("contents"):
                raise oip.ProtocolError(
                    f"input {name!r} has contents while raw_input_contents is used; "
                    "send every input one way"
                )
            decoded[name] = _decode_raw(raw_contents[index], spec, dtype, shape, count)
        else:
            decoded[name] = _decode_contents(tensor.contents, spec, dtype, shape, count)
    missing = [name for name in specs if name not in decoded]
    if missing:
        raise oip.ProtocolError(
            f"missing input {missing[0]!r}; the model takes: {', '.join(specs)}"
        )
    sizes = {name: array.shape[0] for name, array in decoded.items()}
    if len(set(sizes.values())) != 1:
        raise oip.ProtocolError(
            f"inputs disagree on the batch dimension (first shape entry): {sizes}"
        )
    size = next(iter(sizes.values()))
    if size < 1:
        raise oip.ProtocolError("the batch dimension (first shape entry) must be at least 1")
    known = [spec.name for spec in outputs]
    requested = []
    for output in request.outputs:
        if output.name not in known:
            raise oip.ProtocolError(
                f"unknown output {output.name!r}; the model produces: {', '.join(known)}"
            )
        requested.append(output.name)
    names = tuple(requested) if requested else tuple(known)
    return oip.InferRequest(
        id=request.id or None,
        inputs=decoded,
        size=size,
        priority=oip.request_priority(parameters),
        timeout_seconds=oip.request_timeout(parameters),
        outputs=names,
        binary_outputs=frozenset(names),
    )


def encode_infer_response(
    model_name: str, request: oip.InferRequest, result: dict[str, np.ndarray]
) -> pb.ModelInferResponse:
    """The answer, every output as raw contents; :class:`~batcher.oip.ProtocolError` when the
    model's output cannot be carried (INTERNAL: the model's fault, not the client's)."""
    response = pb.ModelInferResponse(model_name=model_name, model_version="1", id=request.id or "")
    for name in request.outputs:
        if name not in result:
            raise oip.ProtocolError(f"the model did not produce output {name!r}")
        array = np.ascontiguousarray(result[name])
        datatype = oip.datatype_of(array)
        response.outputs.add(name=name, datatype=datatype, shape=array.shape)
        response.raw_output_contents.append(oip.encode_binary_output(name, datatype, array))
    return response


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


def _decode_raw(
    raw: bytes, spec: TensorSpec, dtype: np.dtype, shape: list[int], count: int
) -> np.ndarray:
    if spec.datatype != "BYTES" and len(raw) != count * dtype.itemsize:
        raise oip.ProtocolError(
            f"input {spec.name!r}: raw contents hold {len(raw)} bytes but shape {shape} of "
            f"{spec.datatype} needs {count * dtype.itemsize}"
        )
    return oip.decode_binary_data(raw, spec.name, spec.datatype, dtype, shape)


def _decode_contents(
    contents: pb.InferTensorContents,
    spec: TensorSpec,
    dtype: np.dtype,
    shape: list[int],
    count: int,
) -> np.ndarray:
    field = _CONTENTS_FIELD.get(spec.datatype)
    if field is None:
        raise oip.ProtocolError(
            f"input {spec.name!r}: {spec.datatype} has no typed contents in the protocol; "
            "send it in raw_input_contents"
        )
    values = getattr(contents, field)
    if spec.datatype == "BYTES":
        if len(values) != count:
            raise oip.ProtocolError(
                f"input {spec.name!r}: contents hold {len(values)} values but shape {shape} "
                f"needs {count}"
            )
        array = np.empty(count, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    # numpy reads the repeated field in C: no list of Python numbers on the way
    loose = np.array(values, dtype=_CONTENTS_DTYPE[field])
    return oip.cast_values(loose, spec.name, spec.datatype, dtype, shape, count)


def _peer_certificate(context: grpc.aio.ServicerContext) -> dict[str, Any] | None:
    """The verified client certificate's names, shaped as ``SSLSocket.getpeercert()`` is."""
    names = context.auth_context().get("x509_subject_alternative_name")
    if not names:
        return None
    return {"subjectAltName": tuple(("DNS", name.decode()) for name in names)}


def _certificate_configuration(material: TLSMaterial) -> Any:
    return grpc.ssl_server_certificate_configuration(
        [(material.private_key, material.certificate_chain)],
        root_certificates=material.client_ca,
    )


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


class GrpcInferenceServer:
    """Serves a :class:`~batcher.repository.ModelRepository`'s models over gRPC, on the
    running loop."""

    def __init__(
        self,
        models: ModelRepository,
        registry: CollectorRegistry,
        *,
        listen: str,
        web_config: WebConfig | None = None,
        max_message_bytes: int = 16 << 20,
        version: str = "0.0.0",
    ) -> None:
        self.models = models
        self.listen = listen
        self.web_config = web_config or WebConfig()
        self.max_message_bytes = max_message_bytes
        self.version = version
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._requests = Counter(
            "autoglm_batcher_grpc_requests",
            "gRPC calls answered by the batcher, by method and status code.",
            ["model", "method", "code"],
            registry=registry,
        )
        self._counted: dict[tuple[str, str, grpc.StatusCode], Any] = {}

    # --- lifecycle -------------------------------------------------------------------------

    async def start(self) -> None:
        """Listen; raises :class:`ConfigError` when the address cannot be bound."""
        host, port = parse_listen(self.listen)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 0),
            ]
        )
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(self), server)
        material = self.web_config.tls_material()
        try:
            if material is None:
                self.port = server.add_insecure_port(address)
            else:
                self.port = server.add_secure_port(address, self._credentials(material))
        except RuntimeError as exc:
            raise ConfigError(
                f"cannot listen for gRPC on {self.listen} ({exc}); choose another --grpc-listen"
            ) from exc
        await server.start()
        self._server = server
        log.info(
            "serving grpc",
            extra={"listen": self.listen, "port": self.port, "tls": material is not None},
        )

    async def stop(self, grace_seconds: float = 5.0) -> None:
        """Close the listener; calls still running get ``grace_seconds`` to finish."""
        if self._server is not None:
            await self._server.stop(grace_seconds)
            self._server = None

    def _credentials(self, material: TLSMaterial) -> grpc.ServerCredentials:
        current = {"material": material}

        def fetch() -> Any:
            # Called by gRPC on handshakes: serve a renewed certificate as HTTP does.
            latest = self.web_config.tls_material()
            if latest is None or latest is current["material"]:
                return None
            current["material"] = latest
            return _certificate_configuration(latest)

        required = material.client_auth_type in (
            "RequireAnyClientCert",
            "RequireAndVerifyClientCert",
        )
        return grpc.dynamic_ssl_server_credentials(
            _certificate_configuration(material),
            fetch,
            require_client_authentication=required,
        )

    # --- per call --------------------------------------------------------------------------

    def count(self, method: str, code: grpc.StatusCode, model: str | None = None) -> None:
        """Count one answered call (children cached: labels() costs more than inc()).

        ``model``: the model the call named; calls to the server as a whole count under the
        model served when there is one, else under "".
        """
        if model is None:
            names = self.models.names
            model = names[0] if len(names) == 1 else ""
        child = self._counted.get((model, method, code))
        if child is None:
            child = self._requests.labels(model, method, code.name)
            self._counted[(model, method, code)] = child
        child.inc()

    def answered(self, method: str, response: T, model: str | None = None) -> T:
        """Count one call answered with OK, and pass its response on."""
        self.count(method, grpc.StatusCode.OK, model)
        return response

    async def fail(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        code: grpc.StatusCode,
        message: str,
        model: str | None = None,
    ) -> NoReturn:
        """Count the call and end it with ``code`` (raises, as ``context.abort`` does)."""
        self.count(method, code, model)
        await context.abort(code, message)
        raise AssertionError("grpc.aio's abort returned instead of raising")

    async def admit(self, context: grpc.aio.ServicerContext, method: str) -> None:
        """The web config's client certificate names and basic auth, as on HTTP."""
        config = self.web_config
        if config.ssl_context() is not None and not config.client_certificate_allowed(
            _peer_certificate(context)
        ):
            await self.fail(
                context, method, grpc.StatusCode.PERMISSION_DENIED, "client certificate not allowed"
            )
        if config.auth_required:
            header = dict(context.invocation_metadata()).get("authorization")
            # credentials accepted lately are a dictionary look-up, as on HTTP: no thread per call
            if not await authorized(config, header):
                await self.fail(
                    context,
                    method,
                    grpc.StatusCode.UNAUTHENTICATED,
                    "authentication required: send basic-auth credentials in the "
                    "'authorization' metadata",
                )

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
            batcher.metrics.answered("invalid", None, batcher.slo_seconds)
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
