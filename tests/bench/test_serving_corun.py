"""``bench/serving_corun.py``: the co-run verdict's arithmetic, its refusals, and its smoke run.

The verdict ("out of reach: no batch size fits") rests on three small functions: the model's rows
a second inside the client's window, the three conditions of a fit, and the summary over passes.
They are checked against figures worked by hand; the smoke proves the floor answers while the
model runs beside it and that the report has the shape the notes read.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.serving_corun import (
    closeness,
    fits,
    fits_one_executor,
    model_in_window,
    one_executor_p99_ms,
    summarise,
    verdict,
)
from tests.bench.test_bench_smokes import ROOT, run_bench


def test_rows_in_the_window_count_straddling_batches_by_the_part_inside() -> None:
    spans = [(0.0, 1.0), (1.0, 2.0), (2.0, 3.0), (3.0, 4.0)]
    found = model_in_window(spans, 0.5, 3.5, batch=10)
    # half of the first, the two whole ones, half of the last: 30 rows in 3 seconds
    assert found["rows_per_second"] == pytest.approx(10.0)
    assert found["batches"] == 2  # only those wholly inside are timed
    assert found["batch_ms_p50"] == pytest.approx(1000.0)


def test_the_slowest_percent_of_batches_sets_the_batch_p99() -> None:
    spans = [(float(i), i + 0.05) for i in range(99)] + [(99.0, 99.5)]
    found = model_in_window(spans, 0.0, 100.0, batch=1)
    assert found["batch_ms_p99"] == pytest.approx(500.0)
    assert found["batch_ms_p50"] == pytest.approx(50.0)


def test_a_window_without_a_whole_batch_has_no_batch_time_and_an_empty_one_is_refused() -> None:
    found = model_in_window([(0.0, 10.0)], 2.0, 4.0, batch=100)
    assert found["rows_per_second"] == pytest.approx(10.0)
    assert found["batches"] == 0 and found["batch_ms_p99"] == float("inf")
    with pytest.raises(ValueError, match="positive length"):
        model_in_window([], 1.0, 1.0, batch=1)


def point(
    held: bool, rows: float, batch_p99_ms: float, rate: float = 1000.0, batch_p50_ms: float = 10.0
) -> dict:
    found = {
        "rate": rate,
        "floor_held": held,
        "model": {
            "rows_per_second": rows,
            "batch_ms_p99": batch_p99_ms,
            "batch_ms_p50": batch_p50_ms,
        },
        "model_share": rows / rate,
        "batch_ok": batch_p99_ms <= 100.0,
    }
    found["fits"] = fits(found, rate, 0.1)
    return found


def test_a_fit_needs_the_floor_held_the_model_keeping_up_and_its_batch_inside_the_slo() -> None:
    assert fits(point(True, 1000.0, 100.0), 1000.0, 0.1)
    assert not fits(point(False, 5000.0, 10.0), 1000.0, 0.1)
    assert not fits(point(True, 999.0, 10.0), 1000.0, 0.1)
    assert not fits(point(True, 5000.0, 100.1), 1000.0, 0.1)
    assert verdict([point(True, 999.0, 10.0), point(True, 1000.0, 50.0)], 1000.0, 0.1).startswith(
        "fits"
    )
    assert verdict([point(True, 999.0, 10.0), point(False, 2000.0, 50.0)], 1000.0, 0.1).startswith(
        "out of reach"
    )


def test_the_next_rate_tries_first_the_points_whose_latency_held_then_the_larger_share() -> None:
    slow_batch = point(True, 990.0, 150.0)
    near = point(True, 900.0, 60.0)
    far = point(True, 500.0, 60.0)
    assert sorted([far, slow_batch, near], key=closeness, reverse=True) == [near, far, slow_batch]


def test_one_executor_waits_for_the_running_batch_then_its_own() -> None:
    # busy all the time: the rest of the running batch (uniform) and its own, 2 - 0.01 batches
    assert one_executor_p99_ms(point(True, 1000.0, 60.0, batch_p50_ms=50.0), 1000.0) == (
        pytest.approx(99.5)
    )
    # busy half the time: half the arrivals find it idle, 2 - 0.02 batches
    assert one_executor_p99_ms(point(True, 2000.0, 60.0, batch_p50_ms=50.0), 1000.0) == (
        pytest.approx(99.0)
    )
    # busy under 1% of the time: at least its own batch
    assert one_executor_p99_ms(point(True, 1e6, 60.0, batch_p50_ms=50.0), 1000.0) == 50.0
    fitting = point(True, 1000.0, 60.0, batch_p50_ms=50.0)
    assert fitting["fits"] and fits_one_executor(fitting, 1000.0, 0.1)
    long_batches = point(True, 1000.0, 90.0, batch_p50_ms=60.0)
    assert long_batches["fits"] and not fits_one_executor(long_batches, 1000.0, 0.1)


def test_the_summary_says_out_of_reach_only_when_every_pass_says_so() -> None:
    def one_pass(held_share: float, fitted: float, verdict: str) -> dict:
        grid = [
            point(True, held_share * 1000, 60.0, batch_p50_ms=50.0),
            point(False, 3000.0, 60.0),  # a share the floor paid for: not counted
        ]
        return {
            "verdict": verdict,
            "grids": {"8.0": grid},
            "highest_multiple_fitting": fitted,
            "mlserver_top_rate": 250.0,
        }

    passes = [one_pass(0.8, 6.0, "out of reach: ..."), one_pass(0.9, 7.0, "out of reach: ...")]
    found = summarise(passes, [8.0, 7.0, 6.0], 0.1)
    assert found["out_of_reach_in_every_pass"] and found["out_of_reach_in_most_passes"]
    assert found["best_model_share_at_target"] == pytest.approx(0.85)
    assert found["highest_multiple_fitting"] == 6.5
    assert found["mlserver_top_rate"] == 250.0
    assert found["one_executor_fits_target_in"] == 0
    passes.append(one_pass(1.2, 8.0, "fits: not out of reach by this bound"))
    found = summarise(passes, [8.0, 7.0, 6.0], 0.1)
    assert not found["out_of_reach_in_every_pass"] and found["out_of_reach_in_most_passes"]
    assert found["one_executor_fits_target_in"] == 1
    assert [p["one_executor_fits_at"] for p in passes] == [[], [], [8.0]]
    passes.append(one_pass(1.1, 8.0, "fits: not out of reach by this bound"))
    assert not summarise(passes, [8.0, 7.0, 6.0], 0.1)["out_of_reach_in_most_passes"]


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--multiples", "6,8"], "--multiples must go from the highest down"),
        (["--nice", "30"], "--nice takes values from 0 to 19"),
        (["--batches", "64,x"], "take numbers separated by commas"),
        (["--mlserver", "/no/such/mlserver"], "run bash bench/mlserver-venv, or --target-rate"),
        (["--from-json", "/no/such/report.json"], "--from-json /no/such/report.json: no such file"),
    ],
)
def test_bad_arguments_are_refused_before_any_server_starts(args: list[str], says: str) -> None:
    run = subprocess.run(
        [sys.executable, "bench/serving_corun.py", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2
    assert says in run.stderr


@pytest.mark.timeout(900)
def test_smoke_runs_the_floor_beside_the_model_and_reports_the_verdict(tmp_path: Path) -> None:
    out = tmp_path / "corun.json"
    run = run_bench("bench/serving_corun.py", out, "--target-rate", "100")
    report = json.loads(out.read_text())
    assert report["smoke"] and report["target_rate"] == 100
    (one,) = report["passes"]
    first = one["grids"]["8.0"][0]
    assert first["rate"] == 100 and first["floor_failures"] == 0
    assert first["model"]["rows_per_second"] > 0 and first["model"]["batches"] > 0
    assert one["verdict"] in (verdict([first], 100, report["slo_seconds"]),)
    assert "the target out of reach in most passes: " in run.stdout
    again = subprocess.run(
        [sys.executable, "bench/serving_corun.py", "--from-json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert again.returncode == 0
    # the same tables, from the report alone (the run's last line names the file it wrote)
    printed = again.stdout.splitlines()
    assert run.stdout.splitlines()[-1 - len(printed) : -1] == printed
