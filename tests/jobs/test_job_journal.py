"""The journal and the result files: what a resume finds after any crash point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoglm.config import ConfigError
from jobs.journal import Journal, LineSet, to_ranges
from jobs.results import Completion, ResultLog

HEADER = {"shard_index": 0, "shard_count": 1, "order": "completion"}


def open_log(tmp_path: Path, ordered: bool = False, header: dict | None = None) -> ResultLog:
    journal, resume = Journal.open(tmp_path / "out.journal", header or HEADER)
    return ResultLog(tmp_path / "out.jsonl", tmp_path / "err.jsonl", journal, resume, ordered)


def ok(seq: int, line: int) -> Completion:
    return Completion(seq, line, "ok", {"line": line, "outputs": [seq]})


def lines_in(path: Path) -> list[int]:
    return [json.loads(raw)["line"] for raw in path.read_text().splitlines()]


def test_line_set_merges_ranges_and_answers_membership() -> None:
    done = LineSet([(5, 7), (1, 2), (3, 3), (10, 10)])
    assert done.ranges() == [(1, 3), (5, 7), (10, 10)]
    assert [n for n in range(12) if n in done] == [1, 2, 3, 5, 6, 7, 10]
    assert len(done) == 7 and "3" not in done
    assert to_ranges([9, 1, 2, 3, 7]) == [[1, 3], [7, 7], [9, 9]]


def test_committed_lines_and_file_sizes_come_back_on_reopen(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    for seq, line in enumerate([1, 2, 4]):
        log.add(ok(seq, line))
    log.add(Completion(3, 3, "invalid", {"line": 3, "error": "bad"}))
    assert [c.line for c in log.commit()] == [1, 2, 4, 3]
    log.close()
    journal, resume = Journal.open(tmp_path / "out.journal", HEADER)
    journal.close()
    assert resume.done.ranges() == [(1, 4)]
    assert resume.output_bytes == (tmp_path / "out.jsonl").stat().st_size
    assert resume.errors_bytes == (tmp_path / "err.jsonl").stat().st_size
    assert lines_in(tmp_path / "out.jsonl") == [1, 2, 4]
    assert lines_in(tmp_path / "err.jsonl") == [3]


def test_results_written_after_the_last_entry_and_a_torn_entry_are_dropped(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.add(ok(0, 1))
    log.commit()
    log.close()
    # The process died after writing more results (one of them half) but before its journal
    # entry was complete.
    with (tmp_path / "out.jsonl").open("ab") as out:
        out.write(b'{"line":2,"outputs":[1]}\n{"line":3,"outp')
    with (tmp_path / "out.journal").open("ab") as journal:
        journal.write(b'{"output_bytes":999,"errors_bytes":0,"done":[[2')
    log = open_log(tmp_path)
    assert lines_in(tmp_path / "out.jsonl") == [1]
    assert not (tmp_path / "out.journal").read_bytes().endswith(b"[[2")
    log.add(ok(0, 2))
    log.add(ok(1, 3))
    log.commit()
    log.close()
    assert lines_in(tmp_path / "out.jsonl") == [1, 2, 3]
    journal, resume = Journal.open(tmp_path / "out.journal", HEADER)
    journal.close()
    assert resume.done.ranges() == [(1, 3)]


def test_input_order_holds_results_until_every_earlier_line_has_one(tmp_path: Path) -> None:
    log = open_log(tmp_path, ordered=True, header={**HEADER, "order": "input"})
    log.add(ok(2, 30))
    log.add(ok(0, 10))
    assert [c.line for c in log.commit()] == [10]
    assert log.staged == 1 and log.next_seq == 1
    log.add(Completion(1, 20, "invalid", {"line": 20, "error": "bad"}))
    assert [c.line for c in log.commit()] == [20, 30]
    log.close()
    assert lines_in(tmp_path / "out.jsonl") == [10, 30]


def test_a_journal_of_other_settings_is_refused(tmp_path: Path) -> None:
    open_log(tmp_path).close()
    with pytest.raises(ConfigError, match="other settings"):
        open_log(tmp_path, header={**HEADER, "shard_count": 2})


def test_result_files_shorter_than_the_journal_says_are_refused(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.add(ok(0, 1))
    log.commit()
    log.close()
    (tmp_path / "out.jsonl").write_bytes(b"")
    with pytest.raises(ConfigError, match="shorter"):
        open_log(tmp_path)
    (tmp_path / "out.jsonl").unlink()
    with pytest.raises(ConfigError, match="missing"):
        open_log(tmp_path)
