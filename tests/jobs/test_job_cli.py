"""``autoglm job run``: bad settings are one line and exit 2, before any work."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoglm.cli import main as umbrella
from jobs.cli import main
from jobs.config import JobConfig


@pytest.fixture
def files(tmp_path: Path) -> dict[str, str]:
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"inputs": [{"name": "input", "shape": [1], "datatype": "FP32", "data": [1]}]}\n'
    )
    return {"input": str(source), "output": str(tmp_path / "out.jsonl")}


def flags(files: dict[str, str], **extra: str) -> list[str]:
    values = {**files, "endpoint": "http://127.0.0.1:9", **extra}
    return ["run", *(f for k, v in values.items() for f in (f"--{k.replace('_', '-')}", v))]


def one_line_error(capsys: pytest.CaptureFixture[str], code: int) -> str:
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err, err
    return err


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"input": "/nonexistent/in.jsonl"}, "--input '/nonexistent/in.jsonl' cannot be read"),
        ({"output": "/nonexistent/dir/out.jsonl"}, "does not exist"),
        ({"output": "/proc/out.jsonl"}, "/proc/out.jsonl"),
        ({"endpoint": "batcher:8000"}, "must be an http:// or https:// URL"),
        ({"endpoint": "http://host:99999"}, "invalid port"),
        ({"shard_index": "3", "shard_count": "3"}, "--shard-index 3 must lie within 0..2"),
        ({"min_concurrency": "8", "max_concurrency": "4"}, "--min-concurrency"),
        ({"initial_concurrency": "0"}, "--initial-concurrency must be >= 1"),
        ({"max_rate": "-5"}, "--max-rate must be >= 0"),
        ({"ca_file": "/etc/hosts"}, "need an https:// --endpoint"),
        ({"username": "job"}, "needs both --username and --password-file"),
        ({"metrics_listen": "nine"}, "HOST:PORT"),
        # It would secure nothing: the job serves /metrics only with --metrics-listen.
        ({"web_config_file": "/etc/hosts"}, "serves only with --metrics-listen"),
        ({"order": "random"}, "invalid choice"),
        ({"priority": "urgent"}, "--priority 'urgent' is not a priority the batcher accepts"),
        ({"priority": "-1"}, '"best-effort", "online", an integer >= 0'),
        ({"priority": "²"}, "--priority '²'"),
        ({"priority": " 1"}, "--priority ' 1'"),
        ({"priority": "Best-Effort"}, "--priority 'Best-Effort'"),
    ],
)
def test_bad_settings_exit_2_with_one_line(files, capsys, extra, message) -> None:
    code = exit_code(flags(files, **extra))
    assert message in one_line_error(capsys, code)
    assert not Path(files["output"]).exists()  # nothing was started


def exit_code(argv: list[str]) -> int:
    """``main``'s return value, or the code it exits with (flag errors exit from argparse)."""
    try:
        return main(argv)
    except SystemExit as exc:
        return int(exc.code)


def test_results_without_a_journal_are_never_appended_to(files, capsys) -> None:
    Path(files["output"]).write_text('{"line": 1}\n')
    assert "has no journal" in one_line_error(capsys, main(flags(files)))
    assert Path(files["output"]).read_text() == '{"line": 1}\n'


def test_a_bad_shard_index_from_the_indexed_job_is_exit_2(files, capsys, monkeypatch) -> None:
    monkeypatch.setenv("JOB_COMPLETION_INDEX", "x")
    assert "JOB_COMPLETION_INDEX" in one_line_error(capsys, main(flags(files)))


@pytest.mark.parametrize("priority", ["best-effort", "online", "0", "1", "12", ""])
def test_every_priority_the_batcher_accepts_is_a_valid_setting(files, priority) -> None:
    assert JobConfig(**files, endpoint="http://b:8000", priority=priority).priority == priority


def test_the_shard_index_defaults_to_the_indexed_job_index(files) -> None:
    config = JobConfig(**files, endpoint="http://b:8000", shard_count=4)
    sharded = config.with_environment({"JOB_COMPLETION_INDEX": "2"})
    assert sharded.shard_index == 2
    assert sharded.sharded_output.name == "out-00002-of-00004.jsonl"
    assert sharded.journal_path.name == "out-00002-of-00004.jsonl.journal"
    assert sharded.errors_path.name == "out-00002-of-00004.errors.jsonl"
    assert config.with_environment({}).shard_index == 0
    given = JobConfig(**files, endpoint="http://b:8000", shard_count=4, shard_index=1)
    assert given.with_environment({"JOB_COMPLETION_INDEX": "2"}).shard_index == 1
    assert JobConfig(**files, endpoint="http://b:8000").sharded_output == Path(files["output"])


def test_the_yaml_file_and_the_flags_are_one_config(files, tmp_path, capsys) -> None:
    config_file = tmp_path / "job.yaml"
    config_file.write_text(f"input: {files['input']}\nendpoint: ftp://x\n")
    code = exit_code(["run", "--config", str(config_file), "--output", files["output"]])
    # The bad endpoint came from the file: the line names the file and its key.
    assert f"{config_file}: endpoint 'ftp://x' must be" in one_line_error(capsys, code)


def test_the_umbrella_command_reaches_the_job_runner(capsys) -> None:
    assert umbrella(["job"]) == 2
    assert umbrella(["job", "--help"]) == 0
    assert "run" in capsys.readouterr().out
