"""The gradient-boosted trees candidate (predictor.models.boosted) on series with a known answer."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.models import (
    AutoregressiveModel,
    BoostedTreesModel,
    CalendarRegressionModel,
    candidate_factories,
)
from predictor.models.boosted import MAX_ROWS

DAY, WEEK = 24, 24 * 7


def weekday_rush(weeks: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Hourly Poisson counts whose mean is 10, except 9-11 h on weekdays: 60. The pulse is an
    interaction of the hour and the day (absent at weekends) and sharp (no few harmonics draw
    it); a copy of last week or yesterday carries one draw's noise."""
    t = np.arange(weeks * WEEK)
    rush = (t % DAY >= 9) & (t % DAY < 12) & ((t // DAY) % 7 < 5)
    mean = np.where(rush, 60.0, 10.0)
    return np.random.default_rng(seed).poisson(mean).astype(float), mean


def walk_forward(model, y: np.ndarray, start: int, h: int) -> np.ndarray:
    """Forecasts ``h`` steps ahead of every origin from ``start`` on, updating after each."""
    model.fit(y[:start])
    out = []
    for v in y[start : len(y) - h + 1]:
        out.append(model.predict([h]).point[0])
        model.update(v)
    return np.array(out)


def test_trees_learn_a_weekday_pulse_that_the_linear_models_only_copy_or_smear():
    y, mean = weekday_rush(10)
    start, h = 8 * WEEK, 4
    actual = y[start + h - 1 :]
    truth = mean[start + h - 1 :]
    kwargs = dict(periods=(DAY, WEEK), recent_windows=(4,))
    errors = {}
    for model in (
        BoostedTreesModel(8, **kwargs),
        AutoregressiveModel(8, **kwargs),
        CalendarRegressionModel(8, **kwargs),
    ):
        point = walk_forward(model, y, start, h)
        errors[model.name] = np.abs(point - actual).sum() / actual.sum()
        # How far from the true mean: the part of the error a model could have avoided.
        errors[model.name + "_bias"] = np.abs(point - truth).mean()
    assert errors["boosted"] < 0.9 * min(errors["autoregressive"], errors["calendar"])
    assert errors["boosted_bias"] < 0.6 * min(
        errors["autoregressive_bias"], errors["calendar_bias"]
    )


def test_counts_forecasts_are_not_negative_and_the_bound_is_above_the_point():
    rng = np.random.default_rng(3)
    y = rng.poisson(0.3, 600).astype(float)
    model = BoostedTreesModel(4, periods=(DAY,))
    model.fit(y)
    for v in rng.poisson(0.3, 30):
        model.update(float(v))
        p = model.predict([1, 2, 3, 4])
        assert np.all(p.point >= 0) and np.all(p.upper >= p.point)


def test_a_level_beyond_what_the_trees_saw_is_carried_by_the_recent_level():
    # Trees cannot extrapolate; the target is taken relative to the recent level, so a load
    # that doubled since the fit moves the forecast above anything the trees learned for that
    # hour (10 at night; the seasonal lags, still last week's, hold it below the new 20).
    y, _ = weekday_rush(6, seed=1)
    model = BoostedTreesModel(4, periods=(DAY, WEEK), recent_windows=(4,))
    model.fit(y[: 5 * WEEK])
    for v in 2 * y[5 * WEEK : 5 * WEEK + 2 * DAY]:
        model.update(v)
    night = model.predict([1]).point[0]  # 2 days in: the next point is at 0 h, mean 2 x 10
    assert 12 < night < 28


def test_the_catalog_offers_it_on_request_with_a_season_as_a_member_of_the_median_only_then():
    named = ["boosted", "ensemble"]
    with_season = candidate_factories(3600, (86400.0,), 8, 24 * 14, include=named)
    assert "boosted" in with_season
    assert "boosted" in with_season["ensemble"]().member_names()
    unnamed = candidate_factories(3600, (86400.0,), 8, 24 * 14)
    assert "boosted" not in unnamed
    assert "boosted" not in unnamed["ensemble"]().member_names()
    without = candidate_factories(10, (86400.0,), 8, 400, include=named)  # no usable season
    assert "boosted" not in without
    assert "boosted" not in without["ensemble"]().member_names()


def test_the_fit_is_bounded_and_reproducible():
    # Selection refits every candidate several times: the rows and trees per fit are capped
    # whatever the history, and the same series gives the same forecasts.
    y, _ = weekday_rush(20, seed=2)
    model = BoostedTreesModel(3, periods=(DAY, WEEK), rounds=20)
    model.fit(y)
    assert model.rows_fitted == MAX_ROWS
    assert all(b.num_trees() <= 20 for b in model.boosters if not isinstance(b, float))
    again = BoostedTreesModel(3, periods=(DAY, WEEK), rounds=20)
    again.fit(y)
    np.testing.assert_array_equal(model.latest_path(), again.latest_path())


def test_a_short_history_still_forecasts_and_bad_settings_are_refused():
    y, _ = weekday_rush(1)
    model = BoostedTreesModel(2, periods=(DAY, WEEK))
    model.fit(y[:80])  # no season fits yet: lags and recent means only
    assert model.periods == ()
    assert np.isfinite(model.predict([1, 2]).point).all()
    with pytest.raises(ValueError, match="leaves >= 2"):
        BoostedTreesModel(2, leaves=1)
    with pytest.raises(ValueError, match="learning_rate"):
        BoostedTreesModel(2, learning_rate=0.0)
