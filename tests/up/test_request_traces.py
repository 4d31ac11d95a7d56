"""``autoglm up --trace-file`` takes a dataset name or a path, as every trace option does."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from autoglm.config import ConfigError
from autoglm.datasets import ENV_TRACES_DIR, EXCERPTS
from stack.config import UpConfig
from stack.profiles import TraceProfile, profile_from_config, read_trace
from stack.request_traces import BIN_SECONDS


def test_an_hourly_excerpt_replays_its_counts() -> None:
    times, counts = read_trace("genai-requests-hourly")
    with EXCERPTS["genai-requests-hourly"].path.open() as handle:
        rows = list(csv.DictReader(handle))
    assert counts == tuple(float(r["requests"]) for r in rows)
    assert times[:3] == (0.0, 3600.0, 7200.0)


def test_a_request_per_row_excerpt_is_counted_per_minute() -> None:
    times, counts = read_trace("azure-llm-code-10min")
    with EXCERPTS["azure-llm-code-10min"].path.open() as handle:
        requests = sum(1 for _ in handle) - 1
    assert sum(counts) == requests
    assert times == tuple(BIN_SECONDS * i for i in range(len(times)))
    assert len(times) == 10  # ten minutes


def test_the_trace_profile_plays_a_named_dataset() -> None:
    profile = profile_from_config(
        UpConfig(profile="trace", trace_file="azure-llm-conv-10min", peak_rps=40.0)
    )
    assert isinstance(profile, TraceProfile)
    assert (profile.times, profile.counts) == read_trace("azure-llm-conv-10min")
    assert max(profile.rate(t / 100) for t in range(1000)) <= 40.0


def test_a_path_still_wins_over_a_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "azure-llm-code-10min").write_text("offset_seconds,requests\n0,1\n60,3\n")
    assert read_trace("azure-llm-code-10min") == ((0.0, 60.0), (1.0, 3.0))


def test_a_trace_not_fetched_names_the_fetch_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(ENV_TRACES_DIR, str(tmp_path))
    with pytest.raises(ConfigError, match=r"--trace-file: .*autoglm datasets fetch azure-llm-conv"):
        read_trace("azure-llm-conv")


def test_traces_of_something_else_than_requests_are_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"not a request trace .*timestamp_anon"):
        read_trace("genai-gpu-duty-cycle-mean")
    archive = tmp_path / "duty.tar.gz"
    archive.write_bytes(b"\x1f\x8b\x08\x00\xff\xfe")
    with pytest.raises(ConfigError, match="is not a CSV file; give offset_seconds,requests"):
        read_trace(archive)


def test_an_aggregate_with_a_bad_row_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "hourly.csv"
    bad.write_text("hour,requests\n2024-01-01 00:00,3\nnot a time,4\n")
    with pytest.raises(ConfigError, match="every row needs a time in 'hour'"):
        read_trace(bad)


def test_a_trace_file_without_the_trace_profile_is_refused() -> None:
    """The synthetic profiles ignore --trace-file: it would be a replay asked for and not run."""
    with pytest.raises(ConfigError, match=r"--trace-file is replayed by --profile trace only"):
        UpConfig(profile="ramp", trace_file="azure-llm-conv-10min")
