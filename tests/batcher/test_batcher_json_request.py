"""JSON requests read through simdjson (batcher/json_request.py) decode as the general path does.

The fast reading copies an input's numbers straight into an array; everything it cannot carry
goes the general way (orjson, then a list, then numpy). Each request here is decoded both ways, the
general one forced by making the fast reader refuse every document, and must come out the same:
the same array bit for bit, or the same refusal in the same words.
"""

from __future__ import annotations

import json

import ml_dtypes
import numpy as np
import pytest

from batcher import oip
from batcher.model import TensorSpec

FAST = ["FP16", "BF16", "FP32", "FP64", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16"]
FAST += ["UINT32"]


def values(datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    dtype = oip.DATATYPES[datatype]
    rng = np.random.default_rng(11)
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        array = rng.integers(info.min, info.max, size=shape, dtype=dtype, endpoint=True)
        array.flat[0], array.flat[-1] = info.min, info.max
        return array
    array = (rng.normal(size=shape) * 1000).astype(dtype)
    array.flat[0] = 0.1
    return array


def body(data: object, datatype: str, shape: list[int]) -> bytes:
    tensor = {"name": "x", "shape": shape, "datatype": datatype, "data": data}
    return json.dumps({"inputs": [tensor], "id": "r1"}).encode()


def signature(datatype: str, width: int) -> tuple[tuple[TensorSpec, ...], tuple[TensorSpec, ...]]:
    return (TensorSpec("x", datatype, (width,)),), (TensorSpec("y", datatype, (width,)),)


def decode_both(request: bytes, datatype: str, width: int, monkeypatch) -> tuple[object, object]:
    """(fast, general): each the parsed request's input, or the ProtocolError's message."""
    inputs, outputs = signature(datatype, width)

    def attempt() -> object:
        try:
            return oip.parse_infer_request(request, None, inputs, outputs).inputs["x"]
        except oip.ProtocolError as exc:
            return str(exc)

    fast = attempt()
    with monkeypatch.context() as patched:

        def refuse(header: bytes) -> None:
            raise ValueError("the general path, for comparison")

        patched.setattr(oip, "read_document", refuse)
        general = attempt()
    return fast, general


def as_list(array: np.ndarray) -> list:
    if array.dtype == np.dtype(ml_dtypes.bfloat16):
        return array.astype(np.float64).tolist()
    return array.tolist()


@pytest.mark.parametrize("nested", [False, True], ids=["flat", "nested"])
@pytest.mark.parametrize("datatype", FAST)
def test_numbers_decode_bit_for_bit_as_the_general_path_and_never_as_a_list(
    datatype, nested, monkeypatch
) -> None:
    array = values(datatype, (3, 4))
    data = as_list(array) if nested else as_list(array.ravel())
    request = body(data, datatype, [3, 4])
    with monkeypatch.context() as patched:

        def refuse(*args, **kwargs):
            raise AssertionError("the numbers were read as a Python list")

        patched.setattr(oip, "decode_values", refuse)
        inputs, outputs = signature(datatype, 4)
        fast = oip.parse_infer_request(request, None, inputs, outputs).inputs["x"]
    assert fast.dtype == array.dtype and fast.shape == array.shape
    assert fast.tobytes() == array.tobytes()
    assert fast.flags.writeable  # the model may work in place
    _, general = decode_both(request, datatype, 4, monkeypatch)
    assert isinstance(general, np.ndarray) and general.tobytes() == fast.tobytes()


@pytest.mark.parametrize(
    ("data", "datatype", "shape"),
    [
        (["1.5", 2.0], "FP32", [1, 2]),  # a string
        ([True, 1.5], "FP32", [1, 2]),  # a boolean among floats: numpy's reading takes it
        ([None, 1.0], "FP32", [1, 2]),
        ([1, 2], "FP32", [1, 2]),  # integers for floats: fine
        ([1.5, 2], "INT32", [1, 2]),  # a fraction for integers
        ([1.0, 2], "INT32", [1, 2]),
        ([300, 2], "INT8", [1, 2]),  # out of range
        ([-1, 2], "UINT8", [1, 2]),
        ([1, 2, 3], "FP32", [1, 2]),  # the wrong count
        ([[1, 2], [3]], "FP32", [2, 2]),  # ragged with the wrong count
        ([2**63, 1], "INT64", [1, 2]),  # past int64
        ([2**64 - 1, 1], "UINT64", [1, 2]),  # read as a list: exact
        ([1e39, -1e39], "FP32", [1, 2]),  # infinity, as in torch
        ("12", "FP32", [1, 1]),
        ({"a": 1}, "FP32", [1, 1]),
        ([[1, 2]], "BOOL", [1, 2]),
    ],
)
def test_anything_else_is_accepted_or_refused_exactly_as_the_general_path_does(
    data, datatype, shape, monkeypatch
) -> None:
    fast, general = decode_both(body(data, datatype, shape), datatype, shape[1], monkeypatch)
    if isinstance(general, str):
        assert fast == general
    else:
        assert isinstance(fast, np.ndarray)
        assert fast.dtype == general.dtype and fast.tobytes() == general.tobytes()


@pytest.mark.parametrize(
    "raw",
    [
        b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [NaN, 1]}]}',
        b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}',
        b'[{"name": "x"}]',
        b'{"inputs": "x"}',
        b'{"inputs": [7]}',
        b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}], '
        b'"outputs": [{"name": "y", "parameters": {"binary_data": true}}], '
        b'"parameters": {"priority": 2, "timeout": 5000}}',
        # keys simdjson's lookup by name cuts short at the NUL (a 500 once, found by the fuzz)
        b'{"inputs": [{"\\u0000": null}]}',
        b'{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, 2], '
        b'"da\\u0000ta": 1}], "\\u0000": 2}',
    ],
    ids=[
        "nan-literal",
        "cut-off",
        "not-an-object",
        "inputs-not-a-list",
        "tensor-not-an-object",
        "outputs-and-parameters",
        "nul-key-alone",
        "nul-keys-beside-a-tensor",
    ],
)
def test_documents_read_the_same_either_way(raw, monkeypatch) -> None:
    inputs, outputs = signature("FP32", 2)

    def parsed() -> object:
        try:
            request = oip.parse_infer_request(raw, None, inputs, outputs)
        except oip.ProtocolError as exc:
            return str(exc)
        return (
            request.inputs["x"].tobytes(),
            request.outputs,
            request.binary_outputs,
            request.priority,
            request.timeout_seconds,
        )

    fast = parsed()
    with monkeypatch.context() as patched:
        patched.setattr(oip, "read_document", lambda header: (_ for _ in ()).throw(ValueError()))
        assert parsed() == fast


def test_irregular_nesting_with_the_right_count_is_read_in_row_major_order() -> None:
    inputs, outputs = signature("FP32", 2)
    request = body([[1, 2, 3], [4]], "FP32", [2, 2])
    parsed = oip.parse_infer_request(request, None, inputs, outputs)
    assert parsed.inputs["x"].tolist() == [[1.0, 2.0], [3.0, 4.0]]


@pytest.mark.parametrize(
    "raw",
    [b"[" * 100_000, b'{"inputs": ' + b"[" * 5_000 + b"]" * 5_000 + b"}"],
    ids=["unclosed", "closed"],
)
def test_a_document_nested_past_every_parsers_depth_is_a_clear_refusal(raw) -> None:
    inputs, outputs = signature("FP32", 2)
    with pytest.raises(oip.ProtocolError):  # a 400 with the reason, not a 500
        oip.parse_infer_request(raw, None, inputs, outputs)
