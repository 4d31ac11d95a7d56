"""Bounds from hindsight on selection, and the sampling spread of a coverage, on hand-computed
cases."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.backtest import coverage_interval
from predictor.hindsight import best_pick_wape, best_weights_wape, least_absolute_weights

ACTUAL = np.array([10.0, 10.0, 10.0, 10.0])
# "low" is right on the first two points, "high" on the last two; each is off by 4 elsewhere.
POINTS = {"low": np.array([10.0, 10.0, 6.0, 6.0]), "high": np.array([14.0, 14.0, 10.0, 10.0])}


def test_one_pick_per_cell_is_the_best_single_candidate():
    assert best_pick_wape(ACTUAL, POINTS, [0]) == pytest.approx(100 * 8 / 40)


def test_a_pick_per_block_switches_where_the_other_candidate_is_better():
    assert best_pick_wape(ACTUAL, POINTS, [0, 2]) == pytest.approx(0.0)
    # Blocks [0] and [1, 2, 3]: "low" on the first, "high" (off by 4 once) on the second.
    assert best_pick_wape(ACTUAL, POINTS, [0, 1]) == pytest.approx(100 * 4 / 40)


def test_convex_weights_beat_any_single_pick_when_candidates_err_both_ways():
    actual = np.array([10.0, 20.0])
    points = {"under": np.array([8.0, 16.0]), "over": np.array([12.0, 24.0])}
    # Half of each is exact on both points; either alone is off by 2 and 4.
    assert best_pick_wape(actual, points, [0]) == pytest.approx(100 * 6 / 30)
    assert best_weights_wape(actual, points, [0]) == pytest.approx(0.0, abs=1e-9)
    # Weights never do worse than the best single pick: a pick is a weighting.
    assert best_weights_wape(ACTUAL, POINTS, [0]) <= best_pick_wape(ACTUAL, POINTS, [0]) + 1e-9


def test_points_without_an_actual_are_left_out():
    actual = np.array([10.0, np.nan, 10.0])
    points = {"a": np.array([10.0, 0.0, 12.0])}
    assert best_pick_wape(actual, points, [0]) == pytest.approx(100 * 2 / 20)
    assert best_weights_wape(actual, points, [0, 1]) == pytest.approx(100 * 2 / 20)


def test_the_coverage_interval_holds_the_estimate_and_narrows_with_more_points():
    low, high = coverage_interval(54, 60)  # 90 %
    assert low < 90 < high
    assert (low, high) == pytest.approx((79.9, 95.3), abs=0.1)  # Wilson at z = 1.96
    wide, narrow = high - low, np.subtract(*coverage_interval(540, 600)[::-1])
    assert narrow < wide / 3
    assert coverage_interval(60, 60)[1] == pytest.approx(100.0)
    assert all(np.isnan(coverage_interval(0, 0)))


def test_least_absolute_weights_recover_a_mixture_and_follow_the_point_weights():
    a, b = np.array([0.0, 10.0, 20.0, 30.0]), np.array([10.0, 30.0, 10.0, 50.0])
    weights, error = least_absolute_weights(0.3 * a + 0.7 * b, np.column_stack([a, b]))
    np.testing.assert_allclose(weights, [0.3, 0.7], atol=1e-9)
    assert error == pytest.approx(0.0, abs=1e-9)
    # "low" is exact on the first two points and "high" on the last two (POINTS): the points
    # that weigh more decide, and the error is the weighted sum.
    forecasts = np.column_stack(list(POINTS.values()))
    weights, error = least_absolute_weights(ACTUAL, forecasts, np.array([1.0, 1.0, 3.0, 3.0]))
    np.testing.assert_allclose(weights, [0.0, 1.0], atol=1e-9)
    assert error == pytest.approx(4 + 4)
    assert weights.sum() == pytest.approx(1.0) and (weights >= -1e-12).all()
