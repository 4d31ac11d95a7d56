"""``bench/batcher_backfill.py --smoke`` end to end: a real server, the online load, the job.

The smoke run's figures are meaningless (seconds per phase, a shared machine); this checks that
the benchmark runs unattended and reports what it claims to, from the server's own counters.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_smoke_run_measures_both_phases_and_writes_the_report(tmp_path: Path) -> None:
    out = tmp_path / "backfill.json"
    run = subprocess.run(
        [sys.executable, "bench/batcher_backfill.py", "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert "-- summary" in run.stdout
    report = json.loads(out.read_text())
    simulated = report["simulated"]
    assert {row["quantum"] for row in simulated} == {"default (0.1 SLO)", "0.25 SLO", "none"}
    for row in simulated:
        assert row["alone"]["best_effort_busy_share"] == 0
        assert row["with_job"]["best_effort_items"] > 0  # the job is served on idle capacity
        assert row["with_job"]["busy_share"] > row["alone"]["busy_share"]
    http = report["http"]
    assert http["peak"] > 0 and http["one_item_seconds"] > 0
    phases = http["phases"]
    assert [p["job"] for p in phases] == [False, True]
    alone, mixed = phases
    for phase in phases:
        assert phase["sent"] > 0
        assert 0 < phase["busy_share"] <= 1.05
        assert phase["busy_share"] == pytest.approx(
            phase["online_busy_share"] + phase["best_effort_busy_share"]
        )
        assert phase["quantum_seconds"] > 0
    assert alone["best_effort_busy_share"] == 0 and alone["best_effort_served"] == 0
    counts = mixed["job_client_counts"]  # the job ran, was answered, and stopped on SIGTERM
    assert counts["ok"] + counts["refused"] + counts["timed_out"] >= 1
    assert counts["failed"] == 0  # every answer was a result, a refusal or a timeout
    (line,) = http["summary"]
    assert line["ratio_worst_case"] >= 1.0
    assert set(line) >= {"p99_ratio_median", "busy_with_job", "p99_goal_met", "busy_goal_met"}
