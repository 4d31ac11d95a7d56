"""The job's record of committed work, so an interrupted run resumes with no line lost or twice.

Crash consistency comes from the order of writes, not from locks: a batch of results is written
to the output and errors files and fsynced *before* one journal entry naming those lines and the
two files' sizes is appended and fsynced. On resume the files are cut back to the sizes of the
last complete entry, which removes anything written after it (a result whose line is not yet
journaled, or half a record), and every journaled line is skipped. A torn last journal entry
(killed mid-write) fails to parse and is dropped with the results it would have covered, which
are then asked again. So whatever instant the process dies at, each line ends up exactly once in
the output or the errors file.

The first entry is a header naming the shard and the output order; resuming with other settings
would mix two runs' numbering, so it is refused.
"""

from __future__ import annotations

import bisect
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from autoglm.config import ConfigError

JOURNAL_VERSION = 1


class LineSet:
    """Line numbers as sorted, merged inclusive ranges: a million done lines cost a few ranges."""

    def __init__(self, ranges: Iterable[tuple[int, int]] = ()) -> None:
        self._starts: list[int] = []
        self._ends: list[int] = []
        for start, end in sorted(ranges):
            self._add_range(start, end)

    def _add_range(self, start: int, end: int) -> None:
        if self._ends and start <= self._ends[-1] + 1:
            self._ends[-1] = max(self._ends[-1], end)
        else:
            self._starts.append(start)
            self._ends.append(end)

    def __contains__(self, line: object) -> bool:
        if not isinstance(line, int):
            return False
        i = bisect.bisect_right(self._starts, line) - 1
        return i >= 0 and line <= self._ends[i]

    def __len__(self) -> int:
        return sum(e - s + 1 for s, e in zip(self._starts, self._ends, strict=True))

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))


def to_ranges(lines: Iterable[int]) -> list[list[int]]:
    """Sorted inclusive ``[first, last]`` runs of consecutive numbers, the journal's form."""
    runs: list[list[int]] = []
    for line in sorted(lines):
        if runs and line == runs[-1][1] + 1:
            runs[-1][1] = line
        else:
            runs.append([line, line])
    return runs


@dataclass
class ResumePoint:
    """What earlier runs committed: the lines done and the file sizes that hold their results."""

    done: LineSet = field(default_factory=LineSet)
    output_bytes: int = 0
    errors_bytes: int = 0


class Journal:
    """An append-only JSONL journal at ``path``; :meth:`open` creates or resumes it."""

    def __init__(self, path: Path, handle: Any) -> None:
        self.path = path
        self._handle = handle

    @classmethod
    def open(cls, path: str | Path, header: dict[str, Any]) -> tuple[Journal, ResumePoint]:
        """Create the journal, or read it back, cut off a torn tail and check its header."""
        path = Path(path)
        expected = {"journal": JOURNAL_VERSION, **header}
        if not path.exists() or path.stat().st_size == 0:
            created = path.open("wb")
            created.write(json.dumps(expected).encode() + b"\n")
            _sync(created)
            _sync_directory(path.parent)
            return cls(path, created), ResumePoint()
        resume, good_bytes = _read_journal(path, expected)
        handle = path.open("r+b")
        handle.truncate(good_bytes)
        handle.seek(good_bytes)
        _sync(handle)
        return cls(path, handle), resume

    def commit(self, output_bytes: int, errors_bytes: int, lines: Iterable[int]) -> None:
        """Record that ``lines`` are answered within the first bytes of the result files.

        Call only after those files are fsynced up to the sizes given.
        """
        entry: dict[str, Any] = {"output_bytes": output_bytes, "errors_bytes": errors_bytes}
        entry["done"] = to_ranges(lines)
        self._handle.write(json.dumps(entry, separators=(",", ":")).encode() + b"\n")
        _sync(self._handle)

    def close(self) -> None:
        self._handle.close()


def _read_journal(path: Path, expected: dict[str, Any]) -> tuple[ResumePoint, int]:
    data = path.read_bytes()
    lines = data.split(b"\n")
    # The last element is what follows the last newline: empty, or a torn entry.
    complete, offset = lines[:-1], 0
    if not complete:
        raise ConfigError(
            f"journal {str(path)!r} has no complete header line; remove it to start over"
        )
    try:
        header = json.loads(complete[0])
    except json.JSONDecodeError:
        header = None
    if header != expected:
        raise ConfigError(
            f"journal {str(path)!r} was written by a run with other settings ({header}); "
            f"resume with the same shard and order settings, or remove the journal and its "
            "output files to start over"
        )
    offset = len(complete[0]) + 1
    ranges: list[tuple[int, int]] = []
    resume = ResumePoint()
    for raw in complete[1:]:
        try:
            entry = json.loads(raw)
            output_bytes, errors_bytes = int(entry["output_bytes"]), int(entry["errors_bytes"])
            done = [(int(a), int(b)) for a, b in entry["done"]]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            break
        ranges.extend(done)
        resume.output_bytes, resume.errors_bytes = output_bytes, errors_bytes
        offset += len(raw) + 1
    resume.done = LineSet(ranges)
    return resume, offset


def _sync(handle: Any) -> None:
    handle.flush()
    os.fsync(handle.fileno())


def _sync_directory(directory: Path) -> None:
    """Make a newly created file's name durable, not only its bytes."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
