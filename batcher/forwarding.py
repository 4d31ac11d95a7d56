"""What a front worker and the engine say to each other about one inference, as bytes.

With ``--workers N`` (:mod:`batcher.worker_pool`) the front worker processes decode the client's
request (JSON numbers included) and the engine process only batches. A decoded request travels to
the engine in the binary tensor data extension's own layout (a small JSON header, then each input's
raw little-endian bytes), every output asked for as binary, so the engine parses a header of a few
hundred bytes and calls ``numpy.frombuffer``: never a JSON float. The worker then reads the
engine's binary answer back into arrays and encodes it as the client asked, with the same
:func:`batcher.oip.encode_infer_response` a one-process server uses, so both answer alike.

Each message is a frame on a private Unix socket (:mod:`batcher.engine_channel`): a fixed
header (call id, envelope length, payload length), an envelope (a JSON object: which model,
which signature, the answer's status) and the payload (the request or answer body). JSON and raw
bytes only: nothing on the channel is pickled, so neither side runs code the other sent.

A worker checks a request against the model's signature as the engine served it when the worker
last asked (``GET /v2/models/NAME``); :func:`signature_tag` names that signature, the engine
answers :data:`SIGNATURE_CHANGED` when the model now served under that name has another one (a
repository reload), and the worker asks again. A request the worker's signature refuses is
checked the same way (a call with ``check`` and no body) before the refusal is sent, so a worker
never refuses a request that the reloaded model takes.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import orjson

from batcher import oip
from batcher.tensor_spec import TensorSpec

FRAME_HEADER = struct.Struct("<III")  # call id, envelope length, payload length
# The engine answers this status when the request's signature tag is not the served model's.
SIGNATURE_CHANGED = 409
# A decoded request in binary form can outgrow what the client sent: JSON's "0," (2 bytes) becomes
# an 8-byte INT64 or FP64 (4x), and a gRPC request's typed contents more: a packed varint of one
# byte (an INT64 or UINT64 of 0..127) becomes 8 bytes. Nothing grows more than 8x. The envelope
# and the binary request's JSON header fit in the allowance.
BINARY_GROWTH = 8
FRAME_ALLOWANCE_BYTES = 1 << 20
# A call id for a message that expects no answer (a worker telling the engine it refused a
# request as invalid, so the engine's request counters see every request).
NO_ANSWER = 0
# The key of such a message that takes back call ``envelope[CANCEL]`` (its caller gave up: a gRPC
# client's deadline passed), so the engine drops it from the queue as one process would.
CANCEL = "cancel"


class ChannelError(ConnectionError):
    """The private channel to the engine broke or carried something that is not a frame."""


def frame(call_id: int, envelope: Mapping[str, Any], payload: bytes = b"") -> bytes:
    """One message: header, JSON envelope, payload."""
    head = orjson.dumps(envelope)
    return FRAME_HEADER.pack(call_id, len(head), len(payload)) + head + payload


def request_frame_limit(max_body_bytes: int) -> int:
    """The largest frame a worker sends for a request body of at most ``max_body_bytes``."""
    return BINARY_GROWTH * max_body_bytes + FRAME_ALLOWANCE_BYTES


class FrameReader:
    """Cuts a byte stream into frames; a frame larger than ``max_frame_bytes`` (None: no limit)
    is a :class:`ChannelError` (the stream cannot be trusted past it)."""

    def __init__(self, max_frame_bytes: int | None) -> None:
        self._buffer = bytearray()
        self._max = max_frame_bytes

    def feed(self, data: bytes) -> list[tuple[int, dict[str, Any], bytes]]:
        """The frames completed by ``data``, in order."""
        self._buffer += data
        frames = []
        start = 0
        size = FRAME_HEADER.size
        while len(self._buffer) - start >= size:
            call_id, head_length, payload_length = FRAME_HEADER.unpack_from(self._buffer, start)
            if self._max is not None and head_length + payload_length > self._max:
                raise ChannelError(
                    f"a frame of {head_length + payload_length} bytes is over the channel's "
                    f"limit of {self._max}"
                )
            end = start + size + head_length + payload_length
            if len(self._buffer) < end:
                break
            head = bytes(self._buffer[start + size : start + size + head_length])
            envelope = orjson.loads(head)
            if not isinstance(envelope, dict):
                raise ChannelError("a frame's envelope is not a JSON object")
            frames.append((call_id, envelope, bytes(self._buffer[end - payload_length : end])))
            start = end
        del self._buffer[:start]
        return frames


def signature_tag(metadata: Mapping[str, Any]) -> str:
    """A short name for a model's metadata (``GET /v2/models/NAME``): equal tags, equal
    signatures, whichever side computes it."""
    canonical = json.dumps(metadata, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.blake2b(canonical, digest_size=8).hexdigest()


@dataclass(frozen=True)
class Signature:
    """A model's name, inputs and outputs as its metadata gives them, and their tag."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    tag: str

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> Signature:
        """Read the engine's own metadata answer (``oip.model_metadata``)."""

        def specs(key: str) -> tuple[TensorSpec, ...]:
            return tuple(
                TensorSpec(t["name"], t["datatype"], tuple(t["shape"][1:])) for t in metadata[key]
            )

        return cls(metadata["name"], specs("inputs"), specs("outputs"), signature_tag(metadata))


class EngineCalls(Protocol):
    """The worker's end of the channel (:class:`batcher.engine_channel.WorkerEnd`, which imports
    this module): one call, one answer."""

    async def call(
        self, envelope: dict[str, Any], payload: bytes
    ) -> tuple[dict[str, Any], bytes]: ...


async def forward(
    engine: EngineCalls,
    name: str,
    version: str | None,
    signature: Signature,
    forwarded: tuple[bytes, int],
) -> tuple[dict[str, Any], bytes]:
    """Send a binary request (body and JSON header length, as :func:`engine_request` gives
    them) for ``signature``; the engine's answer (envelope and body). REST and gRPC workers
    forward alike, so the engine cannot tell which face a request came through."""
    payload, header_length = forwarded
    envelope = {
        "model": name,
        "version": version or "1",
        "signature": signature.tag,
        "header_length": header_length,
    }
    return await engine.call(envelope, payload)


async def outdated(engine: EngineCalls, key: tuple[str, str], signature: Signature) -> bool:
    """Whether the engine now serves ``key`` (name, version) with another signature than
    ``signature``: asked before a worker refuses a request its kept signature does not take."""
    name, version = key
    envelope = {"check": True, "model": name, "version": version, "signature": signature.tag}
    answer, _ = await engine.call(envelope, b"")
    return bool(answer["status"] == SIGNATURE_CHANGED)


def engine_request(request: oip.InferRequest, signature: Signature) -> tuple[bytes, int]:
    """The body of the binary request that carries ``request``'s decoded inputs, and its JSON
    header's length: inputs as raw bytes, every requested output asked for as binary, the
    priority and timeout as the client gave them."""
    datatypes = {spec.name: spec.datatype for spec in signature.inputs}
    tensors = []
    buffers = []
    for name, array in request.inputs.items():
        datatype = datatypes[name]
        raw = oip.encode_binary_output(name, datatype, np.ascontiguousarray(array))
        tensors.append(
            {
                "name": name,
                "datatype": datatype,
                "shape": list(array.shape),
                "parameters": {"binary_data_size": len(raw)},
            }
        )
        buffers.append(raw)
    parameters: dict[str, Any] = {"priority": request.priority}
    if request.timeout_seconds is not None:
        parameters["timeout"] = round(request.timeout_seconds / oip.MICROSECONDS)
    header = orjson.dumps(
        {
            "inputs": tensors,
            "outputs": [
                {"name": name, "parameters": {"binary_data": True}} for name in request.outputs
            ],
            "parameters": parameters,
        }
    )
    return header + b"".join(buffers), len(header)


def sent_in_binary(body: bytes, header_length: str | None, request: oip.InferRequest) -> bool:
    """Whether the client's ``body`` (already decoded to ``request``) is itself a request the
    engine can take as it is: every input binary (no ``"data"`` anywhere in its JSON header) and
    every requested output asked for as binary. Then the worker forwards the body and passes the
    engine's answer back untouched, with no copy of the tensors either way."""
    if header_length is None or request.binary_outputs != frozenset(request.outputs):
        return False
    return b'"data"' not in body[: int(header_length)]


def read_binary_answer(body: bytes, header_length: int) -> dict[str, np.ndarray]:
    """The outputs of the engine's answer to :func:`engine_request` (all binary), as arrays."""
    header = orjson.loads(body[:header_length])
    outputs: dict[str, np.ndarray] = {}
    offset = header_length
    for tensor in header["outputs"]:
        name, datatype, shape = tensor["name"], tensor["datatype"], tensor["shape"]
        size = tensor["parameters"]["binary_data_size"]
        raw = body[offset : offset + size]
        outputs[name] = oip.decode_binary_data(raw, name, datatype, oip.DATATYPES[datatype], shape)
        offset += size
    return outputs
