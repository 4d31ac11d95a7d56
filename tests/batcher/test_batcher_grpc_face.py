"""The front workers' gRPC pieces: codes as the engine's own face gives them, frames that fit."""

from __future__ import annotations

import grpc
import pytest

from batcher import errors, oip
from batcher.forwarding import Signature, engine_request, frame, request_frame_limit
from batcher.grpc_face import (
    FORWARDED_METHODS,
    code_for_status,
    decode_infer_request,
    message_type,
)
from batcher.grpc_server import _CODES, code_for
from batcher.open_inference import predict_v2_pb2 as pb
from batcher.server import http_status
from batcher.tensor_spec import TensorSpec


@pytest.mark.parametrize("kind", [kind for kind, _ in _CODES] + [errors.BatcherError])
def test_a_refusal_gets_the_same_code_through_the_workers(kind: type) -> None:
    error = kind.__new__(kind)  # the type is what decides; no message needed
    assert code_for_status(http_status(error)) == code_for(error)


def test_an_answer_the_workers_do_not_know_is_internal() -> None:
    assert code_for_status(200) == grpc.StatusCode.OK
    assert code_for_status(500) == grpc.StatusCode.INTERNAL
    assert code_for_status(418) == grpc.StatusCode.INTERNAL


def test_every_forwarded_method_has_its_messages() -> None:
    for method in FORWARDED_METHODS:
        assert message_type(method, "input").__name__ == f"{method}Request"
        assert message_type(method, "output").__name__ == f"{method}Response"


@pytest.mark.parametrize("datatype", ["INT64", "UINT64", "INT32", "FP64", "BOOL", "BYTES"])
def test_the_binary_form_of_typed_contents_fits_the_engines_frame_limit(datatype: str) -> None:
    """A worker forwards a gRPC request in binary form; the engine's channel limit holds the
    densest typed contents the message limit allows (a one-byte varint becomes 8 bytes)."""
    field = {
        "INT64": "int64_contents",
        "UINT64": "uint64_contents",
        "INT32": "int_contents",
        "FP64": "fp64_contents",
        "BOOL": "bool_contents",
        "BYTES": "bytes_contents",
    }[datatype]
    value = {"BOOL": False, "BYTES": b""}.get(datatype, 0)
    spec = TensorSpec("v", datatype, (-1,))
    count = 1_000_000  # past the allowance: the growth decides
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="v", datatype=datatype, shape=[1, count])
    getattr(tensor.contents, field).extend([value] * count)
    message = request.SerializeToString()
    decoded = decode_infer_request(request, (spec,), (spec,))
    metadata = oip.model_metadata("m", (spec,), (spec,))
    payload, header_length = engine_request(decoded, Signature.from_metadata(metadata))
    envelope = {"model": "m", "version": "1", "signature": "0" * 16, "header_length": header_length}
    assert len(frame(1, envelope, payload)) <= request_frame_limit(len(message))
