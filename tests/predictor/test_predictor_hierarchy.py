"""Temporal hierarchies (predictor.models.hierarchy): reconciliation, the levels, selection."""

from __future__ import annotations

from functools import partial

import numpy as np
import pytest

from predictor.models import SeasonalMeanModel, candidate_factories
from predictor.models.hierarchy import (
    AggregatedModel,
    TemporalHierarchy,
    hierarchy_levels,
    reconciliation_matrix,
    summing_matrix,
)
from predictor.models.naive import NaiveModel
from predictor.selection import candidate_forecasts, select_model

HOUR, DAY, WEEK = 3600.0, 86400.0, 604800.0


def _daily(days: int, seed: int = 2, noise: float = 0.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(24 * days)
    y = 100 + 60 * np.sin(2 * np.pi * t / 24) + 20 * np.cos(4 * np.pi * t / 24)
    return y + noise * rng.standard_normal(len(t))


def test_the_levels_are_the_divisors_and_the_summing_matrix_covers_each_block():
    assert hierarchy_levels(8) == (1, 2, 4, 8)
    assert hierarchy_levels(6) == (1, 2, 3, 6)
    s = summing_matrix((1, 2, 4, 8), 8)
    assert s.shape == (15, 8)
    assert list(s[8]) == [1, 1, 0, 0, 0, 0, 0, 0]  # the first block of 2
    assert list(s[-1]) == [1] * 8  # the sum of all 8 steps
    with pytest.raises(ValueError, match="does not divide"):
        summing_matrix((1, 3), 8)


@pytest.mark.parametrize("variances", [None, np.arange(1.0, 16.0)])
def test_a_coherent_hierarchy_reconciles_exactly(variances):
    s = summing_matrix((1, 2, 4, 8), 8)
    g = reconciliation_matrix(s, variances)
    steps = np.random.default_rng(0).uniform(0, 50, (5, 8))
    np.testing.assert_allclose((s @ steps.T).T @ g.T, steps, atol=1e-10)


def test_reconciliation_pulls_the_steps_toward_the_levels_by_their_weights():
    s = summing_matrix((1, 8), 8)
    nodes = np.concatenate([np.full(8, 10.0), [160.0]])  # the steps say 80 in all, the sum 160
    structural = reconciliation_matrix(s) @ nodes
    # Weights 1 per step and 8 for the sum: the total moves halfway, alike for every step.
    np.testing.assert_allclose(structural, np.full(8, 15.0))
    trusted_steps = reconciliation_matrix(s, np.concatenate([np.ones(8), [1e9]])) @ nodes
    np.testing.assert_allclose(trusted_steps, np.full(8, 10.0), atol=1e-6)


def _level(k: int, horizon: int = 8) -> AggregatedModel:
    return AggregatedModel(k, horizon, partial(SeasonalMeanModel, (24 // k,)))


def test_a_level_forecasts_the_sums_of_the_next_blocks_spread_over_their_steps():
    y = _daily(10)
    model = _level(4)
    model.fit(y[:-20])
    for v in y[-20:-8]:
        model.update(v)
    path = model.latest_path()
    blocks = y[-8:].reshape(2, 4).sum(axis=1)
    np.testing.assert_allclose(path, np.repeat(blocks / 4, 4), rtol=1e-9)
    # One copy per phase, each fitted on the blocks ending at its phase.
    assert len(model.copies) == 4


def _hierarchy(n: int) -> TemporalHierarchy:
    model = candidate_factories(HOUR, (DAY,), 8, n, include=("hierarchy",))["hierarchy"]()
    assert isinstance(model, TemporalHierarchy)
    return model


def test_levels_that_agree_come_back_unchanged():
    # Without noise every level's seasonal average is the pattern itself: the forecasts are
    # coherent and the reconciled steps are exactly the base level's.
    y = _daily(12)
    model = _hierarchy(len(y))
    assert [k for k, _ in model.level_rows] == [1, 2, 4, 8]
    model.fit(y[:-30])
    for v in y[-30:-8]:
        model.update(v)
    np.testing.assert_allclose(model.latest_path(), model.members[0].latest_path(), rtol=1e-9)
    np.testing.assert_allclose(model.predict(list(range(1, 9))).point, y[-8:], rtol=1e-9)


def test_the_reconciled_forecast_of_a_noisy_daily_pattern_is_right():
    y = _daily(20, noise=4.0)
    truth = _daily(20)
    model = _hierarchy(len(y))
    model.fit(y[:-30])
    for v in y[-30:-8]:
        model.update(v)
    prediction = model.predict(list(range(1, 9)))
    assert np.abs(prediction.point - truth[-8:]).max() < 0.05 * truth.mean()
    assert np.all(prediction.upper >= prediction.point)


def test_a_hierarchy_needs_a_base_and_a_level():
    with pytest.raises(ValueError, match="base members and aggregated levels"):
        TemporalHierarchy([NaiveModel(8), SeasonalMeanModel((24,), 8)])


def test_backtest_scoring_reproduces_the_live_model_exactly():
    y = _daily(16, noise=6.0)
    start, end = 24 * 13, 24 * 14
    factories = candidate_factories(HOUR, (DAY, WEEK), 8, start, include=("hierarchy",))
    forecasts, errors, _ = candidate_forecasts(
        {"hierarchy": factories["hierarchy"]}, y, start, [start, end], 8
    )
    assert not errors
    live = factories["hierarchy"]()
    live.fit(y[:start])
    paths = [live.latest_path().copy()]
    for value in y[start:end]:
        live.update(value)
        paths.append(live.latest_path().copy())
    np.testing.assert_allclose(forecasts["hierarchy"].point[: end - start], paths[:-1], atol=1e-9)


def test_named_it_is_a_candidate_and_a_member_of_the_median_and_selection_scores_both():
    y = _daily(16, noise=6.0)
    unnamed = candidate_factories(HOUR, (DAY, WEEK), 8, len(y))
    assert "hierarchy" not in unnamed
    assert "hierarchy" not in unnamed["ensemble"]().member_names()
    factories = candidate_factories(HOUR, (DAY, WEEK), 8, len(y), include=[*unnamed, "hierarchy"])
    assert "hierarchy" in factories["ensemble"]().member_names()
    selection = select_model(factories, y, range(1, 9), cycle=24)
    assert {"hierarchy", "ensemble"} <= set(selection.results)
    for name in ("hierarchy", "ensemble"):
        assert np.isfinite(list(selection.results[name].wape.values())).all()


def test_without_a_season_it_is_not_offered_even_named():
    factories = candidate_factories(10.0, (DAY,), 8, 400, include=("hierarchy", "ensemble"))
    assert "hierarchy" not in factories
    assert "hierarchy" not in factories["ensemble"]().member_names()


def test_its_calibration_errors_are_those_of_the_reconciled_paths():
    # The tail's forecasts are reconciled origin by origin from the members' tails: the newest
    # error at each horizon is the one of the path issued that many steps back.
    y = _daily(16, noise=6.0)
    model = _hierarchy(len(y))
    model.fit(y)
    for h in range(1, 9):
        issued = model._pending[h - 1][h - 1]
        assert model.residuals.levels(h)[-1] == pytest.approx(issued, rel=1e-9)
        assert model.residuals.errors(h)[-1] == pytest.approx(y[-1] - issued, rel=1e-9)
