"""A job made ready to run: its settings checked against the file system, its journal read.

Everything here happens before any request is sent, so a problem is a :class:`ConfigError` (one
line, exit 2) and never a half-started job: the input is readable, the output, errors and journal
paths are writable, results without a journal are never appended to, and the journal belongs to
this shard and order. The result files come back open where the last run's journal ends.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from autoglm.config import ConfigError
from jobs.config import JobConfig
from jobs.input import count_shard_lines
from jobs.journal import Journal, ResumePoint
from jobs.results import ResultLog


@dataclass
class JobPlan:
    """A prepared job: settings checked, journal read, result files open at the resume point."""

    config: JobConfig
    total: int
    resume: ResumePoint
    invalid_before: int
    results: ResultLog


def prepare(config: JobConfig) -> JobPlan:
    """Check the files and open the shard's journal; a problem is a :class:`ConfigError`.

    A shard index left at -1 comes from ``$JOB_COMPLETION_INDEX``, as an Indexed Job sets it.
    """
    config = config.with_environment(os.environ)
    _check_readable(Path(config.input), "--input")
    for flag, name in (
        ("--ca-file", config.ca_file),
        ("--cert-file", config.cert_file),
        ("--key-file", config.key_file),
        ("--password-file", config.password_file),
    ):
        if name:
            _check_readable(Path(name), flag)
    output, errors, journal_path = config.sharded_output, config.errors_path, config.journal_path
    for path, flag in ((output, "--output"), (errors, "--errors"), (journal_path, "--journal")):
        _check_writable(path, flag)
    if not journal_path.exists() and output.exists() and output.stat().st_size > 0:
        raise ConfigError(
            f"--output {str(output)!r} already holds results but has no journal "
            f"{str(journal_path)!r} to resume from; remove it or choose another --output"
        )
    header = {
        "shard_index": config.shard_index,
        "shard_count": config.shard_count,
        "order": config.order,
    }
    try:
        journal, resume = Journal.open(journal_path, header)
    except OSError as exc:
        raise ConfigError(f"--journal {str(journal_path)!r}: {exc.strerror}") from None
    try:
        results = ResultLog(output, errors, journal, resume, ordered=config.order == "input")
    except OSError as exc:
        journal.close()
        raise ConfigError(f"cannot open the result files: {exc}") from None
    except ConfigError:
        journal.close()
        raise
    with errors.open("rb") as handle:
        invalid_before = handle.read(resume.errors_bytes).count(b"\n")
    total = count_shard_lines(config.input, config.shard_index, config.shard_count)
    return JobPlan(config, total, resume, invalid_before, results)


def _check_readable(path: Path, flag: str) -> None:
    try:
        with path.open("rb"):
            pass
    except OSError as exc:
        raise ConfigError(f"{flag} {str(path)!r} cannot be read: {exc.strerror}") from None
    if path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a directory, not a file")


def _check_writable(path: Path, flag: str) -> None:
    directory = path.parent
    if not directory.is_dir():
        raise ConfigError(f"{flag} {str(path)!r}: directory {str(directory)!r} does not exist")
    if path.exists():
        if path.is_dir() or not os.access(path, os.W_OK):
            raise ConfigError(f"{flag} {str(path)!r} is not a writable file")
    elif not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigError(f"{flag} {str(path)!r}: directory {str(directory)!r} is not writable")
