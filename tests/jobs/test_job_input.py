"""Reading the request file: shards, skipped lines and what each line becomes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from jobs.input import MalformedLine, count_shard_lines, parse_line, shard_lines

INPUTS = [{"name": "input", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]}]


def test_line_i_goes_to_shard_i_mod_count_and_blank_lines_are_skipped(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    path.write_text("a\nb\n\nd\ne\n  \ng\n")
    shards = [[n for n, _ in shard_lines(path, i, 3)] for i in range(3)]
    assert shards == [[1, 4, 7], [2, 5], []]
    assert [count_shard_lines(path, i, 3) for i in range(3)] == [3, 2, 0]
    assert [n for n, _ in shard_lines(path, 0, 1, done={1, 2, 5})] == [4, 7]


def test_the_job_sets_its_request_class_on_every_line() -> None:
    raw = json.dumps({"id": 7, "inputs": INPUTS, "parameters": {"priority": 1, "timeout": 5}})
    item = parse_line(raw.encode(), 3, "demo", "best-effort")
    assert item.line == 3 and item.id == 7 and item.model == "demo"
    assert item.body["parameters"] == {"priority": "best-effort", "timeout": 5}
    assert item.body["id"] == "7"  # the v2 protocol takes a string id; the result echoes 7
    assert parse_line(raw.encode(), 3, "demo", "2").body["parameters"]["priority"] == 2
    assert parse_line(raw.encode(), 3, "demo", "").body["parameters"]["priority"] == 1


def test_a_line_names_its_own_model_and_lines_without_id_get_one() -> None:
    item = parse_line(json.dumps({"model": "other", "inputs": INPUTS}).encode(), 9, "demo", "")
    assert item.model == "other" and "model" not in item.body
    assert item.id is None and item.body["id"] == "line-9"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'{"id": 1}', 'non-empty "inputs"'),
        (b'{"inputs": []}', 'non-empty "inputs"'),
        (json.dumps({"inputs": INPUTS, "model": "a/b"}).encode(), "not a valid model"),
        (json.dumps({"inputs": INPUTS, "parameters": [1]}).encode(), "parameters"),
    ],
)
def test_malformed_lines_say_why(raw: bytes, message: str) -> None:
    with pytest.raises(MalformedLine, match=message):
        parse_line(raw, 1, "demo", "best-effort")


def test_a_line_without_model_needs_the_job_default() -> None:
    with pytest.raises(MalformedLine, match="names no model") as exc:
        parse_line(json.dumps({"id": "x", "inputs": INPUTS}).encode(), 1, "", "best-effort")
    assert exc.value.id == "x"
