"""The combination rules that bench/predictor.py --rules replays (issue 19's fifth round): the
per-hour weights follow the expert that leads at each hour of the day, and only there."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autoglm.datasets import expected_path, fetch_hint

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def bench():
    saved = list(sys.path)
    try:
        spec = importlib.util.spec_from_file_location(
            "bench_predictor", ROOT / "bench/predictor.py"
        )
        assert spec and spec.loader
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path[:] = saved
    return module


def alternating(days: int = 10):
    """A daily series forecast by two experts: ``a`` exact in the first half of each day and 5
    too high in the second, ``b`` the other way round; their mean is 2.5 off everywhere."""
    hours = np.arange(24 * days)
    y = 10.0 + 5.0 * np.sin(2 * np.pi * hours / 24)
    actual = np.column_stack([np.append(y[h:], [np.nan] * h) for h in range(1, 9)])
    targets = (hours[:, None] + np.arange(1, 9)[None, :]) % 24  # the hour each forecast is for
    first_half = targets < 12
    a = actual + np.where(first_half, 0.0, 5.0)
    b = actual + np.where(first_half, 5.0, 0.0)
    points = {"a": a, "b": b, "ensemble": 0.5 * (a + b)}
    return dict(first=1, start=24 * 7, every=24, step=3600.0, day=24, points=points, actual=actual)


def test_per_hour_leader_is_the_expert_that_leads_at_that_hour(bench):
    inputs = alternating()
    rows = slice(24 * 7, 24 * 8)
    out = bench.weighted_rule(inputs, rows, mode="leader", shrink=1.0)
    actual = inputs["actual"][rows]
    ok = np.isfinite(actual)
    # Each hour's leader is exact there; the median ensemble is 2.5 off everywhere.
    assert np.abs(out - actual)[ok].max() < 1e-9
    assert np.abs(inputs["points"]["ensemble"][rows] - actual)[ok].min() == pytest.approx(2.5)


def test_without_phases_the_weights_cannot_tell_the_experts_apart(bench):
    inputs = alternating()
    rows = slice(24 * 7, 24 * 8)
    out = bench.weighted_rule(inputs, rows, mode="inverse", shrink=1.0, phases=False)
    actual = inputs["actual"][rows]
    ok = np.isfinite(actual)
    # Equal pooled errors: equal weights (the top 3 of 3 experts), so never exact.
    assert np.abs(out - actual)[ok].min() > 1.0


def test_shrink_mixes_the_rule_with_the_median_and_no_season_keeps_the_median(bench):
    inputs = alternating()
    rows = slice(24 * 7, 24 * 8)
    full = bench.weighted_rule(inputs, rows, mode="leader", shrink=1.0)
    half = bench.weighted_rule(inputs, rows, mode="leader", shrink=0.5)
    median = inputs["points"]["ensemble"][rows]
    np.testing.assert_allclose(half, 0.5 * full + 0.5 * median)
    no_season = dict(inputs, day=0)
    np.testing.assert_array_equal(bench.weighted_rule(no_season, rows), median)


def test_phase_scores_weigh_recent_points_and_nearby_hours_more(bench):
    errors = np.array([[1.0, 3.0], [3.0, 1.0]])  # two experts, two past points
    actual = np.array([10.0, 10.0])
    # Pooled: the newer point (age 0) weighs twice the older (age = one half-life).
    pooled = bench.phase_scores(errors, actual, np.array([14.0, 0.0]), None, 0, 3600.0)
    np.testing.assert_allclose(pooled[:, 0], [(0.5 + 3) / 15, (1.5 + 1) / 15])
    # Per phase: at each point's own hour (0 and 12, far apart) its errors dominate.
    per_hour = bench.phase_scores(
        errors, actual, np.zeros(2), np.array([0, 12]), 24, 3600.0, phase_hours=1.0
    )
    assert per_hour[0, 0] < per_hour[1, 0] and per_hour[1, 12] < per_hour[0, 12]


TRACE = expected_path("genai-requests")


@pytest.mark.slow
@pytest.mark.skipif(
    not TRACE.is_file(), reason=f"needs the whole trace: {fetch_hint('genai-requests')}"
)
def test_rules_smoke_reports_every_rule_on_the_check_window(tmp_path, bench):
    out = tmp_path / "rules.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "bench/predictor.py"),
            "--rules",
            "--smoke",
            "--json",
            str(out),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    report = json.loads(out.read_text())
    assert set(report["summary"]) == set(bench.RULES)
    for rule, summary in report["summary"].items():
        assert "design" not in summary  # the smoke run scores the last window only
        check = summary["check"]
        assert check["cells"] == len(bench.HORIZONS)
        assert 0 < check["geomean_ratio"] <= check["worst_ratio"]
        ratios = [c["ratio"] for c in report["cells"][rule]["check"]]
        assert check["worst_ratio"] == pytest.approx(max(ratios), abs=1e-3)
    # The GenAI series has a daily season: applying the rule everywhere changes nothing there.
    assert report["cells"]["phase_inverse"] == report["cells"]["phase_inverse_everywhere"]


def test_a_model_on_request_is_replayed_alone_and_as_one_more_member_of_the_median(bench):
    rules = bench.extra_rules(("gru", "tracking"))
    assert set(rules) == {"gru", "median_with_gru"}  # tracking is a combination: not a member
    points = {
        "gru": np.array([[1.0], [2.0]]),
        "ensemble": np.array([[5.0], [5.0]]),
        "ensemble_with_gru": np.array([[4.0], [3.0]]),
    }
    inputs = {"points": points}
    np.testing.assert_array_equal(rules["gru"][1](inputs, slice(1, 2), {}), [[2.0]])
    np.testing.assert_array_equal(
        rules["median_with_gru"][1](inputs, slice(0, 2), {}), [[4.0], [3.0]]
    )
    # A window where the model could not run (no median with it): the plain median.
    del points["ensemble_with_gru"]
    np.testing.assert_array_equal(rules["median_with_gru"][1](inputs, slice(0, 1), {}), [[5.0]])


def test_the_control_gives_every_member_one_vote_whatever_the_default_counts(bench):
    points = {
        "a": np.array([[1.0], [1.0]]),
        "b": np.array([[2.0], [9.0]]),
        "seasonal_mean": np.array([[8.0], [3.0]]),
    }
    # the default's voters count seasonal_mean twice; the control counts it once
    inputs = {"points": points, "members": ("a", "b", "seasonal_mean", "seasonal_mean")}
    np.testing.assert_array_equal(bench.one_vote_rule(inputs, slice(0, 2)), [[2.0], [3.0]])
    inputs["members"] = ("a", "b")
    np.testing.assert_array_equal(bench.one_vote_rule(inputs, slice(1, 2)), [[5.0]])


def switching(days: int = 10):
    """Two experts on an hourly series: ``a`` exact until day 6 and 5 too high after it, ``b``
    the other way round; the median ensemble is their mean, 2.5 off everywhere."""
    inputs = alternating(days)
    actual = inputs["actual"]
    late = (np.arange(len(actual)) >= 24 * 6)[:, None]
    a, b = actual + np.where(late, 5.0, 0.0), actual + np.where(late, 0.0, 5.0)
    return dict(inputs, points={"a": a, "b": b, "ensemble": 0.5 * (a + b)})


def test_lp_weights_follow_the_recent_leader_and_shrink_toward_the_median(bench):
    inputs = switching()
    rows = slice(24 * 8, 24 * 9)
    actual, median = inputs["actual"][rows], inputs["points"]["ensemble"][rows]
    ok = np.isfinite(actual)
    # "b" has been exact for the last two days: with a short half-life it takes all the weight.
    recent = bench.lp_weights_rule(inputs, rows, half_life=0.5, shrink=1.0, window=None)
    assert np.abs(recent - actual)[ok].max() < 1e-6
    # Without decay the six days when "a" was exact outweigh them; a trailing window of two
    # days sees only "b"'s lead.
    whole = bench.lp_weights_rule(inputs, rows, half_life=1e9, shrink=1.0, window=None)
    assert np.abs(whole - actual)[ok].min() > 4.9
    trailing = bench.lp_weights_rule(inputs, rows, half_life=1e9, shrink=1.0, window=2)
    assert np.abs(trailing - actual)[ok].max() < 1e-6
    half = bench.lp_weights_rule(inputs, rows, half_life=0.5, shrink=0.5, window=None)
    np.testing.assert_allclose(half, 0.5 * recent + 0.5 * median, atol=1e-6)
    np.testing.assert_array_equal(
        bench.lp_weights_rule(inputs, rows, shrink=0.0, window=None), median
    )


def test_lp_weights_leave_out_a_candidate_without_a_forecast_in_the_interval(bench):
    inputs = switching()
    rows = slice(24 * 8, 24 * 9)
    points = dict(inputs["points"], b=inputs["points"]["b"].copy())
    points["b"][rows] = np.nan
    out = bench.lp_weights_rule(dict(inputs, points=points), rows, half_life=0.5, shrink=1.0)
    assert np.isfinite(out).all()
    assert np.abs(out - inputs["actual"][rows])[np.isfinite(inputs["actual"][rows])].min() > 2.4
