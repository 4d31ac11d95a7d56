"""A KServe v2 JSON request read without a Python object per tensor element.

A JSON inference request is mostly numbers: one row of the reference MLP is 512 of them in a body
of about 10 KB. Read with a general JSON parser, every one becomes a Python float, and numpy then
walks the list again to learn its types before copying it into an array. simdjson (pysimdjson)
parses the document in C and copies a flat array of numbers straight into a buffer that numpy
reads as it is, so the numbers never become Python objects.

:func:`read_document` gives the request as plain Python objects, as any JSON parser would, except
each input's ``data`` list, which stays a :class:`simdjson.Array` until the decoder knows the
input's datatype and shape and asks :func:`flat_numbers` for it. Anything the fast reading cannot
carry as such (a document simdjson refuses, ``data`` holding anything but numbers of the kind
asked, or the wrong count of them) is left to the general path, so such requests are refused as
before, with the same words.

Each read uses a parser of its own: a reused simdjson parser refuses a new document while any lazy
array of the last one is still referenced, and a parser costs no more to make than to reuse.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np
import simdjson

# The buffer kinds simdjson copies a homogeneous array of numbers into, and numpy's name for each.
BufferKind = Literal["d", "i"]
_BUFFER_DTYPES: dict[BufferKind, np.dtype] = {"d": np.dtype(np.float64), "i": np.dtype(np.int64)}


def read_document(header: bytes) -> Any:
    """The request's JSON document, each input's ``data`` array left lazy.

    Raises ValueError when simdjson refuses the document (not JSON, or JSON it does not read such
    as NaN or integers past 64 bits) or holds a key it cannot look up, and RuntimeError when it
    is nested past simdjson's depth limit: the caller reads it the general way then.
    """
    document = simdjson.Parser().parse(header)
    if not isinstance(document, simdjson.Object):
        return as_python(document)
    plain = {}
    for key in document:
        value = _member(document, key)
        if key == "inputs" and isinstance(value, simdjson.Array):
            plain[key] = [_tensor(item) for item in value]
        else:
            plain[key] = as_python(value)
    return plain


def is_lazy(data: object) -> bool:
    """Whether ``data`` is an input's numbers as :func:`read_document` left them."""
    return isinstance(data, simdjson.Array)


def as_python(value: object) -> Any:
    """``value`` as plain Python objects (a lazy array becomes a list, an object a dict)."""
    if isinstance(value, simdjson.Array):
        return value.as_list()
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    return value


def flat_numbers(data: simdjson.Array, count: int, kind: BufferKind) -> np.ndarray | None:
    """``data``'s numbers in row-major order, as a writable one-dimensional array of float64
    (``kind`` ``"d"``) or int64 (``"i"``), when it holds exactly ``count`` numbers of that kind,
    however nested; None when it holds anything else (strings, booleans, nulls, non-integers for
    ``"i"``, another count), which the general path then reads and judges with its own words.

    The nesting itself is not checked: ``[[1, 2, 3], [4]]`` for shape ``[2, 2]`` is read as its
    four numbers in order (the protocol's ``data`` is the tensor's elements in row-major order;
    only their count must match the shape).
    """
    try:
        buffer = data.as_buffer(of_type=kind)
    except (TypeError, ValueError):
        return None
    array = np.frombuffer(buffer, dtype=_BUFFER_DTYPES[kind])
    return array if array.size == count else None


def _tensor(item: object) -> Any:
    if not isinstance(item, simdjson.Object):
        return as_python(item)
    tensor = {}
    for key in item:
        value = _member(item, key)
        tensor[key] = (
            value if key == "data" and isinstance(value, simdjson.Array) else as_python(value)
        )
    return tensor


def _member(obj: simdjson.Object, key: str) -> Any:
    """``obj[key]``; ValueError for a key holding a NUL character (JSON allows ``\\u0000``),
    which simdjson's lookup by name cuts short and then cannot find."""
    if "\x00" in key:
        raise ValueError("a key holds a NUL character")
    return obj[key]
