"""The predictor bench's smoke mode runs on the real traces and writes a consistent report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoglm.datasets import expected_path, fetch_hint

ROOT = Path(__file__).resolve().parents[2]
# The bench's bounds from hindsight as (narrower, wider) choices: a choice per block can do what
# one per cell does, weights what a single pick does, a pick per point what one per block does.
ORACLE_ORDER = (
    ("oracle", "block_oracle"),
    ("oracle", "cell_weights_oracle"),
    ("block_oracle", "block_weights_oracle"),
    ("cell_weights_oracle", "block_weights_oracle"),
    ("block_oracle", "point_oracle"),
)
TRACE = expected_path("genai-requests")


@pytest.mark.slow
@pytest.mark.skipif(
    not TRACE.is_file(), reason=f"needs the whole trace: {fetch_hint('genai-requests')}"
)
def test_smoke_bench_scores_every_horizon_against_the_best_baseline(tmp_path):
    out = tmp_path / "predictor.json"
    subprocess.run(
        [sys.executable, str(ROOT / "bench/predictor.py"), "--smoke", "--json", str(out)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    report = json.loads(out.read_text())
    (series,) = report["series"].values()
    (window,) = series["windows"]
    horizons = [str(h) for h in report["horizons"]]
    assert list(window["ratio"]) == horizons
    for h in horizons:
        baseline = window["best_baseline"][h]
        baselines = [n for n in window["models"] if n == "naive" or "seasonal_naive" in n]
        assert len(baselines) == 3  # the last value, yesterday's and last week's copies
        assert baseline == min(window["models"][n][h] for n in baselines)
        assert window["ratio"][h] == pytest.approx(window["selected"][h] / baseline, abs=2e-3)
        oracle = min(v[h] for v in window["models"].values())
        assert window["oracle_ratio"][h] == pytest.approx(oracle / baseline, abs=2e-3)
        assert 0 < window["coverage"][h] <= 100
        low, high = window["coverage_interval"][h]
        assert low <= window["coverage"][h] <= high
        for narrower, wider in ORACLE_ORDER:
            assert window[f"{wider}_ratio"][h] <= window[f"{narrower}_ratio"][h] + 2e-3
    check = report["summary"]["check"]
    assert check["cells"] == len(horizons)
    assert check["worst_ratio"] == max(window["ratio"].values())
    assert check["cells_outside_coverage_goal_beyond_noise"] >= 0
    assert 0 < check["chance_every_cell_inside_if_calibrated"] <= 1
    assert 0 <= check["cells_outside_coverage_goal_if_calibrated"] < check["cells"]
    assert check["cells_outside_coverage_goal_beyond_noise"] <= check["cells_outside_coverage_goal"]
