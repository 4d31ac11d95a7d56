"""The KServe v2 codec round trip for every datatype, JSON and binary, both ways.

A request built the way a client builds it (JSON ``data`` from ``tolist()``, or the binary tensor
data extension's little-endian bytes) must decode to the very array the client held, and an
answer must read back, by the client's own rules, to the very array the model produced. The
binary extension must not touch JSON number decoding at all, in either direction.
"""

from __future__ import annotations

import json
import warnings

import ml_dtypes
import numpy as np
import pytest

from batcher import oip
from batcher.model import TensorSpec

NUMERIC = [name for name in oip.DATATYPES if name != "BYTES"]


def sample(datatype: str, shape: tuple[int, ...] = (3, 4)) -> np.ndarray:
    """Values spread over the datatype's range, extremes included where they are exact."""
    dtype = oip.DATATYPES[datatype]
    rng = np.random.default_rng(7)
    if datatype == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        values = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        values.flat[0], values.flat[1] = info.min, info.max
        return values
    values = (rng.normal(size=shape) * 1000).astype(dtype)
    values.flat[0] = 0.1  # not exact in any binary float: its shortest form must read back
    return values


def specs(datatype: str) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    return (TensorSpec("x", datatype, (4,)),), (TensorSpec("y", datatype, (4,)),)


def little_endian_bytes(array: np.ndarray) -> bytes:
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        return array.view(np.uint16).astype("<u2").tobytes()
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def json_request(array: np.ndarray, datatype: str, binary_output: bool) -> bytes:
    data = array.astype(np.float64).tolist() if datatype == "BF16" else array.tolist()
    tensor = {"name": "x", "shape": list(array.shape), "datatype": datatype, "data": data}
    return json.dumps(
        {"inputs": [tensor], "parameters": {"binary_data_output": binary_output}}
    ).encode()


def binary_request(array: np.ndarray, datatype: str) -> tuple[bytes, str]:
    raw = little_endian_bytes(array)
    tensor = {
        "name": "x",
        "shape": list(array.shape),
        "datatype": datatype,
        "parameters": {"binary_data_size": len(raw)},
    }
    header = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
    return header + raw, str(len(header))


def read_answer(body: bytes, header_length: int | None, datatype: str) -> np.ndarray:
    """The output as tritonclient reads it: JSON numbers, or the raw little-endian buffer."""
    header = json.loads(body[:header_length] if header_length else body)
    (output,) = header["outputs"]
    assert output["datatype"] == datatype
    dtype = oip.DATATYPES[datatype]
    if header_length is None:  # integers exactly (numpy would read uint64s past int64 as floats)
        exact = object if dtype.kind in "iu" else np.float64 if datatype == "BF16" else None
        data = np.asarray(output["data"], dtype=exact)
        return data.astype(dtype).reshape(output["shape"])
    raw = body[header_length:]
    assert len(raw) == output["parameters"]["binary_data_size"]
    if datatype == "BF16":
        return np.frombuffer(raw, dtype="<u2").view(dtype).reshape(output["shape"])
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(output["shape"])


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()  # bit for bit: no rounding anywhere on the way


@pytest.mark.parametrize("datatype", NUMERIC)
def test_json_input_decodes_to_the_clients_array(datatype) -> None:
    array = sample(datatype)
    inputs, outputs = specs(datatype)
    parsed = oip.parse_infer_request(json_request(array, datatype, False), None, inputs, outputs)
    assert parsed.size == 3
    assert_same(parsed.inputs["x"], array)


@pytest.mark.parametrize("datatype", NUMERIC)
def test_binary_input_decodes_to_the_clients_array(datatype) -> None:
    array = sample(datatype)
    inputs, outputs = specs(datatype)
    body, header_length = binary_request(array, datatype)
    parsed = oip.parse_infer_request(body, header_length, inputs, outputs)
    assert_same(parsed.inputs["x"], array)
    assert parsed.inputs["x"].flags.writeable  # the model may work in place


@pytest.mark.parametrize("binary_output", [False, True], ids=["json-out", "binary-out"])
@pytest.mark.parametrize("datatype", NUMERIC)
def test_answers_read_back_to_the_models_array(datatype, binary_output) -> None:
    array = sample(datatype)
    inputs, outputs = specs(datatype)
    parsed = oip.parse_infer_request(
        json_request(array, datatype, binary_output), None, inputs, outputs
    )
    body, header_length = oip.encode_infer_response("m", parsed, {"y": array})
    assert (header_length is not None) == binary_output
    assert_same(read_answer(body, header_length, datatype), array)


def test_bytes_round_trip_json_and_binary_keep_every_byte() -> None:
    words = np.empty((2, 2), dtype=object)
    words[:] = [[b"a\x00", b""], ["héllo".encode(), b"\xff\xfe"]]
    inputs, outputs = specs("BYTES")
    inputs = (TensorSpec("x", "BYTES", (2,)),)
    outputs = (TensorSpec("y", "BYTES", (2,)),)
    raw = oip.encode_bytes_elements(list(words.ravel()))
    tensor = {
        "name": "x",
        "shape": [2, 2],
        "datatype": "BYTES",
        "parameters": {"binary_data_size": len(raw)},
    }
    header = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
    parsed = oip.parse_infer_request(header + raw, str(len(header)), inputs, outputs)
    assert parsed.inputs["x"].tolist() == words.tolist()
    body, length = oip.encode_infer_response("m", parsed, {"y": words})
    assert length is not None
    answer = oip.decode_bytes_elements(body[length:], "y", [2, 2])
    assert answer.tolist() == words.tolist()


def test_binary_requests_and_answers_never_decode_or_encode_json_numbers(monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise AssertionError("JSON number path used for binary data")

    monkeypatch.setattr(oip, "decode_values", refuse)
    monkeypatch.setattr(oip, "_json_output", refuse)
    array = sample("FP32")
    inputs, outputs = specs("FP32")
    body, header_length = binary_request(array, "FP32")
    parsed = oip.parse_infer_request(body, header_length, inputs, outputs)
    answer, length = oip.encode_infer_response("m", parsed, {"y": array})
    assert_same(read_answer(answer, length, "FP32"), array)


@pytest.mark.parametrize("datatype", ["FP16", "BF16", "FP32"])
def test_json_floats_out_of_range_become_infinity_without_a_warning(datatype) -> None:
    inputs, outputs = specs(datatype)
    tensor = {"name": "x", "shape": [1, 4], "datatype": datatype, "data": [1e300, -1e300, 1, 2]}
    body = json.dumps({"inputs": [tensor]}).encode()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        parsed = oip.parse_infer_request(body, None, inputs, outputs)
    assert np.isinf(parsed.inputs["x"][0, :2]).all()


@pytest.mark.parametrize("request_id", [None, "null-and-void"])
def test_non_finite_answers_are_written_as_nan_and_infinity_whatever_the_id(request_id) -> None:
    inputs, outputs = specs("FP32")
    document: dict = {
        "inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [0] * 4}]
    }
    if request_id is not None:
        document["id"] = request_id
    parsed = oip.parse_infer_request(json.dumps(document).encode(), None, inputs, outputs)
    finite = np.array([[1.5, 2, 3, 4]], dtype=np.float32)
    body, _ = oip.encode_infer_response("m", parsed, {"y": finite})
    assert json.loads(body)["outputs"][0]["data"] == [1.5, 2, 3, 4]
    assert json.loads(body).get("id") == request_id
    odd = np.array([[np.nan, np.inf, -np.inf, 1]], dtype=np.float32)
    body, _ = oip.encode_infer_response("m", parsed, {"y": odd})
    assert b"NaN" in body and b"-Infinity" in body and b"null" not in body.replace(b"null-", b"")


@pytest.mark.parametrize(
    ("data", "reason"),
    [
        ([1.5, 2**64 - 1], "must be integers"),
        ([-1, 2**64 - 1], "must be integers"),
        ([-1, 5], "outside the UINT64 range"),
        ([2**64, 1], "must be integers"),
    ],
)
def test_uint64_json_past_int64_is_exact_and_anything_else_still_refused(data, reason) -> None:
    inputs, outputs = (TensorSpec("x", "UINT64", (2,)),), (TensorSpec("y", "UINT64", (2,)),)
    tensor = {"name": "x", "shape": [1, 2], "datatype": "UINT64"}
    good = json.dumps({"inputs": [{**tensor, "data": [2**64 - 1, 2**63]}]}).encode()
    parsed = oip.parse_infer_request(good, None, inputs, outputs)
    assert parsed.inputs["x"].tolist() == [[2**64 - 1, 2**63]]
    bad = json.dumps({"inputs": [{**tensor, "data": data}]}).encode()
    with pytest.raises(oip.ProtocolError, match=reason):
        oip.parse_infer_request(bad, None, inputs, outputs)
