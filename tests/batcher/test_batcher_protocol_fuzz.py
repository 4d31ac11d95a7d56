"""Arbitrary inference requests, on both faces: a decoded request or a ProtocolError, nothing else.

A ProtocolError is what the HTTP face answers with 400 and the gRPC face with INVALID_ARGUMENT,
its message naming the problem; any other exception would be a 500 (or an INTERNAL) with a
traceback in the log, for what is the client's mistake. So hypothesis builds requests near valid
ones (each part of a valid request replaced, dropped or duplicated with arbitrary JSON, protobuf
fields of every kind, binary data of any length behind any header length) for models of every
datatype, and each must decode to arrays of the model's datatype and shape or be refused with a
ProtocolError. What decodes must also encode as an answer, in JSON and in binary.

The same requests then go to a running server over HTTP (with arbitrary content headers) and gRPC,
as do odd model names and versions on every other route and RPC, and bytes that are no message:
whatever they get, it is never a 500 or INTERNAL (or UNKNOWN), and a refusal carries its reason.
"""

from __future__ import annotations

import json
import os
from typing import Any
from urllib.parse import quote

import grpc
import numpy as np
import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from batcher import grpc_face, oip
from batcher.open_inference import predict_v2_pb2 as pb
from batcher.open_inference import predict_v2_pb2_grpc as pb_grpc
from batcher.tensor_spec import TensorSpec
from tests.batcher.batcher_test_models import EchoModel

# A fixed, bounded draw by default, so the suite is the same every run; a longer random hunt:
# AUTOGLM_FUZZ_EXAMPLES=5000 python -m pytest tests/batcher/test_batcher_protocol_fuzz.py
HUNT = os.environ.get("AUTOGLM_FUZZ_EXAMPLES")
SETTINGS = settings(
    max_examples=int(HUNT or 150),
    derandomize=not HUNT,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

DATATYPES = tuple(oip.DATATYPES)
SIGNATURES: tuple[tuple[TensorSpec, ...], ...] = (
    *(((TensorSpec("x", datatype, (2,))),) for datatype in DATATYPES),
    (TensorSpec("x", "FP32", (-1, 3)), TensorSpec("ids", "INT64", (-1,))),
    (TensorSpec("text", "BYTES", ()),),
)
OUTPUTS = (TensorSpec("y", "FP32", (-1,)),)

# Numbers and strings that have broken JSON and array decoders elsewhere.
AWKWARD_NUMBERS = st.sampled_from(
    [
        *(0, -1, 1, 2, 255, 256, -129, 2**31, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30),
        *(0.5, -0.0, 1e308, -1e308, 3.5e38, 65520.0, 1e-320),
    ]
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    AWKWARD_NUMBERS,
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=8),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=6), inner, max_size=4)
    ),
    max_leaves=12,
)
SHAPES = st.one_of(
    st.lists(st.integers(min_value=0, max_value=4), max_size=3),
    st.lists(st.sampled_from([0, 1, 2, 2**31, 2**62, 2**63 - 1, 10**20]), max_size=3),
    JSON_VALUES,
)


def _element(datatype: str) -> st.SearchStrategy[Any]:
    if datatype == "BYTES":
        return st.one_of(st.text(max_size=4), SCALARS)
    if datatype == "BOOL":
        return st.one_of(st.booleans(), SCALARS)
    return st.one_of(st.integers(min_value=-300, max_value=300), AWKWARD_NUMBERS, SCALARS)


@st.composite
def json_tensors(draw: st.DrawFn, spec: TensorSpec) -> dict[str, Any]:
    """An input near a valid one: right or wrong name, datatype and shape, data of any kind."""
    rows = draw(st.integers(min_value=0, max_value=3))
    shape = [rows, *(2 if d < 0 else d for d in spec.shape)]
    count = int(np.prod(shape))
    elements = draw(st.lists(_element(spec.datatype), min_size=count, max_size=count))
    tensor: dict[str, Any] = {"name": spec.name, "datatype": spec.datatype, "shape": shape}
    tensor["data"] = draw(
        st.one_of(
            st.just(elements),
            st.just(np.array(elements, dtype=object).reshape(shape).tolist() if count else []),
            st.lists(_element(spec.datatype), max_size=count + 2),
            JSON_VALUES,
        )
    )
    keys = st.sets(st.sampled_from(["name", "datatype", "shape", "data", "parameters"]))
    for key in sorted(draw(keys)):  # sorted: see json_documents
        tensor[key] = draw(
            {
                "name": st.one_of(st.sampled_from(["x", "ids", "text", "z"]), JSON_VALUES),
                "datatype": st.one_of(st.sampled_from(DATATYPES), JSON_VALUES),
                "shape": SHAPES,
                "data": JSON_VALUES,
                "parameters": JSON_VALUES,
            }[key]
        )
    if draw(st.booleans()):
        del tensor[draw(st.sampled_from(sorted(tensor)))]
    return tensor


@st.composite
def json_documents(draw: st.DrawFn, signature: tuple[TensorSpec, ...]) -> dict[str, Any]:
    inputs = [draw(json_tensors(spec)) for spec in signature]
    if draw(st.booleans()):
        inputs.append(draw(json_tensors(draw(st.sampled_from(signature)))))
    document: dict[str, Any] = {"inputs": draw(st.one_of(st.just(inputs), JSON_VALUES))}
    optional = {
        "id": st.one_of(st.text(max_size=5), JSON_VALUES),
        "parameters": st.one_of(
            st.fixed_dictionaries(
                {},
                optional={
                    "priority": JSON_VALUES,
                    "timeout": JSON_VALUES,
                    "binary_data_output": JSON_VALUES,
                },
            ),
            JSON_VALUES,
        ),
        "outputs": st.one_of(
            st.lists(
                st.fixed_dictionaries(
                    {"name": st.one_of(st.just("y"), JSON_VALUES)},
                    optional={"parameters": JSON_VALUES},
                ),
                max_size=2,
            ),
            JSON_VALUES,
        ),
    }
    # sorted: a set's order follows the process's string hashing, which differs between runs,
    # and the draws that follow would too (a derandomized run drew another document in CI)
    for key in sorted(draw(st.sets(st.sampled_from(sorted(optional))))):
        document[key] = draw(optional[key])
    return document


def _decoded_or_refused(decode: Any, signature: tuple[TensorSpec, ...]) -> None:
    try:
        request = decode()
    except oip.ProtocolError as exc:
        assert type(exc) is oip.ProtocolError and str(exc), "a refusal names its reason"
        return
    specs = {spec.name: spec for spec in signature}
    assert set(request.inputs) == set(specs)
    for name, array in request.inputs.items():
        spec = specs[name]
        assert isinstance(array, np.ndarray)
        assert array.dtype == oip.DATATYPES[spec.datatype]
        assert array.shape[0] == request.size >= 1
        assert all(want in (-1, got) for want, got in zip(spec.shape, array.shape[1:], strict=True))
    # What decodes can be answered, both ways (the model's answer: one row per item).
    answer = {"y": np.zeros(request.size, dtype=np.float32)}
    oip.encode_infer_response("m", request, answer)
    grpc_face.encode_infer_response("m", request, answer)


@SETTINGS
@given(data=st.data(), signature=st.sampled_from(SIGNATURES))
def test_a_json_request_is_decoded_or_refused_with_a_reason(
    data: st.DataObject, signature: tuple[TensorSpec, ...]
) -> None:
    document = data.draw(json_documents(signature))
    body = json.dumps(document).encode()
    _decoded_or_refused(lambda: oip.parse_infer_request(body, None, signature, OUTPUTS), signature)


@SETTINGS
@given(
    data=st.data(),
    signature=st.sampled_from(SIGNATURES),
    tail=st.binary(max_size=64),
    header_length=st.one_of(st.none(), st.text(max_size=6), st.integers().map(str)),
)
def test_a_binary_request_is_decoded_or_refused_with_a_reason(
    data: st.DataObject,
    signature: tuple[TensorSpec, ...],
    tail: bytes,
    header_length: str | None,
) -> None:
    document = data.draw(json_documents(signature))
    for tensor in document["inputs"] if isinstance(document["inputs"], list) else []:
        if isinstance(tensor, dict) and data.draw(st.booleans()):
            tensor.pop("data", None)
            size = data.draw(st.one_of(st.integers(min_value=0, max_value=80), JSON_VALUES))
            tensor["parameters"] = {"binary_data_size": size}
    header = json.dumps(document).encode()
    body = header + tail
    length = str(len(header)) if header_length is None else header_length
    _decoded_or_refused(
        lambda: oip.parse_infer_request(body, length, signature, OUTPUTS), signature
    )


@SETTINGS
@given(body=st.binary(max_size=200), header_length=st.one_of(st.none(), st.text(max_size=4)))
def test_arbitrary_bytes_are_refused_with_a_reason(body: bytes, header_length: str | None) -> None:
    signature = SIGNATURES[0]
    _decoded_or_refused(
        lambda: oip.parse_infer_request(body, header_length, signature, OUTPUTS), signature
    )


_CONTENT_FIELDS = {
    "bool_contents": st.lists(st.booleans(), max_size=6),
    "int_contents": st.lists(st.integers(-(2**31), 2**31 - 1), max_size=6),
    "int64_contents": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=6),
    "uint_contents": st.lists(st.integers(0, 2**32 - 1), max_size=6),
    "uint64_contents": st.lists(st.integers(0, 2**64 - 1), max_size=6),
    "fp32_contents": st.lists(st.floats(width=32), max_size=6),
    "fp64_contents": st.lists(st.floats(), max_size=6),
    "bytes_contents": st.lists(st.binary(max_size=4), max_size=6),
}
_PARAMETERS = st.dictionaries(
    st.sampled_from(["priority", "timeout", "binary_data_output", "other"]),
    st.one_of(
        st.builds(lambda v: pb.InferParameter(bool_param=v), st.booleans()),
        st.builds(lambda v: pb.InferParameter(int64_param=v), st.integers(-(2**63), 2**63 - 1)),
        st.builds(lambda v: pb.InferParameter(string_param=v), st.text(max_size=6)),
    ),
    max_size=3,
)


@st.composite
def grpc_requests(draw: st.DrawFn, signature: tuple[TensorSpec, ...]) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m", id=draw(st.text(max_size=4)))
    for key, value in draw(_PARAMETERS).items():
        request.parameters[key].CopyFrom(value)
    raw = draw(st.booleans())
    specs = list(signature) + ([draw(st.sampled_from(signature))] if draw(st.booleans()) else [])
    for spec in specs:
        rows = draw(st.integers(min_value=0, max_value=3))
        shape = [rows, *(2 if d < 0 else d for d in spec.shape)]
        tensor = request.inputs.add(
            name=draw(st.one_of(st.just(spec.name), st.text(max_size=3))),
            datatype=draw(st.one_of(st.just(spec.datatype), st.sampled_from(DATATYPES))),
            shape=draw(
                st.one_of(
                    st.just(shape),
                    st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3),
                    st.lists(st.sampled_from([0, 1, 2, 2**62, 2**63 - 1]), max_size=3),
                )
            ),
        )
        if raw:
            length = oip.DATATYPES[spec.datatype].itemsize * int(np.prod(shape))
            exact = st.binary(min_size=length, max_size=length)
            request.raw_input_contents.append(draw(st.one_of(exact, st.binary(max_size=40))))
        fields = st.sets(st.sampled_from(sorted(_CONTENT_FIELDS)), max_size=2)
        for field in sorted(draw(fields)):  # sorted: see json_documents
            getattr(tensor.contents, field).extend(draw(_CONTENT_FIELDS[field]))
    if draw(st.booleans()) and request.raw_input_contents:
        request.raw_input_contents.append(draw(st.binary(max_size=8)))
    for name in draw(st.lists(st.sampled_from(["y", "z", ""]), max_size=2)):
        request.outputs.add(name=name)
    return request


@SETTINGS
@given(data=st.data(), signature=st.sampled_from(SIGNATURES))
def test_a_grpc_request_is_decoded_or_refused_with_a_reason(
    data: st.DataObject, signature: tuple[TensorSpec, ...]
) -> None:
    request = data.draw(grpc_requests(signature))
    _decoded_or_refused(
        lambda: grpc_face.decode_infer_request(request, signature, OUTPUTS), signature
    )


@pytest.mark.parametrize(
    "shape", [[0, 2**62], [0, 10**20], [2**62, 0], [0, 2**63 - 1, 2**63 - 1]], ids=str
)
@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_an_empty_tensor_with_huge_dimensions_is_refused(shape: list[int], binary: bool) -> None:
    signature = (TensorSpec("x", "FP32", (-1,) * (len(shape) - 1)),)
    tensor: dict[str, Any] = {"name": "x", "datatype": "FP32", "shape": shape}
    if binary:
        tensor["parameters"] = {"binary_data_size": 0}
    else:
        tensor["data"] = []
    header = json.dumps({"inputs": [tensor]}).encode()
    with pytest.raises(oip.ProtocolError, match="shape"):
        oip.parse_infer_request(header, str(len(header)) if binary else None, signature, OUTPUTS)


def test_an_empty_grpc_tensor_with_huge_dimensions_is_refused() -> None:
    request = pb.ModelInferRequest(model_name="m")
    request.inputs.add(name="x", datatype="FP32", shape=[0, 2**62])
    request.raw_input_contents.append(b"")
    signature = (TensorSpec("x", "FP32", (-1,)),)
    with pytest.raises(oip.ProtocolError, match="shape"):
        grpc_face.decode_infer_request(request, signature, OUTPUTS)


# Over the wire: fewer examples (each is a round trip), the same strategies.
WIRE_SETTINGS = settings(
    max_examples=int(HUNT or 60),
    derandomize=not HUNT,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
HEADER_TEXT = st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=6)
HEADERS = st.fixed_dictionaries(
    {},
    optional={
        "Content-Type": st.one_of(
            st.sampled_from(["application/json", "application/octet-stream", "text/plain"]),
            HEADER_TEXT,
        ),
        "Content-Encoding": st.one_of(
            st.sampled_from(["gzip", "deflate", "br", "identity"]), HEADER_TEXT
        ),
        oip.HEADER_LENGTH: st.one_of(st.integers(-5, 400).map(str), HEADER_TEXT),
    },
)


def test_the_http_face_never_answers_a_client_mistake_with_a_500(serve) -> None:
    server = serve(EchoModel(), warmup_repeats=0)
    url = f"{server.url}/v2/models/echo/infer"
    with requests.Session() as session:

        @WIRE_SETTINGS
        @given(data=st.data(), headers=HEADERS, tail=st.binary(max_size=32))
        def check(data: st.DataObject, headers: dict[str, str], tail: bytes) -> None:
            document = data.draw(json_documents(EchoModel.input_specs))
            reply = session.post(
                url, data=json.dumps(document).encode() + tail, headers=headers, timeout=10
            )
            assert reply.status_code < 500 or reply.status_code in (503, 504), reply.text
            if reply.status_code != 200:
                assert reply.text.strip(), "a refusal names its reason"

        check()


def test_the_grpc_face_never_answers_a_client_mistake_with_internal(serve) -> None:
    server = serve(EchoModel(), warmup_repeats=0, grpc_listen="127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{server.server.grpc.port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)

        @WIRE_SETTINGS
        @given(data=st.data())
        def check(data: st.DataObject) -> None:
            request = data.draw(grpc_requests(EchoModel.input_specs))
            request.model_name = "echo"
            try:
                stub.ModelInfer(request, timeout=10)
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), code
                assert exc.details(), "a refusal names its reason"  # type: ignore[attr-defined]

        check()


@pytest.mark.parametrize("path", ["/v2/models/echo/infer", "/v2/repository/index"])
def test_a_body_that_does_not_decode_as_its_encoding_says_is_a_400_that_closes(
    serve, path: str
) -> None:
    server = serve(EchoModel(), warmup_repeats=0)
    with requests.Session() as session:
        reply = session.post(
            server.url + path, data=b'{"inputs": []}', headers={"Content-Encoding": "gzip"}
        )
        assert reply.status_code == 400
        assert "Content-Encoding" in reply.json()["error"]
        assert reply.headers["Connection"] == "close"  # aiohttp closes it: the client must know
        again = session.post(server.url + "/v2/repository/index", json={}, timeout=10)
        assert again.status_code == 200


NAMES = st.one_of(
    st.sampled_from(["echo", "", "ECHO", "echo ", "../echo", "echo/1", "%2e%2e", "\u00e9cho"]),
    st.text(max_size=8),
)
VERSIONS = st.one_of(st.sampled_from(["", "1", "2", "-1", "01", "x", "1.0"]), st.text(max_size=4))


def test_every_other_grpc_call_with_any_name_or_version_is_answered(serve) -> None:
    server = serve(EchoModel(), warmup_repeats=0, grpc_listen="127.0.0.1:0")
    with grpc.insecure_channel(f"127.0.0.1:{server.server.grpc.port}") as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        calls = {
            "ModelReady": lambda n, v, p: stub.ModelReady(
                pb.ModelReadyRequest(name=n, version=v), timeout=10
            ),
            "ModelMetadata": lambda n, v, p: stub.ModelMetadata(
                pb.ModelMetadataRequest(name=n, version=v), timeout=10
            ),
            "RepositoryIndex": lambda n, v, p: stub.RepositoryIndex(
                pb.RepositoryIndexRequest(repository_name=n, ready=bool(p)), timeout=10
            ),
            "RepositoryModelUnload": lambda n, v, p: stub.RepositoryModelUnload(
                pb.RepositoryModelUnloadRequest(repository_name=v, model_name=n + "-x"), timeout=10
            ),
            "RepositoryModelLoad": lambda n, v, p: stub.RepositoryModelLoad(
                _load_request(n, v, p), timeout=10
            ),
        }

        @WIRE_SETTINGS
        @given(
            method=st.sampled_from(sorted(calls)),
            name=NAMES,
            version=VERSIONS,
            parameters=st.dictionaries(
                st.sampled_from(["config", "file:a", "x", ""]), st.text(max_size=3), max_size=2
            ),
        )
        def check(method: str, name: str, version: str, parameters: dict[str, str]) -> None:
            try:
                calls[method](name, version, parameters)
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), code
                assert exc.details(), "a refusal names its reason"  # type: ignore[attr-defined]

        check()


def _load_request(name: str, version: str, parameters: dict[str, str]) -> Any:
    request = pb.RepositoryModelLoadRequest(repository_name=version, model_name=name)
    for key, value in parameters.items():
        request.parameters[key].string_param = value
    return request


def test_every_http_route_with_any_name_or_version_is_answered(serve) -> None:
    server = serve(EchoModel(), warmup_repeats=0)
    paths = {
        "GET": [
            "/v2/models/{n}",
            "/v2/models/{n}/ready",
            "/v2/models/{n}/versions/{v}",
            "/v2/models/{n}/versions/{v}/ready",
        ],
        "POST": [
            "/v2/models/{n}/infer",
            "/v2/models/{n}/versions/{v}/infer",
            "/v2/repository/models/{n}/load",
            "/v2/repository/models/{n}-x/unload",
            "/v2/repository/index",
        ],
    }
    with requests.Session() as session:

        @WIRE_SETTINGS
        @given(
            method=st.sampled_from(sorted(paths)),
            data=st.data(),
            name=NAMES,
            version=VERSIONS,
            body=st.one_of(JSON_VALUES.map(json.dumps), st.text(max_size=10)),
        )
        def check(method: str, data: st.DataObject, name: str, version: str, body: str) -> None:
            template = data.draw(st.sampled_from(paths[method]))
            path = template.format(n=quote(name, safe=""), v=quote(version, safe=""))
            reply = session.request(method, server.url + path, data=body.encode(), timeout=10)
            assert reply.status_code < 500 or reply.status_code in (503, 507), reply.text
            if reply.status_code >= 400:
                assert reply.text.strip(), "a refusal names its reason"

        check()


def test_bytes_that_are_no_message_are_invalid_argument_on_every_call(serve) -> None:
    server = serve(EchoModel(), warmup_repeats=0, grpc_listen="127.0.0.1:0")
    methods = [m.name for m in pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].methods]
    with grpc.insecure_channel(f"127.0.0.1:{server.server.grpc.port}") as channel:
        for method in methods:
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            with pytest.raises(grpc.RpcError) as refused:
                call(b"\xff\xff\xff", timeout=10)  # a field tag that runs off the end
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT, method
            assert "is not a valid inference." in refused.value.details()

        @WIRE_SETTINGS
        @given(method=st.sampled_from(methods), raw=st.binary(max_size=40))
        def check(method: str, raw: bytes) -> None:
            call = channel.unary_unary(f"/inference.GRPCInferenceService/{method}")
            try:
                call(raw, timeout=10)  # bytes that happen to parse are a (strange) request
            except grpc.RpcError as exc:
                code = exc.code()  # type: ignore[attr-defined]
                assert code not in (grpc.StatusCode.INTERNAL, grpc.StatusCode.UNKNOWN), code

        check()
    text = requests.get(f"{server.url}/metrics", timeout=10).text
    refusals = [
        sample.value
        for family in text_string_to_metric_families(text)
        if family.name == "autoglm_batcher_grpc_requests"
        for sample in family.samples
        if sample.name.endswith("_total") and sample.labels["code"] == "INVALID_ARGUMENT"
    ]
    assert sum(refusals) >= len(methods)  # each counted, as any refused call is
