"""Open Inference Protocol (KServe v2) over HTTP: decoding and checking requests, encoding answers.

The protocol is the one Triton and KServe speak, so their clients (``tritonclient.http``, ``curl``
with JSON, perf_analyzer) work unchanged. Both tensor encodings are handled: JSON ``data`` (flat
or nested, row-major) and the binary tensor data extension (a JSON header of
``Inference-Header-Content-Length`` bytes followed by raw little-endian buffers, each input
announcing its ``binary_data_size``). Request parameters follow Triton's schedule-policy extension:
``priority`` (1 highest, 0 default; ``"best-effort"`` or a level from ``--best-effort-priority``
up marks a best-effort request, ``"online"`` the default level) and ``timeout`` in microseconds.

Every KServe v2 datatype is carried, and what the model sees is chosen so text and bfloat16 models
need no protocol code of their own:

* ``BYTES`` (strings: the input of a model with its tokenizer inside): JSON ``data`` holds strings,
  sent to the model as their UTF-8 bytes; in binary, each element is a 4-byte little-endian length
  followed by that many bytes. The model receives a numpy **object array of ``bytes``** (numpy's
  fixed-width ``S`` dtype would drop trailing NUL bytes). A model may answer with ``str`` or
  ``bytes`` elements (object, ``U`` or ``S`` arrays); JSON answers carry them as strings, so bytes
  that are not UTF-8 need the binary extension.
* ``BF16``: numpy has no bfloat16, so arrays use ``ml_dtypes.bfloat16``, the numpy dtype JAX,
  TensorFlow and Triton's own Python client use. It keeps the 16 bits exact (a float32 stand-in
  would silently turn BF16 answers into FP32 ones) and ``astype(np.float32)`` is lossless. Torch
  modules get ``torch.bfloat16`` tensors (:mod:`batcher.model` converts both ways). In JSON, BF16
  values are numbers, rounded to the nearest bfloat16.

Everything is checked before the request reaches the model: a malformed request raises
:class:`ProtocolError` whose message names the problem and the fix, answered with HTTP 400.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import orjson

from batcher.json_request import BufferKind, as_python, flat_numbers, is_lazy, read_document
from batcher.tensor_spec import TensorSpec

DATATYPES: dict[str, np.dtype] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BYTES": np.dtype(np.object_),
}
_BY_DTYPE = {dtype: name for name, dtype in DATATYPES.items()}
# Datatypes whose JSON numbers are read straight into a buffer (doubles or int64s), then cast and
# range-checked as any list is: a JSON double holds every FP16, BF16 and FP32 value exactly. Not
# UINT64 (past the int64 range), BOOL or BYTES: those are read as lists.
_BUFFER_KINDS: dict[str, BufferKind] = {
    **dict.fromkeys(("FP16", "BF16", "FP32", "FP64"), "d"),
    **dict.fromkeys(("INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32"), "i"),
}
_TEXT_KINDS = "OSU"  # object, bytes and str arrays all travel as BYTES
_ELEMENT_LENGTH = struct.Struct("<I")  # the length before each BYTES element in binary data
HEADER_LENGTH = "Inference-Header-Content-Length"
_LARGEST_ARRAY_BYTES = int(np.iinfo(np.intp).max)
MICROSECONDS = 1e-6
LIVE_PATH = "/v2/health/live"
READY_PATH = "/v2/health/ready"
# Open without credentials, as the exporter's /healthz is: a kubelet probe carries none, and
# they say only whether the server is up and ready.
HEALTH_PATHS = (LIVE_PATH, READY_PATH)
SIMDJSON_DEPTH_ERROR = "DEPTH_ERROR"  # how simdjson's error for a too-deep document starts
TOO_DEEP = (
    "request body is nested too deeply to read; a tensor's data needs one level per dimension"
)


class ProtocolError(ValueError):
    """A request that does not follow the protocol or the model's signature (HTTP 400)."""


@dataclass(frozen=True)
class InferRequest:
    """A validated inference request: inputs as arrays with a shared first (batch) dimension."""

    id: str | None
    inputs: dict[str, np.ndarray]
    size: int
    priority: int | str
    timeout_seconds: float | None
    outputs: tuple[str, ...]
    binary_outputs: frozenset[str]


def datatype_of(array: np.ndarray) -> str:
    """The protocol's name for an array's dtype (str, bytes and object arrays are BYTES)."""
    if array.dtype.kind in _TEXT_KINDS:
        return "BYTES"
    name = _BY_DTYPE.get(array.dtype.newbyteorder("="))
    if name is None:
        raise ProtocolError(f"the model produced dtype {array.dtype}, which KServe v2 cannot carry")
    return name


def parse_infer_request(
    body: bytes,
    header_length: str | None,
    inputs: Sequence[TensorSpec],
    outputs: Sequence[TensorSpec],
) -> InferRequest:
    """Decode and validate ``body`` against the model's signature."""
    header, binary = _split_body(body, header_length)
    document = _read_request(header)
    if not isinstance(document, dict):
        raise ProtocolError('request body must be a JSON object with an "inputs" list')
    parameters = _object(document.get("parameters", {}), "parameters")
    raw_inputs = document.get("inputs")
    if not isinstance(raw_inputs, list) or not raw_inputs:
        raise ProtocolError('request needs a non-empty "inputs" list')
    specs = {spec.name: spec for spec in inputs}
    decoded: dict[str, np.ndarray] = {}
    offset = 0
    for index, raw in enumerate(raw_inputs):
        tensor = _object(raw, f"inputs[{index}]")
        name = tensor.get("name")
        if not isinstance(name, str):
            raise ProtocolError(f'inputs[{index}] needs a string "name"')
        if name in decoded:
            raise ProtocolError(f"input {name!r} is given twice")
        spec = specs.get(name)
        if spec is None:
            raise ProtocolError(f"unknown input {name!r}; the model takes: {', '.join(specs)}")
        array, offset = _decode_tensor(tensor, spec, binary, offset)
        decoded[name] = array
    if offset != len(binary):
        raise ProtocolError(
            f"{len(binary) - offset} bytes of binary data follow the header but no input claims "
            "them; check each input's binary_data_size"
        )
    missing = [name for name in specs if name not in decoded]
    if missing:
        raise ProtocolError(f"missing input {missing[0]!r}; the model takes: {', '.join(specs)}")
    sizes = {name: array.shape[0] for name, array in decoded.items()}
    if len(set(sizes.values())) != 1:
        raise ProtocolError(f"inputs disagree on the batch dimension (first shape entry): {sizes}")
    size = next(iter(sizes.values()))
    if size < 1:
        raise ProtocolError("the batch dimension (first shape entry) must be at least 1")
    requested, binary_outputs = _requested_outputs(document, parameters, outputs)
    return InferRequest(
        id=_request_id(document),
        inputs=decoded,
        size=size,
        priority=request_priority(parameters),
        timeout_seconds=request_timeout(parameters),
        outputs=requested,
        binary_outputs=binary_outputs,
    )


def encode_infer_response(
    model_name: str, request: InferRequest, result: dict[str, np.ndarray]
) -> tuple[bytes, int | None]:
    """The response body and, when binary outputs were asked for, the JSON header's length."""
    tensors = []
    buffers: list[bytes] = []
    for name in request.outputs:
        if name not in result:
            raise ProtocolError(f"the model did not produce output {name!r}")
        array = np.ascontiguousarray(result[name])
        datatype = datatype_of(array)
        entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if name in request.binary_outputs:
            raw = encode_binary_output(name, datatype, array)
            entry["parameters"] = {"binary_data_size": len(raw)}
            buffers.append(raw)
        else:
            entry["data"] = _json_output(name, datatype, array)
        tensors.append(entry)
    document: dict[str, Any] = {"model_name": model_name, "model_version": "1", "outputs": tensors}
    if request.id is not None:
        document["id"] = request.id
    header = _dumps(document, tensors)
    if not buffers:
        return header, None
    return header + b"".join(buffers), len(header)


def encode_bytes_elements(elements: Sequence[bytes]) -> bytes:
    """BYTES elements in the binary extension's layout: each a 4-byte LE length, then the bytes."""
    return b"".join(_ELEMENT_LENGTH.pack(len(item)) + item for item in elements)


def decode_bytes_elements(raw: bytes, name: str, shape: Sequence[int]) -> np.ndarray:
    """The object array of ``bytes`` that ``raw`` (length-prefixed elements) holds, in ``shape``.

    Raises :class:`ProtocolError` when a length prefix is cut off or runs past the buffer, or when
    the element count does not match the shape.
    """
    count = math.prod(shape)
    items: list[bytes] = []
    position = 0
    while position < len(raw):
        if len(items) == count:  # stop here: a flood of empty elements costs no more than this
            raise ProtocolError(
                f"input {name!r}: binary data holds more than the {count} BYTES elements shape "
                f"{list(shape)} needs; check binary_data_size"
            )
        if position + _ELEMENT_LENGTH.size > len(raw):
            raise ProtocolError(
                f"input {name!r}: binary data ends inside the 4-byte length of BYTES element "
                f"{len(items)}; check binary_data_size"
            )
        (length,) = _ELEMENT_LENGTH.unpack_from(raw, position)
        position += _ELEMENT_LENGTH.size
        if position + length > len(raw):
            raise ProtocolError(
                f"input {name!r}: BYTES element {len(items)} announces {length} bytes but only "
                f"{len(raw) - position} remain in its binary_data_size"
            )
        items.append(raw[position : position + length])
        position += length
    if len(items) != count:
        raise ProtocolError(
            f"input {name!r}: binary data holds {len(items)} BYTES elements but shape "
            f"{list(shape)} needs {count}"
        )
    return _object_array(items, shape)


def error_body(message: str) -> bytes:
    """The protocol's error object."""
    return json.dumps({"error": message}).encode()


def model_metadata(name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec]) -> dict:
    """``GET /v2/models/{name}``."""
    return {
        "name": name,
        "versions": ["1"],
        "platform": "pytorch",
        "inputs": [spec.metadata() for spec in inputs],
        "outputs": [spec.metadata() for spec in outputs],
    }


def server_metadata(version: str) -> dict:
    """``GET /v2``."""
    return {
        "name": "autoglm-batcher",
        "version": version,
        "extensions": ["binary_tensor_data", "schedule_policy", "model_repository"],
    }


# --- decoding helpers ---------------------------------------------------------------------------


def _split_body(body: bytes, header_length: str | None) -> tuple[bytes, bytes]:
    if header_length is None:
        return body, b""
    try:
        length = int(header_length)
    except ValueError:
        raise ProtocolError(
            f"{HEADER_LENGTH} must be an integer byte count, got {header_length!r}"
        ) from None
    if not 0 < length <= len(body):
        raise ProtocolError(f"{HEADER_LENGTH} is {length} but the body has {len(body)} bytes")
    return body[:length], body[length:]


def _object(value: Any, where: str) -> dict:
    if not isinstance(value, dict):
        raise ProtocolError(f"{where} must be a JSON object")
    return value


def _decode_tensor(
    tensor: dict, spec: TensorSpec, binary: bytes, offset: int
) -> tuple[np.ndarray, int]:
    name = spec.name
    datatype = tensor.get("datatype")
    dtype, shape, count = check_tensor(spec, datatype, tensor.get("shape"))
    params = _object(tensor.get("parameters", {}), f"input {name!r} parameters")
    if "binary_data_size" in params:
        size = params["binary_data_size"]
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise ProtocolError(f"input {name!r}: binary_data_size must be a byte count")
        if spec.datatype != "BYTES" and size != count * dtype.itemsize:
            raise ProtocolError(
                f"input {name!r}: binary_data_size is {size} but shape {shape} of {datatype} "
                f"needs {count * dtype.itemsize} bytes"
            )
        if offset + size > len(binary):
            raise ProtocolError(
                f"input {name!r}: binary data ends after {len(binary) - offset} of {size} bytes"
            )
        raw = binary[offset : offset + size]
        return decode_binary_data(raw, name, spec.datatype, dtype, shape), offset + size
    if "data" not in tensor:
        raise ProtocolError(f'input {name!r} has neither "data" nor binary_data_size')
    data = tensor["data"]
    if is_lazy(data):
        kind = _BUFFER_KINDS.get(spec.datatype)
        numbers = flat_numbers(data, count, kind) if kind else None
        if numbers is not None:
            return cast_values(numbers, name, spec.datatype, dtype, shape, count), offset
        data = as_python(data)  # not all numbers of the kind, another count, or a list type
    if spec.datatype == "BYTES":
        return _decode_json_strings(data, name, shape, count), offset
    return decode_values(data, name, spec.datatype, dtype, shape, count), offset


def check_tensor(
    spec: TensorSpec, datatype: object, shape: object
) -> tuple[np.dtype, list[int], int]:
    """The dtype, shape and element count of an input whose ``datatype`` and ``shape`` (batch first)
    fit ``spec``; :class:`ProtocolError` naming the mismatch otherwise. Shared by the HTTP and
    gRPC faces, so both refuse the same requests with the same words."""
    name = spec.name
    if datatype != spec.datatype:
        raise ProtocolError(
            f"input {name!r} has datatype {datatype!r}; the model expects {spec.datatype}"
        )
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ProtocolError(f"input {name!r}: shape must be a list of non-negative integers")
    expected = [-1, *spec.shape]
    if len(shape) != len(expected) or any(
        want not in (-1, got) for want, got in zip(expected, shape, strict=True)
    ):
        raise ProtocolError(
            f"input {name!r} has shape {shape}; the model expects {expected} "
            "(-1: any size; the first entry is the batch dimension)"
        )
    dtype = DATATYPES[spec.datatype]
    # numpy refuses such a shape even with a zero in it: its other entries alone overflow.
    if math.prod(d or 1 for d in shape) * dtype.itemsize > _LARGEST_ARRAY_BYTES:
        raise ProtocolError(
            f"input {name!r}: shape {shape} is larger than any array can be; check the shape"
        )
    return dtype, shape, math.prod(shape)


def decode_binary_data(
    raw: bytes, name: str, datatype: str, dtype: np.dtype, shape: list[int]
) -> np.ndarray:
    """The array ``raw`` holds: row-major little-endian elements, or length-prefixed BYTES."""
    if datatype == "BYTES":
        return decode_bytes_elements(raw, name, shape)
    if datatype == "BF16":
        return np.frombuffer(raw, dtype="<u2").astype(np.uint16).view(dtype).reshape(shape)
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _decode_json_strings(data: Any, name: str, shape: list[int], count: int) -> np.ndarray:
    if not isinstance(data, list):
        raise ProtocolError(f'input {name!r}: "data" must be a list of strings for BYTES')
    try:
        loose = np.array(data, dtype=object)
    except ValueError:
        loose = None
    # numpy keeps ragged nesting as lists inside an object array (or refuses it outright)
    if loose is None or any(isinstance(item, list) for item in loose.ravel()):
        raise ProtocolError(
            f"input {name!r}: data is ragged; nested lists must all have the same length"
        )
    if loose.size != count:
        raise ProtocolError(
            f"input {name!r}: data has {loose.size} values but shape {shape} needs {count}"
        )
    items = []
    for position, item in enumerate(loose.ravel()):
        if not isinstance(item, str):
            raise ProtocolError(
                f"input {name!r}: BYTES data must be strings; element {position} is "
                f"{type(item).__name__} {item!r}"
            )
        try:
            items.append(item.encode("utf-8"))
        except UnicodeEncodeError:
            raise ProtocolError(
                f"input {name!r}: element {position} is not valid Unicode (a lone surrogate); "
                "send raw bytes with the binary extension"
            ) from None
    return _object_array(items, shape)


def _object_array(items: list[bytes], shape: Sequence[int]) -> np.ndarray:
    # Filled element by element: np.array(items) would give the NUL-stripping ``S`` dtype.
    array = np.empty(len(items), dtype=object)
    array[:] = items
    return array.reshape(shape)


def decode_values(
    data: Any, name: str, datatype: str, dtype: np.dtype, shape: list[int], count: int
) -> np.ndarray:
    """The array a list of numbers or booleans (nested or flat) makes, checked against the
    datatype's kind and range."""
    if not isinstance(data, list):
        raise ProtocolError(f'input {name!r}: "data" must be a list of {datatype} values')
    try:
        loose = np.asarray(data)
    except ValueError:
        raise ProtocolError(
            f"input {name!r}: data is ragged; nested lists must all have the same length"
        ) from None
    if loose.dtype.kind == "f" and datatype == "UINT64":
        loose = _unsigned_64(loose, data)  # numpy made floats of ints past int64
    return cast_values(loose, name, datatype, dtype, shape, count)


def cast_values(
    loose: np.ndarray, name: str, datatype: str, dtype: np.dtype, shape: list[int], count: int
) -> np.ndarray:
    """``loose`` (numbers or booleans as read) as ``datatype`` in ``shape``, checked against the
    datatype's kind and range: what :func:`decode_values` does once it has an array, and what
    gRPC's typed contents need (read straight into an array of their field's type)."""
    if loose.size != count:
        raise ProtocolError(
            f"input {name!r}: data has {loose.size} values but shape {shape} needs {count}"
        )
    if count == 0:
        return np.zeros(shape, dtype=dtype)
    kind = loose.dtype.kind
    if datatype == "BOOL":
        if kind != "b":
            raise ProtocolError(f"input {name!r}: BOOL data must be true/false values")
    elif dtype.kind in "iu":
        if kind not in "iu":
            raise ProtocolError(f"input {name!r}: {datatype} data must be integers")
        info = np.iinfo(dtype)
        if int(loose.min()) < info.min or int(loose.max()) > info.max:
            raise ProtocolError(
                f"input {name!r}: a value is outside the {datatype} range {info.min}..{info.max}"
            )
    elif kind not in "iuf":
        raise ProtocolError(f"input {name!r}: {datatype} data must be numbers")
    if dtype.kind not in "iub" and loose.dtype != dtype:  # floats narrowing (bfloat16: "V")
        with np.errstate(over="ignore"):  # beyond the range is infinity, as in torch
            return loose.astype(dtype).reshape(shape)
    return loose.astype(dtype, copy=False).reshape(shape)


def _unsigned_64(loose: np.ndarray, data: list) -> np.ndarray:
    """``data`` as uint64 when every value is a JSON integer (numpy reads a list holding one past
    the int64 range as float64, losing digits); ``loose`` unchanged when any value is not."""
    exact = np.array(data, dtype=object).ravel()
    if not all(type(value) is int and 0 <= value < 1 << 64 for value in exact):
        return loose
    return exact.astype(np.uint64).reshape(loose.shape)


# --- encoding helpers ---------------------------------------------------------------------------


def encode_binary_output(name: str, datatype: str, array: np.ndarray) -> bytes:
    """An output in the binary layout: row-major little-endian, or length-prefixed BYTES."""
    if datatype == "BYTES":
        return encode_bytes_elements(_output_bytes(name, array))
    if datatype == "BF16":
        return array.view(np.uint16).astype("<u2", copy=False).tobytes()
    return array.astype(array.dtype.newbyteorder("<"), copy=False).tobytes()


def _read_request(header: bytes) -> Any:
    """The request's document, its inputs' numbers left for :func:`flat_numbers`
    (:mod:`batcher.json_request`); what else simdjson refuses is read by :func:`_loads`.

    A document nested past simdjson's depth limit is refused here, not handed on: no request
    needs that depth (a tensor's data takes one level per dimension), and a recursive parser
    given hundreds of thousands of levels can exhaust the C stack and take the process down.
    """
    try:
        return read_document(header)
    except RuntimeError as exc:  # past the depth limit, or an integer past 64 bits
        if str(exc).startswith(SIMDJSON_DEPTH_ERROR):
            raise ProtocolError(TOO_DEEP) from None
        return _loads(header)
    except ValueError:  # not JSON simdjson reads (NaN, Infinity)
        return _loads(header)


def _loads(header: bytes) -> Any:
    """orjson first (several times faster on numbers); the standard library for what orjson
    refuses but JSON as Python reads it allows (NaN and Infinity, integers past 64 bits), and for
    its error message."""
    try:
        return orjson.loads(header)
    except orjson.JSONDecodeError:
        pass
    try:
        return json.loads(header)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ProtocolError(f"request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ProtocolError(TOO_DEEP) from None


def _dumps(document: dict[str, Any], tensors: list[dict[str, Any]]) -> bytes:
    """The answer's JSON: numpy arrays written by orjson in C, with no Python float per element.

    orjson writes NaN and infinities as null; an answer holding one goes through the standard
    library instead, which writes them as NaN and Infinity, as Triton's clients read them. Nothing
    else in an answer is null, so only a body with ``null`` in it (or in a string) is checked.
    """
    body = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    if b"null" not in body or all(_finite(entry.get("data")) for entry in tensors):
        return body
    for entry in tensors:
        if isinstance(entry.get("data"), np.ndarray):
            entry["data"] = entry["data"].tolist()
    return json.dumps(document, allow_nan=True).encode()


def _finite(data: object) -> bool:
    return (
        not isinstance(data, np.ndarray) or data.dtype.kind != "f" or bool(np.isfinite(data).all())
    )


def _json_output(name: str, datatype: str, array: np.ndarray) -> list | np.ndarray:
    if datatype == "BYTES":
        try:
            return [item.decode("utf-8") for item in _output_bytes(name, array)]
        except UnicodeDecodeError:
            raise ProtocolError(
                f"output {name!r} holds bytes that are not UTF-8, which JSON cannot carry; "
                'ask for it as binary data (outputs: [{"name": ..., "parameters": '
                '{"binary_data": true}}])'
            ) from None
    if datatype in ("BF16", "FP16"):  # orjson writes neither; float64 keeps their exact decimal
        return array.astype(np.float64).ravel()
    return array.astype(array.dtype.newbyteorder("="), copy=False).ravel()


def _output_bytes(name: str, array: np.ndarray) -> list[bytes]:
    items = []
    for position, item in enumerate(array.ravel().tolist()):
        if isinstance(item, bytes):
            items.append(item)
        elif isinstance(item, str):
            try:
                items.append(item.encode("utf-8"))
            except UnicodeEncodeError:
                raise ProtocolError(
                    f"output {name!r}: element {position} is not valid Unicode"
                ) from None
        else:
            raise ProtocolError(
                f"output {name!r}: BYTES elements must be str or bytes; element {position} "
                f"is {type(item).__name__}"
            )
    return items


def _request_id(document: dict) -> str | None:
    request_id = document.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise ProtocolError('"id" must be a string')
    return request_id


def request_priority(parameters: dict) -> int | str:
    """An integer level as Triton takes it, or a request class by name (checked by the engine,
    which knows the configured levels)."""
    value = parameters.get("priority", 0)
    if isinstance(value, str):
        return value
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ProtocolError(
            'parameters.priority must be an integer >= 0 (1 is the highest) or "online" or '
            '"best-effort"'
        )
    return value


def request_timeout(parameters: dict) -> float | None:
    """``parameters.timeout`` (microseconds) in seconds, or None when not given."""
    value = parameters.get("timeout")
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ProtocolError("parameters.timeout must be a positive integer of microseconds")
    return value * MICROSECONDS


def _requested_outputs(
    document: dict, parameters: dict, outputs: Sequence[TensorSpec]
) -> tuple[tuple[str, ...], frozenset[str]]:
    binary_default = parameters.get("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise ProtocolError("parameters.binary_data_output must be true or false")
    known = [spec.name for spec in outputs]
    raw = document.get("outputs")
    if raw is None:
        return tuple(known), frozenset(known) if binary_default else frozenset()
    if not isinstance(raw, list):
        raise ProtocolError('"outputs" must be a list of {"name": ...} objects')
    names: list[str] = []
    binary: set[str] = set()
    for index, item in enumerate(raw):
        entry = _object(item, f"outputs[{index}]")
        name = entry.get("name")
        if name not in known:
            raise ProtocolError(f"unknown output {name!r}; the model produces: {', '.join(known)}")
        flag = _object(entry.get("parameters", {}), f"output {name!r} parameters").get(
            "binary_data", binary_default
        )
        if not isinstance(flag, bool):
            raise ProtocolError(f"output {name!r}: parameters.binary_data must be true or false")
        names.append(name)
        if flag:
            binary.add(name)
    return tuple(names), frozenset(binary)
