"""bench/batcher_serving.py's smoke mode runs every way in end to end and writes its report.

Figures from a smoke run mean nothing (a few requests per point, on a busy machine); what is
checked is that each way in got answers (the three of the one-process batcher, the two REST
ways into the one started with ``--workers 2``, the minimal batcher and the model-free floor
server), that the report carries the top rates, CPU costs and ratios the full run is read by,
and that the MLServer column is skipped with the command that installs it when its venv is
absent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_serving_bench_smoke_answers_every_protocol(tmp_path: Path) -> None:
    out = tmp_path / "serving.json"
    absent = tmp_path / "no-venv" / "mlserver"
    run = subprocess.run(
        [
            *(sys.executable, "bench/batcher_serving.py", "--smoke"),
            *("--json", str(out), "--mlserver", str(absent)),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["smoke"] and report["passes"] == 1
    assert "bench/mlserver-venv" in report["mlserver_skipped"]
    assert "MLServer column skipped" in run.stdout
    assert report["workers"] == 2
    ways = ("rest-json", "rest-binary", "grpc", "rest-json-workers", "rest-binary-workers")
    for mode in (*ways, "minimal-json", "floor-json"):
        points = [p for p in report["points"] if p["mode"] == mode]
        assert sum(p["answered"] for p in points) > 0, mode
        assert all(p["server_cpu_seconds"] >= 0 for p in points)
        assert set(report["summary"]["modes"][mode]) == {
            "top_rate",
            "requests_per_server_cpu_second",
        }
    assert "mlserver-json" not in report["summary"]["modes"]
    assert set(report["summary"]["ratios"]) == {
        "rest-json-workers/rest-json rate",
        "rest-json-workers/rest-json cpu",
        "rest-binary-workers/rest-binary rate",
        "rest-binary-workers/rest-binary cpu",
        "rest-binary/rest-json rate",
        "rest-binary/rest-json cpu",
        "grpc/rest-json rate",
        "grpc/rest-json cpu",
        "rest-json/minimal-json rate",
        "rest-json/minimal-json cpu",
        "rest-json/floor-json rate",
        "rest-json/floor-json cpu",
    }
    assert "requests per server CPU-second" in run.stdout
    shares = report["summary"]["model_share"]
    # a row for every batcher way that held a rate whose CPU was measurable (over 10 ms)
    measured = {
        mode
        for mode, row in report["summary"]["modes"].items()
        if row["top_rate"]["median"] > 0
        and row["requests_per_server_cpu_second"]["median"] is not None  # NaN is written null
    }
    assert set(shares) == measured - {"mlserver-json", "minimal-json", "floor-json"}
    for row in shares.values():
        assert row["batch"] >= 1 and row["model_us_per_row"] > 0
        assert row["model_share"] > 0 and row["free_path_requests_per_cpu_second"] > 0
    assert ("free path" in run.stdout) == bool(shares)  # the table, when a way held a rate
    assert all(p["neighbour_cores"] > -0.5 for p in report["per_pass"])  # a number, sane
    # the host's steal is part of the other work, and no more than every core
    assert all(
        0 <= p["host_steal_cores"] <= min(p["neighbour_cores"] + 0.5, os.cpu_count() or 1)
        for p in report["per_pass"]
    )
    assert "other work took" in run.stdout
