"""Reading the request file: which lines belong to this shard, and what each asks for.

A line is one KServe v2 inference request plus an optional ``model`` (else the job's ``--model``)
and an optional ``id`` of any JSON type, echoed in the result. Blank lines are not requests and
are skipped. A line that cannot be sent (not JSON, no ``inputs``...) is :class:`MalformedLine`,
reported with its number and never stops the job. The request class is set here, on every line,
so nothing in the file can make job traffic compete with online traffic.
"""

from __future__ import annotations

import json
from collections.abc import Container, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class MalformedLine(ValueError):
    """The line cannot become a request; the message says why, ``id`` is its id if it has one."""

    def __init__(self, message: str, id: Any = None) -> None:
        super().__init__(message)
        self.id = id


@dataclass(frozen=True)
class WorkItem:
    """One request ready to send."""

    line: int
    id: Any  # the line's own id (any JSON value), or None
    model: str
    body: dict[str, Any]


def shard_lines(
    path: str | Path, index: int, count: int, done: Container[int] = ()
) -> Iterator[tuple[int, bytes]]:
    """``(line number from 1, raw bytes)`` of the non-blank lines of shard ``index`` not done.

    Line number ``n`` belongs to shard ``(n - 1) % count``.
    """
    with Path(path).open("rb") as handle:
        for number, raw in enumerate(handle, start=1):
            if (number - 1) % count != index or number in done:
                continue
            if raw.strip():
                yield number, raw


def count_shard_lines(path: str | Path, index: int, count: int) -> int:
    """Request lines of shard ``index``, done or not: the job's total for progress and ETA."""
    return sum(1 for _ in shard_lines(path, index, count))


def parse_line(raw: bytes, line: int, default_model: str, priority: str) -> WorkItem:
    """The request a line asks for, with the job's request class set in its parameters."""
    try:
        document = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise MalformedLine(f"not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise MalformedLine('must be a JSON object with an "inputs" list')
    own_id = document.get("id")
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise MalformedLine('needs a non-empty "inputs" list', own_id)
    model = document.pop("model", None) or default_model
    if not isinstance(model, str) or not model:
        raise MalformedLine(
            'names no model: give "model" on the line or --model for the job', own_id
        )
    if "/" in model or model in (".", ".."):
        raise MalformedLine(f"model {model!r} is not a valid model name", own_id)
    parameters = document.get("parameters", {})
    if not isinstance(parameters, dict):
        raise MalformedLine('"parameters" must be a JSON object', own_id)
    body = {**document, "id": str(own_id) if own_id is not None else f"line-{line}"}
    parameters = dict(parameters)
    if priority:
        parameters["priority"] = int(priority) if priority.isdigit() else priority
    body["parameters"] = parameters
    return WorkItem(line=line, id=own_id, model=model, body=body)
