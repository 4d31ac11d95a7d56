"""What a front worker sends the engine and reads back (``--workers``), without processes.

A request decoded by a worker and carried in binary form must reach the model exactly as the
one-process server would have given it (every datatype, bit for bit, with its priority and
timeout), and the engine's binary answer must read back to the model's arrays.
"""

from __future__ import annotations

import asyncio
import json

import ml_dtypes
import numpy as np
import orjson
import pytest

from batcher import oip
from batcher.engine_channel import EngineEnd, WorkerEnd
from batcher.forwarding import (
    ChannelError,
    FrameReader,
    Signature,
    engine_request,
    frame,
    read_binary_answer,
    request_frame_limit,
    sent_in_binary,
    signature_tag,
)
from batcher.tensor_spec import TensorSpec

ARRAYS = {
    "f32": np.array([[1.5, -0.0, np.inf]], dtype=np.float32),
    "f16": np.array([[0.1, 65504, -2]], dtype=np.float16),
    "bf16": np.array([[0.1, 3.0, -7.5]], dtype=ml_dtypes.bfloat16),
    "f64": np.array([[1e300, -1e-300, 0.1]]),
    "i8": np.array([[-128, 0, 127]], dtype=np.int8),
    "u64": np.array([[0, 1, 2**64 - 1]], dtype=np.uint64),
    "flag": np.array([[True, False, True]]),
    "text": np.array([[b"a\x00", b"", "é".encode()]], dtype=object),
}
DATATYPES = {
    "f32": "FP32",
    "f16": "FP16",
    "bf16": "BF16",
    "f64": "FP64",
    "i8": "INT8",
    "u64": "UINT64",
    "flag": "BOOL",
    "text": "BYTES",
}
SPECS = tuple(TensorSpec(name, DATATYPES[name], (3,)) for name in ARRAYS)


def signature() -> Signature:
    return Signature.from_metadata(json.loads(json.dumps(oip.model_metadata("m", SPECS, SPECS))))


def client_request(**parameters: object) -> oip.InferRequest:
    """What a worker decoded from a client's JSON request (BYTES as strings, numbers as JSON)."""
    inputs = []
    for name, array in ARRAYS.items():
        data = (
            [item.decode() for item in array.ravel()]
            if name == "text"
            else array.astype(np.float64 if array.dtype.kind == "V" else array.dtype).tolist()
        )
        inputs.append({"name": name, "datatype": DATATYPES[name], "shape": [1, 3], "data": data})
    body = json.dumps({"inputs": inputs, "parameters": parameters}).encode()
    return oip.parse_infer_request(body, None, SPECS, SPECS)


def test_a_forwarded_request_reaches_the_engine_bit_for_bit_with_its_parameters() -> None:
    decoded = client_request(priority=2, timeout=1500)
    body, header_length = engine_request(decoded, signature())
    at_engine = oip.parse_infer_request(body, str(header_length), SPECS, SPECS)
    for name, array in decoded.inputs.items():
        assert at_engine.inputs[name].dtype == array.dtype
        assert at_engine.inputs[name].shape == array.shape
        if name == "text":
            assert list(at_engine.inputs[name].ravel()) == list(ARRAYS["text"].ravel())
        else:
            assert at_engine.inputs[name].tobytes() == array.tobytes()
    assert (at_engine.priority, at_engine.timeout_seconds) == (2, decoded.timeout_seconds)
    assert at_engine.outputs == tuple(ARRAYS) and at_engine.binary_outputs == frozenset(ARRAYS)
    assert b'"data"' not in body[:header_length]  # no JSON number for the engine to parse


def test_a_forwarded_request_keeps_a_named_class_and_no_timeout() -> None:
    decoded = client_request(priority="best-effort")
    body, header_length = engine_request(decoded, signature())
    at_engine = oip.parse_infer_request(body, str(header_length), SPECS, SPECS)
    assert (at_engine.priority, at_engine.timeout_seconds) == ("best-effort", None)


def test_the_engines_binary_answer_reads_back_to_the_models_arrays() -> None:
    forwarded, forwarded_header_length = engine_request(client_request(), signature())
    asked = oip.parse_infer_request(forwarded, str(forwarded_header_length), SPECS, SPECS)
    body, header_length = oip.encode_infer_response("m", asked, ARRAYS)
    assert header_length is not None
    outputs = read_binary_answer(body, header_length)
    for name, array in ARRAYS.items():
        assert outputs[name].dtype == array.dtype and outputs[name].shape == array.shape
        if name == "text":
            assert list(outputs[name].ravel()) == list(array.ravel())
        else:
            assert outputs[name].tobytes() == array.tobytes()


def test_signature_tags_agree_across_json_and_differ_for_another_signature() -> None:
    metadata = oip.model_metadata("m", SPECS, SPECS)
    assert signature().tag == signature_tag(metadata)
    other = oip.model_metadata("m", SPECS[:-1], SPECS)
    assert signature_tag(other) != signature_tag(metadata)


def test_frames_cut_from_a_stream_in_any_pieces() -> None:
    stream = frame(1, {"a": 1}, b"xyz") + frame(2, {"b": [2]}) + frame(3, {}, b"\x00" * 10)
    reader = FrameReader(max_frame_bytes=100)
    got = []
    for position in range(0, len(stream), 7):
        got += reader.feed(stream[position : position + 7])
    assert got == [(1, {"a": 1}, b"xyz"), (2, {"b": [2]}, b""), (3, {}, b"\x00" * 10)]


@pytest.mark.parametrize("datatype", ["INT64", "FP64", "BOOL", "BYTES"])
def test_the_binary_form_of_a_json_request_fits_the_engines_frame_limit(datatype: str) -> None:
    """The engine's limit holds the densest JSON the body limit allows, however it grows."""
    value = {"INT64": 0, "FP64": 0, "BOOL": False, "BYTES": ""}[datatype]
    spec = TensorSpec("v", datatype, (-1,))
    count = 50_000
    document = {"inputs": [{"name": "v", "datatype": datatype, "shape": [1, count]}]}
    document["inputs"][0]["data"] = [value] * count
    body = orjson.dumps(document)
    decoded = oip.parse_infer_request(body, None, (spec,), (spec,))
    metadata = oip.model_metadata("m", (spec,), (spec,))
    payload, header_length = engine_request(decoded, Signature.from_metadata(metadata))
    envelope = {"model": "m", "version": "1", "signature": "0" * 16, "header_length": header_length}
    assert len(frame(1, envelope, payload)) <= request_frame_limit(len(body))


def test_a_frame_over_the_limit_breaks_the_channel() -> None:
    with pytest.raises(ChannelError, match="over the channel's limit"):
        FrameReader(max_frame_bytes=8).feed(frame(1, {"a": 1}, b"0123456789"))


def test_calls_on_one_connection_are_answered_out_of_order(tmp_path) -> None:
    """Many calls share one connection; each waiter gets its own answer, whichever finishes
    first, and a notice expects none."""
    notices: list[dict] = []

    async def call(envelope: dict, payload: bytes) -> tuple[dict, bytes]:
        await asyncio.sleep(envelope["wait"])
        return {"status": 200, "echo": envelope["n"]}, payload[::-1]

    async def main() -> list[tuple[dict, bytes]]:
        calls: set[asyncio.Task[None]] = set()
        path = str(tmp_path / "channel.sock")
        server = await asyncio.get_running_loop().create_unix_server(
            lambda: EngineEnd(call, notices.append, calls, 1 << 16), path
        )
        worker = await WorkerEnd.connect(path)
        worker.notify({"invalid": "m"})
        answers = await asyncio.gather(
            *(worker.call({"n": n, "wait": 0.05 * (3 - n)}, bytes([n, 9])) for n in range(3))
        )
        worker.close()
        server.close()
        await worker.closed
        return answers

    answers = asyncio.run(main())
    assert answers == [({"status": 200, "echo": n}, bytes([9, n])) for n in range(3)]
    assert notices == [{"invalid": "m"}]


def test_calls_waiting_when_the_engine_goes_fail_with_a_channel_error(tmp_path) -> None:
    async def main() -> None:
        path = str(tmp_path / "channel.sock")
        connections: list[asyncio.Transport] = []

        class Silent(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                assert isinstance(transport, asyncio.Transport)
                connections.append(transport)

        server = await asyncio.get_running_loop().create_unix_server(Silent, path)
        worker = await WorkerEnd.connect(path)
        waiting = asyncio.ensure_future(worker.call({}, b""))
        while not connections:
            await asyncio.sleep(0.01)
        connections[0].close()
        server.close()
        with pytest.raises(ChannelError, match="closed"):
            await waiting
        with pytest.raises(ChannelError):
            await worker.call({}, b"")

    asyncio.run(main())


def test_a_call_its_worker_gives_up_on_is_cancelled_at_the_engine(tmp_path) -> None:
    """A call cancelled at the worker (a gRPC client's deadline) cancels the engine's task, as a
    one-process server's call is cancelled (the request leaves the queue); a notice is not sent
    to the engine's notice handler, and the connection serves the next call."""
    notices: list[dict] = []
    cancelled: list[int] = []

    async def call(envelope: dict, payload: bytes) -> tuple[dict, bytes]:
        try:
            await asyncio.sleep(envelope["wait"])
        except asyncio.CancelledError:
            cancelled.append(envelope["n"])
            raise
        return {"status": 200, "echo": envelope["n"]}, b""

    async def main() -> tuple[dict, bytes]:
        path = str(tmp_path / "channel.sock")
        calls: set[asyncio.Task[None]] = set()
        server = await asyncio.get_running_loop().create_unix_server(
            lambda: EngineEnd(call, notices.append, calls, 1 << 16), path
        )
        worker = await WorkerEnd.connect(path)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(worker.call({"n": 1, "wait": 30}, b""), 0.2)
        answer = await asyncio.wait_for(worker.call({"n": 2, "wait": 0}, b""), 30)
        while calls:
            await asyncio.sleep(0.01)
        worker.close()
        server.close()
        return answer

    assert asyncio.run(main()) == ({"status": 200, "echo": 2}, b"")
    assert cancelled == [1] and notices == []


def test_envelopes_are_json_only() -> None:
    """Nothing on the channel is pickled: an envelope is a JSON object, and anything else in
    its place breaks the channel."""
    raw = frame(5, {"model": "m"}, b"p")
    assert orjson.loads(raw[12:-1]) == {"model": "m"}
    bad = frame(5, {}, b"")[:4] + (4).to_bytes(4, "little") + (0).to_bytes(4, "little") + b"[1] "
    with pytest.raises(ChannelError, match="not a JSON object"):
        FrameReader(100).feed(bad)


def test_a_call_that_fails_at_the_engine_is_answered_500(tmp_path) -> None:
    async def call(envelope: dict, payload: bytes) -> tuple[dict, bytes]:
        raise RuntimeError("a bug")

    async def main() -> tuple[dict, bytes]:
        path = str(tmp_path / "channel.sock")
        server = await asyncio.get_running_loop().create_unix_server(
            lambda: EngineEnd(call, lambda envelope: None, set(), 1 << 16), path
        )
        worker = await WorkerEnd.connect(path)
        answer = await asyncio.wait_for(worker.call({"model": "m"}, b""), 30)
        worker.close()
        server.close()
        return answer

    envelope, body = asyncio.run(main())
    assert envelope["status"] == 500 and json.loads(body) == {"error": "internal error"}


def binary_client_request(outputs: list[dict] | None, **parameters: object) -> tuple[bytes, str]:
    """A client's binary request for the f32 input alone (spec ``F32``), as tritonclient sends."""
    raw = ARRAYS["f32"].tobytes()
    document: dict = {
        "inputs": [
            {
                "name": "f32",
                "datatype": "FP32",
                "shape": [1, 3],
                "parameters": {"binary_data_size": len(raw)},
            }
        ],
        "parameters": parameters,
    }
    if outputs is not None:
        document["outputs"] = outputs
    header = orjson.dumps(document)
    return header + raw, str(len(header))


F32 = (TensorSpec("f32", "FP32", (3,)),)


@pytest.mark.parametrize(
    ("outputs", "parameters", "as_sent"),
    [
        ([{"name": "f32", "parameters": {"binary_data": True}}], {}, True),
        (None, {"binary_data_output": True}, True),
        (None, {}, False),  # JSON answer asked for
        ([{"name": "f32"}], {}, False),
    ],
)
def test_a_request_already_in_binary_both_ways_is_forwarded_as_sent(
    outputs: list[dict] | None, parameters: dict, as_sent: bool
) -> None:
    body, header_length = binary_client_request(outputs, **parameters)
    decoded = oip.parse_infer_request(body, header_length, F32, F32)
    assert sent_in_binary(body, header_length, decoded) is as_sent


def test_a_request_with_json_data_is_not_forwarded_as_sent() -> None:
    document = {
        "inputs": [{"name": "f32", "datatype": "FP32", "shape": [1, 3], "data": [1, 2, 3]}],
        "parameters": {"binary_data_output": True},
    }
    body = orjson.dumps(document)
    decoded = oip.parse_infer_request(body, str(len(body)), F32, F32)
    assert not sent_in_binary(body, str(len(body)), decoded)
    assert not sent_in_binary(body, None, oip.parse_infer_request(body, None, F32, F32))
