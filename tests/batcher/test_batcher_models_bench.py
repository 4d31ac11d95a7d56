"""``bench/batcher_models.py --smoke`` end to end: the simulated section, the engines in real time
and a real repository server with two models. The simulated section is exact (virtual time), so
its verdict is checked; the real-time figures of a smoke run on a shared machine are not."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_smoke_run_reports_both_sections_and_the_simulated_goal_holds(tmp_path: Path) -> None:
    out = tmp_path / "models.json"
    run = subprocess.run(
        [sys.executable, "bench/batcher_models.py", "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    simulated = report["simulated"]
    assert (
        simulated["verdict"]["met"]
        and simulated["verdict"]["steady_within_slo_under_burst"] >= 0.99
    )
    burst = simulated["phases"]["burst on bursty"]
    assert burst["bursty"]["refused"] > 0  # the burst was more than the device could serve
    assert burst["steady"]["sent"] == burst["steady"]["answered"]
    assert set(report["in_process"]["phases"]) == {"steady alone", "both calm", "burst on bursty"}
    http = report["http"]["phases"]
    assert set(http) == {"steady alone", "both calm", "burst on bursty"}
    assert http["burst on bursty"]["models"]["bursty"]["sent"] > 0
    assert "in SLO" in run.stdout and "in-process verdict" in run.stdout
    assert "HTTP verdict" in run.stdout
