"""The JSON codec's fast path (orjson) keeps the protocol's meaning where orjson alone would not.

orjson writes NaN and infinities as null and refuses NaN literals and integers past 64 bits; the
codec falls back to the standard library there, so answers and requests mean what they meant.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from batcher import oip
from batcher.model import TensorSpec

FP32_IN = (TensorSpec("x", "FP32", (2,)),)
FP32_OUT = (TensorSpec("y", "FP32", (2,)),)


def answer(values: np.ndarray) -> dict:
    request = oip.parse_infer_request(
        json.dumps(
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [0, 0]}]}
        ).encode(),
        None,
        FP32_IN,
        FP32_OUT,
    )
    body, header_length = oip.encode_infer_response("m", request, {"y": values})
    assert header_length is None
    return json.loads(body)  # the standard library reads NaN and Infinity, as Triton's clients do


def test_float32_answers_round_trip_to_the_same_float32() -> None:
    values = np.array([[0.1, -1 / 3]], dtype=np.float32)
    data = answer(values)["outputs"][0]["data"]
    assert np.array(data, dtype=np.float32).tolist() == values.ravel().tolist()


def test_non_finite_answers_are_written_as_nan_and_infinity_not_null() -> None:
    data = answer(np.array([[np.nan, np.inf]], dtype=np.float32))["outputs"][0]["data"]
    assert np.isnan(data[0]) and data[1] == float("inf")


@pytest.mark.parametrize("literal", ["NaN", "Infinity"])
def test_requests_with_nan_or_infinity_literals_still_parse(literal) -> None:
    body = (
        '{"inputs": [{"name": "x", "shape": [1, 2], "datatype": "FP32", "data": [1, '
        + literal
        + "]}]}"
    ).encode()
    parsed = oip.parse_infer_request(body, None, FP32_IN, FP32_OUT)
    assert not np.isfinite(parsed.inputs["x"][0, 1])


def test_invalid_json_is_still_a_protocol_error_with_the_position() -> None:
    with pytest.raises(oip.ProtocolError, match=r"not valid JSON: .*column"):
        oip.parse_infer_request(b'{"inputs": [', None, FP32_IN, FP32_OUT)
