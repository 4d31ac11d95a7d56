"""Where answers go: the output and errors JSONL files, committed through the journal.

Completions arrive in any order. In ``input`` order a result is held until every earlier line of
the run has one, so the output lists lines in file order (held results are bounded by the
runner's read-ahead window); ``completion`` order writes each as it arrives, with its line and id
in the record. Either way :meth:`ResultLog.commit` is the one place that writes: records, fsync,
then the journal entry (see :mod:`jobs.journal` for why that order makes resume exact).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from autoglm.config import ConfigError
from jobs.journal import Journal, ResumePoint

Outcome = Literal["ok", "invalid"]


@dataclass(frozen=True)
class Completion:
    """The final answer for one input line: a result (ok) or an error record (invalid)."""

    seq: int  # position among the lines this run handles, for input order
    line: int  # 1-based line number in the input file
    outcome: Outcome
    record: dict[str, Any]


class ResultLog:
    """The output and errors files of one shard, cut back to the journal's last entry."""

    def __init__(
        self,
        output: Path,
        errors: Path,
        journal: Journal,
        resume: ResumePoint,
        ordered: bool,
    ) -> None:
        self.journal = journal
        self.ordered = ordered
        self._output = _open_at(output, resume.output_bytes)
        self._errors = _open_at(errors, resume.errors_bytes)
        self._staged: dict[int, Completion] = {}
        self.next_seq = 0  # input order: the first seq not yet written

    @property
    def staged(self) -> int:
        """Completions received but not yet committed (in input order, some wait for others)."""
        return len(self._staged)

    def add(self, completion: Completion) -> None:
        self._staged[completion.seq] = completion

    def commit(self) -> list[Completion]:
        """Write what is ready, fsync, journal it; returns the completions now durable."""
        if self.ordered:
            ready = []
            while self.next_seq in self._staged:
                ready.append(self._staged.pop(self.next_seq))
                self.next_seq += 1
        else:
            ready = sorted(self._staged.values(), key=lambda c: c.seq)
            self._staged.clear()
        if not ready:
            return []
        for completion in ready:
            target = self._output if completion.outcome == "ok" else self._errors
            target.write(json.dumps(completion.record, separators=(",", ":")).encode() + b"\n")
        for handle in (self._output, self._errors):
            handle.flush()
            os.fsync(handle.fileno())
        self.journal.commit(self._output.tell(), self._errors.tell(), (c.line for c in ready))
        return ready

    def close(self) -> None:
        self._output.close()
        self._errors.close()
        self.journal.close()


def _open_at(path: Path, size: int) -> Any:
    """Open ``path`` for appending after its first ``size`` bytes, dropping anything beyond."""
    if not path.exists():
        if size:
            raise ConfigError(
                f"{str(path)!r} is missing but the journal says it holds {size} bytes of "
                "results; restore it, or remove the journal to start over"
            )
        path.touch()
    actual = path.stat().st_size
    if actual < size:
        raise ConfigError(
            f"{str(path)!r} is shorter ({actual} bytes) than the journal records ({size}); "
            "it was changed outside the job: restore it, or remove the journal to start over"
        )
    handle = path.open("r+b")
    handle.truncate(size)
    handle.seek(size)
    return handle
