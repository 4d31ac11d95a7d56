"""What every gRPC face of the batcher shares: the tensor codec, TLS, basic auth and counting.

Two processes serve ``inference.GRPCInferenceService``: the engine itself
(:mod:`batcher.grpc_server`, one process) and, with ``--workers N``, each front worker
(:mod:`batcher.grpc_front`), which decodes here, forwards over the private channel and leaves the
engine only the batching. Both decode requests, encode answers, build credentials, admit callers
and count calls with this module, so a client sees the same answers, the same refusals in the same
words, and one ``autoglm_batcher_grpc_requests_total`` series whichever process served it. It
imports neither torch nor the engine: a front worker stays small.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import grpc
import numpy as np
from google.protobuf.message import DecodeError
from prometheus_client import CollectorRegistry, Counter

from autoglm.config import ConfigError, parse_listen
from autoglm.web.guard import authorized
from autoglm.webconfig import TLSMaterial, WebConfig
from batcher import oip
from batcher.open_inference import predict_v2_pb2 as pb
from batcher.tensor_spec import TensorSpec

log = logging.getLogger(__name__)
T = TypeVar("T")

# The HTTP status of an answer of the engine (its REST face and its channel to the front workers)
# -> the gRPC code the engine's own gRPC face gives for the same refusal (batcher.server's
# _HTTP_STATUS beside batcher.grpc_server's _CODES); any other failure is INTERNAL.
_STATUS_CODES = {
    400: grpc.StatusCode.INVALID_ARGUMENT,
    404: grpc.StatusCode.NOT_FOUND,
    429: grpc.StatusCode.RESOURCE_EXHAUSTED,
    503: grpc.StatusCode.UNAVAILABLE,
    504: grpc.StatusCode.DEADLINE_EXCEEDED,
}

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


def code_for_status(status: int) -> grpc.StatusCode:
    """The gRPC code for an engine answer of HTTP ``status`` (200: OK)."""
    if status == 200:
        return grpc.StatusCode.OK
    return _STATUS_CODES.get(status, grpc.StatusCode.INTERNAL)


def peer_certificate(context: grpc.aio.ServicerContext) -> dict[str, Any] | None:
    """The verified client certificate's names, shaped as ``SSLSocket.getpeercert()`` is."""
    names = context.auth_context().get("x509_subject_alternative_name")
    if not names:
        return None
    return {"subjectAltName": tuple(("DNS", name.decode()) for name in names)}


def check_grpc_can_enforce(material: TLSMaterial | None) -> None:
    """Refuse TLS settings the gRPC listener would silently ignore.

    grpcio takes a certificate, a key and a client CA, and no TLS versions or ciphers: it
    negotiates TLS 1.2 or 1.3 with its own cipher list. A web config that asks for less than
    that (an older minimum) is served more strictly, which is safe; one that asks for more (a
    TLS 1.3 minimum, a TLS 1.2 maximum, a cipher list) would hold on HTTP and not on gRPC, so it
    is refused at start rather than half applied.
    """
    if material is None:
        return
    asked = []
    if material.min_version == "TLS13":
        asked.append("min_version TLS13")
    if material.max_version != "TLS13":
        asked.append(f"max_version {material.max_version}")
    if material.cipher_suites:
        asked.append("cipher_suites")
    if asked:
        raise ConfigError(
            f"--grpc-listen: the web config's tls_server_config sets {', '.join(asked)}, which "
            "the gRPC listener cannot enforce (grpcio negotiates TLS 1.2 or 1.3 with its own "
            "ciphers); remove it from the web config, or serve REST only (no --grpc-listen)"
        )


def certificate_configuration(material: TLSMaterial) -> Any:
    return grpc.ssl_server_certificate_configuration(
        [(material.private_key, material.certificate_chain)],
        root_certificates=material.client_ca,
    )


SERVICE = "GRPCInferenceService"


@dataclass(frozen=True)
class Undecodable:
    """What bytes that are not a message of the call's request type decode to."""

    type_name: str
    reason: str


def _lenient(message_type: Any) -> Callable[[bytes], Any]:
    def decode(raw: bytes) -> Any:
        try:
            return message_type.FromString(raw)
        except DecodeError as exc:
            return Undecodable(message_type.DESCRIPTOR.full_name, str(exc))

    return decode


class GrpcFace:
    """A ``grpc.aio`` server of the service on the running loop, with the web config's TLS and
    basic auth, counting every answered call.

    ``registry`` None: no counter (the engine behind front workers, whose calls the workers
    count). ``reuse_port``: bind with ``SO_REUSEPORT``, so every front worker listens on the one
    port and the kernel spreads connections over them.
    """

    def __init__(
        self,
        registry: CollectorRegistry | None,
        *,
        listen: str,
        web_config: WebConfig | None = None,
        max_message_bytes: int = 16 << 20,
        reuse_port: bool = False,
    ) -> None:
        self.listen = listen
        self.web_config = web_config or WebConfig()
        self.max_message_bytes = max_message_bytes
        self.reuse_port = reuse_port
        self.port = 0
        self._server: grpc.aio.Server | None = None
        self._requests = (
            Counter(
                "autoglm_batcher_grpc_requests",
                "gRPC calls answered by the batcher, by method and status code.",
                ["model", "method", "code"],
                registry=registry,
            )
            if registry is not None
            else None
        )
        self._counted: dict[tuple[str, str, grpc.StatusCode], Any] = {}

    # --- lifecycle -------------------------------------------------------------------------

    def add_servicer(self, server: grpc.aio.Server) -> None:
        """Add the RPCs to ``server`` (each face has its own), with :meth:`serve_rpcs`."""
        raise NotImplementedError

    def serve_rpcs(self, servicer: Any, server: grpc.aio.Server) -> None:
        """Serve every RPC of the service from ``servicer``'s method of the same name.

        What the generated ``add_GRPCInferenceServiceServicer_to_server`` does, but bytes that
        are not a message of the call's type are the client's mistake: INVALID_ARGUMENT naming
        it (once the caller is admitted), where grpc would answer UNKNOWN with a traceback in
        the log.
        """
        handlers = {}
        for method in pb.DESCRIPTOR.services_by_name[SERVICE].methods:
            request_type = getattr(pb, method.input_type.name)
            response_type = getattr(pb, method.output_type.name)
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                self._refusing_undecodable(method.name, getattr(servicer, method.name)),
                request_deserializer=_lenient(request_type),
                response_serializer=response_type.SerializeToString,
            )
        name = f"{pb.DESCRIPTOR.package}.{SERVICE}"
        server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(name, handlers),))
        server.add_registered_method_handlers(name, handlers)  # looked up faster per call

    def _refusing_undecodable(
        self, method: str, behaviour: Callable[[Any, Any], Awaitable[Any]]
    ) -> Callable[[Any, Any], Awaitable[Any]]:
        async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
            if isinstance(request, Undecodable):
                await self.admit(context, method)
                await self.fail(
                    context,
                    method,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the request is not a valid {request.type_name} message ({request.reason}); "
                    "send one serialized as the service's .proto defines it",
                )
            return await behaviour(request, context)

        return call

    async def start(self) -> None:
        """Listen; raises :class:`ConfigError` when the address cannot be bound."""
        host, port = parse_listen(self.listen)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", self.max_message_bytes),
                ("grpc.max_send_message_length", -1),
                ("grpc.so_reuseport", 1 if self.reuse_port else 0),
            ]
        )
        self.add_servicer(server)
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
            return certificate_configuration(latest)

        required = material.client_auth_type in (
            "RequireAnyClientCert",
            "RequireAndVerifyClientCert",
        )
        return grpc.dynamic_ssl_server_credentials(
            certificate_configuration(material),
            fetch,
            require_client_authentication=required,
        )

    # --- per call --------------------------------------------------------------------------

    def default_model(self) -> str:
        """The model label of a call to the server as a whole."""
        return ""

    def count(self, method: str, code: grpc.StatusCode, model: str | None = None) -> None:
        """Count one answered call (children cached: labels() costs more than inc()).

        ``model``: the model the call named; calls to the server as a whole count under
        :meth:`default_model`.
        """
        if self._requests is None:
            return
        if model is None:
            model = self.default_model()
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
            peer_certificate(context)
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


# The RPCs a front worker passes to the engine as they came (serialized), answered by the engine's
# own face: everything but ModelInfer, which the worker decodes and sends over the channel.
FORWARDED_METHODS = frozenset(
    {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelConfig",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    }
)
_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]


def message_type(method: str, side: str) -> Any:
    """The protobuf class of ``method``'s request (``side`` "input") or response ("output")."""
    descriptor = getattr(_SERVICE.methods_by_name[method], f"{side}_type")
    return getattr(pb, descriptor.name)


@dataclass(frozen=True)
class ForwardedAnswer:
    """The engine's answer to a forwarded call: its code, message (when not OK), serialized
    response (when OK), and the model label the call counts under."""

    code: grpc.StatusCode
    message: str
    response: bytes = b""
    model: str = ""


# How the engine's private HTTP socket answers a forwarded call (POST /grpc/METHOD): the code's
# name and the model label (percent-encoded) in these headers, the serialized response (OK) or
# the message in the body.
GRPC_CODE_HEADER = "X-Autoglm-Grpc-Code"
GRPC_MODEL_HEADER = "X-Autoglm-Grpc-Model"
