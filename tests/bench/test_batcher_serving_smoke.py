"""bench/batcher_serving.py's smoke mode runs every protocol end to end and writes its report.

Figures from a smoke run mean nothing; what is checked is that each protocol got answers from the
one server and that the report carries the ratios the full run is read by.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_serving_bench_smoke_answers_every_protocol(tmp_path: Path) -> None:
    out = tmp_path / "serving.json"
    run = subprocess.run(
        [sys.executable, "bench/batcher_serving.py", "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] and report["rounds"] == 1
    (round_points,) = report["per_round"]
    for mode in ("rest-json", "rest-binary", "grpc"):
        point = round_points[mode]
        assert point["requests"] > 0 and point["failures"] == 0, mode
        assert point["server_cpu_seconds"] > 0
    for mode in ("rest-binary", "grpc"):
        row = report["summary"][mode]
        ratio = round_points[mode]["rate"] / round_points["rest-json"]["rate"]
        assert row["rate_ratio_to_rest_json"] == pytest.approx(ratio)
    assert "requests per server CPU-s" in run.stdout
