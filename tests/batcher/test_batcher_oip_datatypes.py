"""BYTES and BF16 over the Open Inference Protocol: codec round trips, batching, and HTTP.

The codec tests check the wire format against tritonclient's own serializer (an independent
implementation of the same spec); the HTTP tests drive a running server with ``requests`` and
``tritonclient.http`` and check that text models see ``bytes`` and bfloat16 models see exact
bfloat16 values, whether requests are batched together or not.
"""

from __future__ import annotations

import json
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import ml_dtypes
import numpy as np
import pytest
import requests
import torch
import tritonclient.http as triton
from tritonclient.utils import deserialize_bytes_tensor, serialize_byte_tensor

from batcher import oip
from batcher.model import TensorSpec, to_numpy, wrap_model, zeros

pytestmark = pytest.mark.timeout(120)

BF16 = np.dtype(ml_dtypes.bfloat16)
TEXT_IN = (TensorSpec("text", "BYTES", ()),)
TEXT_OUT = (TensorSpec("length", "INT64", ()), TensorSpec("upper", "BYTES", ()))
WORDS = ["hello", "", "héllo wörld", "日本語", "🙂 emoji"]


class TextModel:
    """Batch callable over BYTES: the byte length of each string, and the string upper-cased.

    Records the type of every element it is handed and the requests per call, and can be held
    (``release`` cleared) so that requests queue up and get batched together.
    """

    input_specs = TEXT_IN
    output_specs = TEXT_OUT
    model_name = "text"

    def __init__(self) -> None:
        self.requests_per_call: list[int] = []
        self.element_types: set[type] = set()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, batch: list[dict[str, np.ndarray]]) -> list[dict[str, object]]:
        self.requests_per_call.append(len(batch))
        self.entered.set()
        self.release.wait(timeout=30)
        results = []
        for payload in batch:
            text = payload["text"].ravel().tolist()
            self.element_types.update(type(item) for item in text)
            lengths = np.array([len(item) for item in text], dtype=np.int64)
            results.append({"length": lengths, "upper": [t.decode().upper() for t in text]})
        return results


class TaggedScaler(torch.nn.Module):
    """Torch module over BYTES and BF16: upper-cases the tags and doubles x in bfloat16."""

    input_specs = (TensorSpec("tag", "BYTES", ()), TensorSpec("x", "BF16", (2,)))
    output_specs = (TensorSpec("tag_upper", "BYTES", ()), TensorSpec("y", "BF16", (2,)))
    model_name = "scaler"

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[np.ndarray, torch.dtype]] = []

    def forward(self, tag: np.ndarray, x: torch.Tensor) -> dict[str, object]:
        self.seen.append((tag.copy(), x.dtype))
        return {"tag_upper": [t.decode().upper() for t in tag], "y": x * 2}


def text_request(words: list[str], binary_input: bool, binary_output: bool) -> tuple[bytes, dict]:
    """A request for :class:`TextModel` (JSON or binary input), with the HTTP headers it needs."""
    tensor: dict = {"name": "text", "shape": [len(words)], "datatype": "BYTES"}
    raw = b""
    if binary_input:
        raw = oip.encode_bytes_elements([w.encode() for w in words])
        tensor["parameters"] = {"binary_data_size": len(raw)}
    else:
        tensor["data"] = words
    outputs = [
        {"name": n, "parameters": {"binary_data": binary_output}} for n in ("length", "upper")
    ]
    header = json.dumps({"inputs": [tensor], "outputs": outputs}).encode()
    headers = {"Content-Type": "application/octet-stream" if binary_input else "application/json"}
    if binary_input:
        headers[oip.HEADER_LENGTH] = str(len(header))
    return header + raw, headers


def read_response(reply: requests.Response) -> dict[str, tuple[dict, object]]:
    """Outputs by name: the JSON entry and its data (a list for JSON, raw bytes for binary)."""
    length = reply.headers.get(oip.HEADER_LENGTH)
    header = reply.content[: int(length)] if length else reply.content
    rest = reply.content[int(length) :] if length else b""
    outputs = {}
    for entry in json.loads(header)["outputs"]:
        size = entry.get("parameters", {}).get("binary_data_size")
        if size is None:
            outputs[entry["name"]] = (entry, entry["data"])
        else:
            outputs[entry["name"]] = (entry, rest[:size])
            rest = rest[size:]
    return outputs


def parse(body: dict, specs=TEXT_IN, binary: bytes = b"") -> oip.InferRequest:
    header = json.dumps(body).encode()
    return oip.parse_infer_request(
        header + binary, str(len(header)) if binary else None, specs, TEXT_OUT
    )


def bytes_input(raw: bytes, shape: list[int], size: int | None = None) -> oip.InferRequest:
    tensor = {"name": "text", "shape": shape, "datatype": "BYTES"}
    tensor["parameters"] = {"binary_data_size": len(raw) if size is None else size}
    return parse({"inputs": [tensor]}, binary=raw)


# --- BYTES codec --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("data", "shape"),
    [
        (WORDS, [5]),
        ([["a", "bb"], ["", "ççç"]], [2, 2]),
        (["a", "bb", "", "ççç"], [2, 2]),  # flat data for a 2-D shape, as for numbers
        ([[]], [1, 0]),
    ],
)
def test_json_strings_reach_the_model_as_utf8_bytes_in_an_object_array(data, shape) -> None:
    specs = (TensorSpec("text", "BYTES", (-1,) * (len(shape) - 1)),)
    tensor = {"name": "text", "shape": shape, "datatype": "BYTES", "data": data}
    request = parse({"inputs": [tensor]}, specs)
    text = request.inputs["text"]
    assert text.dtype == object and list(text.shape) == shape
    flat = np.asarray(data, dtype=object).ravel().tolist()
    assert text.ravel().tolist() == [s.encode("utf-8") for s in flat]
    assert all(type(item) is bytes for item in text.ravel())


def test_binary_bytes_keep_every_byte_including_nul_and_non_utf8() -> None:
    elements = [b"", b"abc\x00", b"\x00", b"\xff\xfe not utf-8", "日本".encode()]
    request = bytes_input(oip.encode_bytes_elements(elements), [5])
    assert request.inputs["text"].ravel().tolist() == elements


def test_binary_layout_matches_tritonclient_serializer() -> None:
    elements = np.array([b"one", b"", "ü".encode(), b"\x00\x01"], dtype=object).reshape(2, 2)
    ours = oip.encode_bytes_elements(elements.ravel().tolist())
    assert ours == serialize_byte_tensor(elements).item()
    assert ours[:4] == struct.pack("<I", 3)
    decoded = oip.decode_bytes_elements(ours, "text", [2, 2])
    assert decoded.shape == (2, 2) and decoded.tolist() == elements.tolist()


@pytest.mark.parametrize(
    ("raw", "shape", "size", "reason"),
    [
        (struct.pack("<I", 10) + b"abc", [1], None, "announces 10 bytes but only 3 remain"),
        (struct.pack("<I", 1) + b"a" + b"\x02\x00", [2], None, "ends inside the 4-byte length"),
        (oip.encode_bytes_elements([b"a"]), [2], None, r"holds 1 BYTES elements but shape \[2\]"),
        (oip.encode_bytes_elements([b"a", b"b"]), [1], None, "more than the 1 BYTES elements"),
        (oip.encode_bytes_elements([b"abc"]), [1], 20, "binary data ends after 7 of 20 bytes"),
        # the size claims fewer bytes than the element needs: the prefix runs past its buffer
        (oip.encode_bytes_elements([b"abc"]), [1], 5, "announces 3 bytes but only 1 remain"),
    ],
)
def test_malformed_binary_bytes_are_refused_with_the_reason(raw, shape, size, reason) -> None:
    with pytest.raises(oip.ProtocolError, match=reason):
        bytes_input(raw, shape, size)


@pytest.mark.parametrize(
    ("data", "shape", "reason"),
    [
        (["a", 1], [2], "must be strings; element 1 is int"),
        (["a", None], [2], "element 1 is NoneType"),
        ([["a", "b"], ["c"]], [3], "ragged"),
        ([["a", "b"], "c"], [3], "ragged"),
        (["a", "b"], [3], "data has 2 values but shape \\[3\\] needs 3"),
        (["ok", "\ud800"], [2], "element 1 is not valid Unicode"),
        ("abc", [1], "must be a list of strings"),
    ],
)
def test_malformed_json_bytes_are_refused_with_the_reason(data, shape, reason) -> None:
    tensor = {"name": "text", "shape": shape, "datatype": "BYTES", "data": data}
    with pytest.raises(oip.ProtocolError, match=reason):
        parse({"inputs": [tensor]})


def bytes_response(result: dict, binary: bool) -> dict[str, tuple[dict, object]]:
    """Encode ``result`` for a request that asked for output ``upper`` (as binary or JSON)."""
    flagged = frozenset({"upper"}) if binary else frozenset()
    request = oip.InferRequest(None, {}, 1, 0, None, ("upper",), flagged)
    body, length = oip.encode_infer_response("text", request, result)
    fake = requests.Response()
    fake._content = body
    if length is not None:
        fake.headers[oip.HEADER_LENGTH] = str(length)
    return read_response(fake)


@pytest.mark.parametrize(
    "produced",
    [
        np.array(["ÉTÉ", "", "B"], dtype=object),  # str elements
        np.array(["ÉTÉ".encode(), b"", b"B"], dtype=object),  # bytes elements
        np.array(["ÉTÉ", "", "B"]),  # numpy unicode
        to_numpy(["ÉTÉ", "", "B"]),  # a model's plain list
    ],
)
def test_bytes_outputs_come_back_as_strings_in_json_and_length_prefixed_in_binary(
    produced,
) -> None:
    entry, data = bytes_response({"upper": produced}, binary=False)["upper"]
    assert (entry["datatype"], entry["shape"], data) == ("BYTES", [3], ["ÉTÉ", "", "B"])
    entry, raw = bytes_response({"upper": produced}, binary=True)["upper"]
    assert entry["datatype"] == "BYTES" and entry["parameters"]["binary_data_size"] == len(raw)
    assert deserialize_bytes_tensor(raw).tolist() == ["ÉTÉ".encode(), b"", b"B"]


def test_bytes_outputs_that_json_cannot_carry_say_how_to_get_them() -> None:
    raw_bytes = np.array([b"\xff\x00"], dtype=object)
    with pytest.raises(oip.ProtocolError, match=r"not UTF-8.*binary_data"):
        bytes_response({"upper": raw_bytes}, binary=False)
    _, raw = bytes_response({"upper": raw_bytes}, binary=True)["upper"]
    assert raw == struct.pack("<I", 2) + b"\xff\x00"
    with pytest.raises(oip.ProtocolError, match="must be str or bytes; element 0 is int"):
        bytes_response({"upper": np.array([3], dtype=object)}, binary=True)


def test_plain_lists_of_bytes_keep_trailing_nul_bytes() -> None:
    # numpy's own choice for this list would be the S dtype, which strips the trailing NULs
    assert to_numpy([b"a\x00", b"b"]).tolist() == [b"a\x00", b"b"]


# --- BF16 codec ---------------------------------------------------------------------------------

BF16_IN = (TensorSpec("x", "BF16", (2,)),)


def test_binary_bf16_keeps_the_exact_bits_and_json_numbers_round_to_nearest() -> None:
    bits = np.array([0x3F80, 0xC060, 0x7F80, 0x3DCD], dtype="<u2")  # 1, -3.5, inf, 0.10009765625
    tensor = {"name": "x", "shape": [2, 2], "datatype": "BF16"}
    tensor["parameters"] = {"binary_data_size": bits.nbytes}
    binary = parse({"inputs": [tensor]}, BF16_IN, bits.tobytes()).inputs["x"]
    assert binary.dtype == BF16 and binary.shape == (2, 2)
    assert binary.view(np.uint16).ravel().tolist() == bits.tolist()

    tensor = {"name": "x", "shape": [2, 2], "datatype": "BF16", "data": [1, -3.5, 1e39, 0.1]}
    from_json = parse({"inputs": [tensor]}, BF16_IN).inputs["x"]
    assert from_json.dtype == BF16
    assert from_json.view(np.uint16).ravel().tolist() == bits.tolist()
    # the same rounding torch applies, so JSON and torch clients agree
    expected = torch.tensor([1, -3.5, 1e39, 0.1], dtype=torch.float32).to(torch.bfloat16)
    assert from_json.ravel().astype(np.float32).tolist() == expected.float().tolist()


@pytest.mark.parametrize(
    ("tensor", "binary", "reason"),
    [
        ({"data": [True, False]}, b"", "BF16 data must be numbers"),
        ({"data": ["1", "2"]}, b"", "BF16 data must be numbers"),
        ({"parameters": {"binary_data_size": 3}}, b"abc", "needs 4 bytes"),
        ({"parameters": {"binary_data_size": 4}}, b"ab", "ends after 2 of 4 bytes"),
    ],
)
def test_malformed_bf16_is_refused_with_the_reason(tensor, binary, reason) -> None:
    with pytest.raises(oip.ProtocolError, match=reason):
        parse(
            {"inputs": [{"name": "x", "shape": [1, 2], "datatype": "BF16", **tensor}]},
            BF16_IN,
            binary,
        )


def test_torch_bfloat16_outputs_are_answered_as_bf16() -> None:
    produced = to_numpy(torch.tensor([[0.1, -2.0]], dtype=torch.bfloat16))
    assert produced.dtype == BF16 and oip.datatype_of(produced) == "BF16"
    request = oip.InferRequest(None, {}, 1, 0, None, ("y", "z"), frozenset({"y"}))
    body, length = oip.encode_infer_response("m", request, {"y": produced, "z": produced})
    header = json.loads(body[:length])
    y, z = header["outputs"]
    assert (y["datatype"], y["shape"], y["parameters"]) == ("BF16", [1, 2], {"binary_data_size": 4})
    expected_bits = torch.tensor([0.1, -2.0]).to(torch.bfloat16).view(torch.int16).numpy()
    assert (
        np.frombuffer(body[length:], dtype="<u2").tolist() == expected_bits.view(np.uint16).tolist()
    )
    assert (z["datatype"], z["data"]) == ("BF16", [0.10009765625, -2.0])


# --- the model adapter: batching BYTES and BF16 across requests -------------------------------


def test_torch_module_gets_bytes_and_bfloat16_and_each_request_its_own_rows() -> None:
    module = TaggedScaler()
    served = wrap_model(module, buckets=(4,))
    first = {"tag": np.array([b"a", "é".encode()], dtype=object), "x": np.ones((2, 2), BF16)}
    second = {"tag": np.array([b"z"], dtype=object), "x": np.full((1, 2), 0.1, BF16)}
    results = served.run([first, second])

    tags, dtype = module.seen[0]
    assert dtype == torch.bfloat16
    # concatenated along dim 0, then padded to the bucket with empty bytes (not integer zeros)
    assert tags.tolist() == [b"a", "é".encode(), b"z", b""]
    assert results[0]["tag_upper"].tolist() == ["A", "É"]
    assert results[1]["tag_upper"].tolist() == ["Z"]
    assert results[0]["y"].dtype == BF16 and results[0]["y"].astype(np.float32).tolist() == [
        [2, 2],
        [2, 2],
    ]
    assert results[1]["y"].astype(np.float32).tolist() == [[0.2001953125, 0.2001953125]]


def test_zeros_for_bytes_are_empty_bytes() -> None:
    assert zeros((2, 1), np.dtype(object)).tolist() == [[b""], [b""]]
    assert zeros((1,), BF16).dtype == BF16


# --- over HTTP ----------------------------------------------------------------------------------


@pytest.mark.parametrize("binary_input", [False, True], ids=["json-in", "binary-in"])
@pytest.mark.parametrize("binary_output", [False, True], ids=["json-out", "binary-out"])
def test_text_model_over_http_with_requests(serve, binary_input, binary_output) -> None:
    model = TextModel()
    server = serve(model, warmup_repeats=0)
    body, headers = text_request(WORDS, binary_input, binary_output)
    reply = requests.post(
        f"{server.url}/v2/models/text/infer", data=body, headers=headers, timeout=10
    )
    assert reply.status_code == 200, reply.text
    outputs = read_response(reply)
    (length_entry, lengths), (upper_entry, upper) = outputs["length"], outputs["upper"]
    assert (length_entry["datatype"], upper_entry["datatype"]) == ("INT64", "BYTES")
    assert length_entry["shape"] == upper_entry["shape"] == [len(WORDS)]
    expected_lengths = [len(w.encode()) for w in WORDS]
    if binary_output:
        assert np.frombuffer(lengths, "<i8").tolist() == expected_lengths
        assert deserialize_bytes_tensor(upper).tolist() == [w.upper().encode() for w in WORDS]
    else:
        assert lengths == expected_lengths
        assert upper == [w.upper() for w in WORDS]
    assert model.element_types == {bytes}


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
def test_text_model_with_tritonclient(serve, binary) -> None:
    server = serve(TextModel(), warmup_repeats=0)
    text = np.array([w.encode() for w in WORDS], dtype=object).reshape(len(WORDS))
    tensor = triton.InferInput("text", [len(WORDS)], "BYTES")
    tensor.set_data_from_numpy(text, binary_data=binary)
    outputs = [triton.InferRequestedOutput(n, binary_data=binary) for n in ("length", "upper")]
    client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        result = client.infer("text", [tensor], outputs=outputs)
    finally:
        client.close()
    assert result.as_numpy("length").tolist() == [len(w.encode()) for w in WORDS]
    upper = [u if isinstance(u, bytes) else u.encode() for u in result.as_numpy("upper").tolist()]
    assert upper == [w.upper().encode() for w in WORDS]


def test_bf16_and_bytes_torch_module_with_tritonclient_binary(serve) -> None:
    server = serve(TaggedScaler(), warmup_repeats=0)
    x = np.array([[0.1, -1.5], [3.0, 1e-3]], dtype=BF16)
    tag = triton.InferInput("tag", [2], "BYTES")
    tag.set_data_from_numpy(np.array([b"ab", b"c"], dtype=object), binary_data=True)
    values = triton.InferInput("x", [2, 2], "BF16")
    values.set_data_from_numpy(x, binary_data=True)
    client = triton.InferenceServerClient(url=server.url.removeprefix("http://"))
    try:
        result = client.infer(
            "scaler",
            [tag, values],
            outputs=[
                triton.InferRequestedOutput("tag_upper", binary_data=True),
                triton.InferRequestedOutput("y", binary_data=True),
            ],
        )
    finally:
        client.close()
    y = result.as_numpy("y")
    assert result.get_output("y")["datatype"] == "BF16"
    assert y.dtype == BF16 and y.astype(np.float32).tolist() == (x.astype(np.float32) * 2).tolist()
    assert result.as_numpy("tag_upper").tolist() == [b"AB", b"C"]


def test_concurrent_text_requests_are_batched_and_each_gets_its_own_answer(serve) -> None:
    model = TextModel()
    server = serve(model, warmup_repeats=0, max_batch_size=32)
    requests_words = [[f"req{i}-{j}-ü" for j in range(1 + i % 3)] for i in range(12)]
    model.release.clear()  # hold the first batch so the others queue up behind it

    def ask(words: list[str]) -> list[str]:
        body, headers = text_request(words, binary_input=len(words) % 2 == 0, binary_output=False)
        reply = requests.post(
            f"{server.url}/v2/models/text/infer", data=body, headers=headers, timeout=30
        )
        assert reply.status_code == 200, reply.text
        return read_response(reply)["upper"][1]

    with ThreadPoolExecutor(len(requests_words)) as pool:
        first = pool.submit(ask, requests_words[0])
        assert model.entered.wait(timeout=10)
        rest = [pool.submit(ask, words) for words in requests_words[1:]]
        queued = sum(len(words) for words in requests_words[1:])
        deadline = time.monotonic() + 20
        while server.batcher.queued_items < queued and time.monotonic() < deadline:
            time.sleep(0.01)
        model.release.set()
        answers = [first.result(timeout=30), *(f.result(timeout=30) for f in rest)]
    assert answers == [[w.upper() for w in words] for words in requests_words]
    assert max(model.requests_per_call) > 1  # the queued requests shared a batch


def test_malformed_bytes_get_400_and_never_reach_the_model(serve) -> None:
    model = TextModel()
    server = serve(model, warmup_repeats=0)
    url = f"{server.url}/v2/models/text/infer"
    bad_json = {"inputs": [{"name": "text", "shape": [2], "datatype": "BYTES", "data": ["a", 7]}]}
    reply = requests.post(url, json=bad_json, timeout=10)
    assert reply.status_code == 400 and "must be strings" in reply.json()["error"]

    raw = struct.pack("<I", 99) + b"short"
    tensor = {"name": "text", "shape": [1], "datatype": "BYTES"}
    tensor["parameters"] = {"binary_data_size": len(raw)}
    header = json.dumps({"inputs": [tensor]}).encode()
    reply = requests.post(
        url, data=header + raw, headers={oip.HEADER_LENGTH: str(len(header))}, timeout=10
    )
    assert reply.status_code == 400 and "announces 99 bytes" in reply.json()["error"]
    assert model.requests_per_call == []
