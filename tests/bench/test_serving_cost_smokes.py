"""The serving-path cost benches' smoke modes run end to end and write their reports.

``bench/serving_path_parts.py`` (our code per step, in-process) and ``bench/serving_cost_ab.py``
(two servers from two trees, alternating): figures from a smoke run mean nothing; what is checked
is that every step and every way in was measured and that the report has the shape the full runs
are read by. The A/B compares this tree with itself, so it needs no git.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.bench.test_bench_smokes import ROOT, run_bench


@pytest.mark.timeout(900)
def test_path_parts_smoke_measures_every_codec_step_and_the_engine(tmp_path: Path) -> None:
    out = tmp_path / "parts.json"
    run_bench("bench/serving_path_parts.py", out)
    report = json.loads(out.read_text())
    steps = report["us_per_request"]
    for way in ("REST JSON", "REST binary"):
        assert steps[f"{way}: decode"] > 0 and steps[f"{way}: encode"] > 0
    assert steps["gRPC raw: decode"] > 0 and steps["gRPC typed contents: decode"] > 0
    for in_flight in (1, 8, 64):
        assert steps[f"engine, {in_flight} in flight"] > 0
    assert report["mean_batch_by_in_flight"]["1"] == 1.0


@pytest.mark.timeout(900)
def test_cost_ab_smoke_answers_every_way_into_both_trees(tmp_path: Path) -> None:
    out = tmp_path / "ab.json"
    run = run_bench("bench/serving_cost_ab.py", out, "--old", str(ROOT))
    report = json.loads(out.read_text())
    assert report["smoke"] and report["rounds"] == 1
    assert set(report["modes"]) == {"rest-json", "rest-binary", "grpc"}
    for row in report["modes"].values():
        assert len(row["old_us_per_request"]) == len(row["new_us_per_request"]) == 1
        assert row["old_median"] > 0 and row["new_median"] > 0
        assert len(row["new_over_old_per_round"]) == 1
    assert "new/old per round" in run.stdout


@pytest.mark.timeout(900)
def test_batcher_ab_smoke_measures_both_ways_and_their_inflation(tmp_path: Path) -> None:
    out = tmp_path / "batcher_ab.json"
    run = run_bench("bench/batcher_ab.py", out)
    report = json.loads(out.read_text())
    assert report["smoke"] and [row["way"] for row in report["summary"]] == ["thread", "process"]
    for point in report["points"]:
        assert point["answered"] > 0 and point["batches"] > 0
        assert point["batch_seconds"] > 0 and point["model_alone_seconds"] > 0
        assert point["inflation"] == point["batch_seconds"] / point["model_alone_seconds"]
        assert 0 <= point["turnaround_idle_share"] < 1
    assert "inflation" in run.stdout and "idle" in run.stdout


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ["--rates", "fast"],
            "--rates takes numbers separated by commas, e.g. 1000,2000; got 'fast'",
        ),
        (["--ways", "only=--model-process"], "--ways: give at least two ways to compare"),
        (["--ways", "a=,a=--model-process"], "--ways: way 'a' is given twice"),
        (["--ways", "a,b=--model-process"], "--ways: 'a' is not name=flags"),
    ],
)
def test_batcher_ab_refuses_bad_rates_and_ways_in_one_line(args: list[str], says: str) -> None:
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "bench/batcher_ab.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and says in run.stderr, run.stderr
