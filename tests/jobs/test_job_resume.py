"""A real runner process killed mid-run and resumed: every line answered exactly once."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import requests

from autoglm.ports import free_port
from tests.jobs.conftest import (
    MALFORMED,
    assert_answers_match,
    expected_logits,
    records,
    write_requests,
)
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(240)

LINES = 1500


def start_runner(tmp_path: Path, endpoint: str, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [
            sys.executable, "-m", "jobs.cli", "run",
            "--input", str(tmp_path / "in.jsonl"),
            "--output", str(tmp_path / "out.jsonl"),
            "--endpoint", endpoint,
            "--model", "demo",
            "--commit-every", "7",
            "--commit-interval-seconds", "0.05",
            "--max-concurrency", "16",
            *extra,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip


def journal_entries(tmp_path: Path) -> int:
    path = tmp_path / "out.jsonl.journal"
    return path.read_bytes().count(b"\n") - 1 if path.exists() else 0


def wait_for_entries(proc: subprocess.Popen, tmp_path: Path, entries: int) -> None:

    def journalled() -> bool:
        if journal_entries(tmp_path) >= entries:
            return True
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        return False

    wait_until(journalled, timeout=120, what="the runner to make progress", interval=0.01)


def assert_each_line_exactly_once(tmp_path: Path, source: Path, order: str = "input") -> None:
    out = records(tmp_path / "out.jsonl")
    errors = records(tmp_path / "out.errors.jsonl")
    expected = expected_logits(source)
    lines = [r["line"] for r in out]
    if order == "completion":
        assert len(lines) == len(set(lines))
        lines.sort()
    assert lines == sorted(expected)  # none lost or twice (and in input order unless asked)
    assert sorted(e["line"] for e in errors) == sorted(MALFORMED)
    assert_answers_match(out, expected)


@pytest.mark.parametrize("order", ["input", "completion"])
def test_sigkill_at_random_points_then_resume_answers_every_line_once(
    tmp_path, batcher, order: str
) -> None:
    source = write_requests(tmp_path / "in.jsonl", LINES)
    server = batcher()
    rng = random.Random(14)
    for _ in range(3):
        proc = start_runner(tmp_path, server.url, "--order", order)
        wait_for_entries(proc, tmp_path, journal_entries(tmp_path) + 4)
        time.sleep(rng.uniform(0, 0.05))  # anywhere between two commits, or inside one
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stderr.close()
    done_before_last = journal_entries(tmp_path)
    final = start_runner(tmp_path, server.url, "--order", order)
    _, stderr = final.communicate(timeout=180)
    assert final.returncode == 1, stderr  # finished; the malformed lines are in the errors file
    assert journal_entries(tmp_path) > done_before_last
    assert_each_line_exactly_once(tmp_path, source, order)
    resumed = [json.loads(line) for line in stderr.splitlines() if '"job started"' in line]
    assert resumed and resumed[0]["done_before"] > 0


def test_sigterm_commits_and_exits_3_and_a_rerun_resumes(tmp_path, batcher) -> None:
    source = write_requests(tmp_path / "in.jsonl", LINES)
    server = batcher()
    proc = start_runner(tmp_path, server.url)
    wait_for_entries(proc, tmp_path, 3)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3, stderr
    assert "run again to resume" in stderr
    partial = records(tmp_path / "out.jsonl")
    assert 0 < len(partial) < LINES - len(MALFORMED)
    final = start_runner(tmp_path, server.url)
    _, stderr = final.communicate(timeout=180)
    assert final.returncode == 1, stderr
    assert_each_line_exactly_once(tmp_path, source)


def test_progress_lines_and_metrics_while_the_endpoint_refuses(tmp_path, scripted) -> None:
    endpoint = scripted(lambda body, attempt: (429, {"Retry-After": "0.1"}))
    write_requests(tmp_path / "in.jsonl", 40, malformed={})
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "jobs.cli", "run",
            "--input", str(tmp_path / "in.jsonl"),
            "--output", str(tmp_path / "out.jsonl"),
            "--endpoint", endpoint.url, "--model", "fake", "--job-name", "nightly",
            "--initial-concurrency", "8",
            "--metrics-listen", f"127.0.0.1:{port}",
            "--progress-interval-seconds", "0.2",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:

        def settled_at_one() -> str:
            assert proc.poll() is None
            try:
                text = requests.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
            except requests.ConnectionError:
                return ""
            return text if 'autoglm_job_concurrency{job_name="nightly"} 1.0' in text else ""

        text = wait_until(
            settled_at_one, timeout=60, what="the job's concurrency to settle at 1", interval=0.1
        )
        refusals = float(
            text.split('autoglm_job_refusals_total{job_name="nightly"} ')[1].split()[0]
        )
        assert refusals >= 3  # 8 -> 4 -> 2 -> 1 took at least three refusals
        assert 'autoglm_job_lines_remaining{job_name="nightly"} 40.0' in text
        assert 'autoglm_job_lines_total{job_name="nightly",outcome="ok"} 0.0' in text
    finally:
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3
    progress = [json.loads(line) for line in stderr.splitlines() if '"msg": "progress"' in line]
    assert progress and progress[-1]["total"] == 40 and progress[-1]["eta"] == "unknown"
    assert progress[-1]["refusals"] >= refusals
