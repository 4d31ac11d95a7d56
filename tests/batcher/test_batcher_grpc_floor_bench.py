"""``bench/grpc_call_floor.py`` runs end to end: every way of serving gRPC it compares answers.

Figures from a smoke run mean nothing; what is checked is that each empty server style (grpc.aio
on asyncio and on uvloop, the sync server answering in its thread, through
``run_coroutine_threadsafe`` and through the queued hand-off) and the batcher's own gRPC and REST
JSON paths answered every call, and that the report has the shape the full runs are read by.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bench.test_bench_smokes import ROOT, run_bench

BENCH = "bench/grpc_call_floor.py"


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_floor_smoke_answers_every_server_style(tmp_path: Path) -> None:
    pytest.importorskip("uvloop")
    out = tmp_path / "floor.json"
    run = run_bench(BENCH, out)
    report = json.loads(out.read_text())
    styles = {
        "aio", "aio-uvloop", "sync", "sync-bridge", "sync-queue",
        "batcher-grpc", "batcher-rest-json",
    }  # fmt: skip
    assert report["smoke"] and report["rounds"] == 1
    assert set(report["us_per_call"]) == styles
    assert all(len(costs) == 1 and costs[0] > 0 for costs in report["us_per_call"].values())
    assert report["failed_calls"] == dict.fromkeys(styles, 0)
    assert "/ batcher REST JSON" in run.stdout


def test_an_unknown_style_is_refused_with_exit_2() -> None:
    run = subprocess.run(
        [sys.executable, BENCH, "--styles", "aio,nope"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "--styles takes aio,aio-uvloop" in run.stderr and "'aio,nope'" in run.stderr
