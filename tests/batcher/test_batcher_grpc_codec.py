"""gRPC's typed ``contents`` decoded without a server: every numeric field read exactly into the
array the model gets, checked as the JSON path checks numbers, and never through a Python list.

The requests are built with tritonclient's own protobuf messages and parsed by the server's, as
they travel over the wire.
"""

from __future__ import annotations

import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from batcher import grpc_server, oip
from batcher.model import TensorSpec
from batcher.open_inference import predict_v2_pb2 as pb

# datatype -> its typed-contents field and the values at the edges of its range
TYPED = {
    "BOOL": ("bool_contents", [True, False, True, False, False, True]),
    "INT8": ("int_contents", [-128, 0, 127, 1, 127, -128]),
    "INT16": ("int_contents", [-32768, 0, 32767, 1, 32767, -32768]),
    "INT32": ("int_contents", [-(2**31), 0, 2**31 - 1, 1, 2**31 - 1, -(2**31)]),
    "INT64": ("int64_contents", [-(2**63), 0, 2**63 - 1, 1, 2**63 - 1, -(2**63)]),
    "UINT8": ("uint_contents", [0, 1, 255, 255, 0, 7]),
    "UINT16": ("uint_contents", [0, 1, 65535, 65535, 0, 7]),
    "UINT32": ("uint_contents", [0, 1, 2**32 - 1, 2**32 - 1, 0, 7]),
    "UINT64": ("uint64_contents", [0, 1, 2**64 - 1, 2**63 + 1, 0, 7]),
    "FP32": ("fp32_contents", [0.1, -2.5, 3.4028234663852886e38, 1e-45, -0.0, 7.0]),
    "FP64": ("fp64_contents", [0.1, -2.5, 1.7976931348623157e308, 5e-324, -0.0, 7.0]),
}


def signature(datatype: str) -> tuple[list[TensorSpec], list[TensorSpec]]:
    return [TensorSpec("x", datatype, (3,))], [TensorSpec("y", datatype, (3,))]


def typed_request(datatype: str, field: str, values: list) -> pb.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="x", datatype=datatype, shape=[2, 3])
    getattr(tensor.contents, field).extend(values)
    return pb.ModelInferRequest.FromString(request.SerializeToString())


@pytest.mark.parametrize("datatype", sorted(TYPED))
def test_typed_contents_reach_the_model_exactly_in_its_dtype(datatype: str) -> None:
    field, values = TYPED[datatype]
    parsed = grpc_server.decode_infer_request(
        typed_request(datatype, field, values), *signature(datatype)
    )
    array = parsed.inputs["x"]
    expected = np.array(values, dtype=oip.DATATYPES[datatype]).reshape(2, 3)
    assert array.dtype == oip.DATATYPES[datatype]
    assert array.shape == (2, 3)
    assert array.tobytes() == expected.tobytes()  # bit for bit: -0.0, subnormals, 2**64 - 1
    assert parsed.size == 2


@pytest.mark.parametrize(
    ("datatype", "field", "value", "reason"),
    [
        ("INT8", "int_contents", 128, "outside the INT8 range -128..127"),
        ("UINT16", "uint_contents", 65536, "outside the UINT16 range 0..65535"),
        ("INT16", "int_contents", -32769, "outside the INT16 range -32768..32767"),
    ],
)
def test_a_typed_value_outside_the_datatype_is_refused_as_json_would_be(
    datatype: str, field: str, value: int, reason: str
) -> None:
    request = typed_request(datatype, field, [0, 0, 0, 0, 0, value])
    with pytest.raises(oip.ProtocolError, match=reason):
        grpc_server.decode_infer_request(request, *signature(datatype))


def test_typed_contents_of_the_wrong_count_name_the_shape() -> None:
    request = typed_request("FP32", "fp32_contents", [1.0, 2.0, 3.0, 4.0, 5.0])
    with pytest.raises(oip.ProtocolError, match=r"data has 5 values but shape \[2, 3\] needs 6"):
        grpc_server.decode_infer_request(request, *signature("FP32"))


def test_typed_contents_never_become_a_list_of_python_numbers(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("typed contents went through the JSON number path")

    monkeypatch.setattr(oip, "decode_values", refuse)
    field, values = TYPED["FP32"]
    parsed = grpc_server.decode_infer_request(
        typed_request("FP32", field, values), *signature("FP32")
    )
    assert parsed.inputs["x"].ravel().tolist() == np.array(values, np.float32).tolist()
