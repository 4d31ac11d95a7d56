"""The upper bound covers what its quantile promises, on noise of known distributions, and its
width follows the level when the noise does."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from predictor.backtest import rolling_origin
from predictor.intervals import (
    LevelScaling,
    ResidualWindow,
    conformal_quantile,
    weighted_conformal_quantiles,
)
from predictor.models import ETSModel, NaiveModel
from predictor.models.base import ForecastModel


def test_window_margin_matches_the_known_distribution():
    rng = np.random.default_rng(0)
    window = ResidualWindow(max_horizon=1, size=4000)
    for e in rng.normal(0, 2, 4000):
        window.add(1, e)
    assert window.margin(1, 0.9) == pytest.approx(2 * stats.norm.ppf(0.9), rel=0.06)


@pytest.mark.parametrize("n", [1, 9, 10, 11, 99, 500])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.95])
def test_conformal_quantile_is_the_value_of_rank_ceil_n_plus_1_times_q(n, q):
    values = np.random.default_rng(n).permutation(np.arange(1.0, n + 1))  # rank r has value r
    assert conformal_quantile(values, q) == min(n, np.ceil((n + 1) * q))


@pytest.mark.parametrize("power", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("filled", [3, 40])
def test_margins_of_several_horizons_at_once_are_each_horizons_margin(power, filled):
    rng = np.random.default_rng(9)
    window = ResidualWindow(max_horizon=3, size=30)
    for i in range(filled):
        for h in (1, 2, 3):
            if i >= h - 1:  # longer horizons are scored later: counts differ at first
                window.add(h, rng.normal(0, h), rng.uniform(1, 50))
    scaling = LevelScaling(power, floor=2.0)
    points = np.array([10.0, 0.5, 30.0])
    together = window.margins((1, 2, 3), 0.8, points, scaling)
    alone = [window.margin(h, 0.8, p, scaling) for h, p in zip((1, 2, 3), points, strict=True)]
    np.testing.assert_allclose(together, alone)


@pytest.mark.parametrize("count", [5, 30, 47])
def test_adding_errors_in_bulk_is_adding_them_one_by_one(count):
    rng = np.random.default_rng(4)
    one_by_one, bulk = ResidualWindow(2, size=20), ResidualWindow(2, size=20)
    for window in (one_by_one, bulk):
        window.add(2, 7.0, 3.0)  # a slot already used: the bulk write continues after it
    errors, levels = rng.normal(0, 1, count), rng.uniform(0, 9, count)
    for e, level in zip(errors, levels, strict=True):
        one_by_one.add(2, e, level)
    bulk.add_many(2, errors, levels)
    assert bulk.count(2) == one_by_one.count(2) == min(count + 1, 20)
    np.testing.assert_array_equal(bulk.errors(2), one_by_one.errors(2))
    np.testing.assert_array_equal(bulk.levels(2), one_by_one.levels(2))
    assert bulk.margin(2, 0.9) == one_by_one.margin(2, 0.9)


def test_window_forgets_old_errors_and_borrows_from_shorter_horizons():
    window = ResidualWindow(max_horizon=3, size=3)
    for e in [100, 100, 1, 2, 3]:
        window.add(1, e)
    assert list(window.errors(1)) == [1, 2, 3]
    assert window.margin(3, 0.5) == window.margin(1, 0.5)
    assert ResidualWindow(2).margin(2, 0.9) == 0.0


def test_a_relative_margin_is_the_quantile_of_error_over_level_times_the_new_level():
    window = ResidualWindow(max_horizon=1, size=10)
    for level in (10.0, 20.0, 40.0, 80.0):
        window.add(1, 0.5 * level, level)  # always half the level
    relative = LevelScaling(power=1.0, floor=1.0)
    assert window.margin(1, 0.5, point=200.0, scaling=relative) == pytest.approx(100.0)
    # below the floor the floor is the scale
    assert window.margin(1, 0.5, point=0.0, scaling=relative) == pytest.approx(0.5)
    # absolute: the plain conformal quantile (rank ceil(5 * 0.5) = 3 of 4 errors: 20, not scaled)
    assert window.margin(1, 0.5, point=200.0) == pytest.approx(20.0)


class KnownLevel(ForecastModel):
    """Forecasts the true level of a series whose level alternates 10 and 100 every 12 steps,
    so its errors are exactly the noise."""

    name = "known_level"

    @property
    def min_points(self) -> int:
        return 1

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        return None

    def _forecast_path(self) -> np.ndarray:
        t = self.points_seen + np.arange(self.max_horizon)
        return level_at(t)


def level_at(t: np.ndarray) -> np.ndarray:
    return np.where(t % 24 < 12, 10.0, 100.0)


@pytest.mark.parametrize(
    ("kind", "power", "busy_to_quiet_width"),
    [("multiplicative", 1.0, 10.0), ("poisson", 0.5, np.sqrt(10.0)), ("additive", 0.0, 1.0)],
)
def test_the_margin_scales_with_the_level_as_the_noise_does(kind, power, busy_to_quiet_width):
    rng = np.random.default_rng(3)
    t = np.arange(5000)
    level = level_at(t)
    noise = rng.gamma(2.0, 0.25, len(t)) - 0.5  # skewed, mean 0
    y = {
        "multiplicative": level * (1 + noise),
        "poisson": rng.poisson(level).astype(float),
        "additive": level + 20 * noise,
    }[kind]
    # fitted once on 2,500 points: the last 500 are the calibration tail the power is chosen on
    result = rolling_origin(lambda: KnownLevel(2), y, [1, 2], test_start=2500, quantile=0.9)
    model = KnownLevel(2)
    model.fit(y[:2500])
    assert model.interval_scaling(0.9).power == power
    quiet = result.point[1] == 10.0
    width = result.upper[1] - result.point[1]
    assert width[~quiet].mean() / width[quiet].mean() == pytest.approx(
        busy_to_quiet_width, rel=0.02
    )
    # covered about 90 % overall, and on quiet and busy steps alike
    covered = result.actual[1] <= result.upper[1]
    for subset in (slice(None), quiet, ~quiet):
        assert 85 <= 100 * covered[subset].mean() <= 95


@pytest.mark.parametrize(
    "noise",
    [
        lambda rng, n: rng.normal(0, 5, n),
        lambda rng, n: rng.exponential(5, n),  # skewed, like bursts of load
    ],
)
@pytest.mark.parametrize("factory", [lambda: NaiveModel(3), lambda: ETSModel(3, log=False)])
def test_backtest_coverage_of_the_0_9_upper_bound_is_near_90_percent(noise, factory):
    rng = np.random.default_rng(7)
    y = 100 + noise(rng, 2400)
    result = rolling_origin(factory, y, [1, 3], test_start=800, quantile=0.9)
    for h in (1, 3):
        assert 86 <= result.coverage[h] <= 94


def test_the_adaptive_step_brings_coverage_back_to_the_level_after_the_noise_shrinks():
    # Calibration errors from a noisier regime (sd 3) that the window keeps (it is long);
    # live noise has sd 1. The plain conformal bound would cover nearly every point; the
    # adaptive step lowers the level of the bound until about 1 in 10 points is missed.
    rng = np.random.default_rng(11)
    model = NaiveModel(1, residual_window=5000, residual_half_life=None)
    model.fit(100 + rng.normal(0, 1, 50))
    wide = rng.normal(0, 3, 3000)
    model.recalibrate({1: (wide, np.full(len(wide), 100.0))})
    covered = []
    value = 100.0
    for _ in range(1500):
        upper = model.predict([1], 0.9).upper[0]
        value = 100 + rng.normal(0, 1)
        covered.append(value <= upper)
        model.update(value)
    assert np.mean(covered[:30]) > 0.97  # before the step has moved the level far
    assert 0.85 <= np.mean(covered[-750:]) <= 0.95


@pytest.mark.parametrize("n", [1, 9, 10, 57, 500])
@pytest.mark.parametrize("q", [0.5, 0.9, 0.95])
def test_equal_weights_read_rank_n_plus_1_times_q_between_neighbours(n, q):
    # Rank k covers a new exchangeable value with probability k/(n+1): level q is read at
    # rank q(n+1), between its neighbours, never past the largest value.
    values = np.random.default_rng(n).permutation(np.arange(1.0, n + 1))  # rank r has value r
    padded = np.concatenate([values, [np.inf, np.inf]])[None]  # two empty slots
    weights = np.concatenate([np.ones(n), [0.0, 0.0]])[None]
    quantile = weighted_conformal_quantiles(padded, weights, np.array([q]))[0]
    assert quantile == pytest.approx(float(np.clip(q * (n + 1), 1, n)))
    assert quantile <= conformal_quantile(values, q)


def test_an_interpolated_bound_covers_the_level_on_average_on_short_windows():
    # 40 calibration errors, then one new point, many times over: the rank bound covers
    # 37/41 = 90.2 % at least; read between neighbours, the coverage is the level itself.
    rng = np.random.default_rng(13)
    trials = rng.normal(0, 1, (20000, 41))
    weights = np.ones((len(trials), 40))
    bounds = weighted_conformal_quantiles(trials[:, :40], weights, np.full(len(trials), 0.88))
    assert np.mean(trials[:, 40] <= bounds) == pytest.approx(0.88, abs=0.01)


def test_recent_errors_weigh_more_with_a_half_life():
    # Old errors are large, the newest small: equal weights give a large margin, a short
    # half-life one from the recent errors.
    errors = np.concatenate([np.full(200, 10.0), np.full(100, 1.0)])
    equal, recent = ResidualWindow(1, 500), ResidualWindow(1, 500, half_life=20.0)
    for window in (equal, recent):
        window.add_many(1, errors, np.ones(len(errors)))
    assert equal.margin(1, 0.9) == 10.0
    assert recent.margin(1, 0.9) == 1.0


def test_a_recency_weighted_bound_follows_the_live_errors_without_the_adaptive_step():
    # Calibration errors from a noisier regime (sd 3); live noise sd 1. With recent errors
    # weighing more, the bound narrows to the live noise as it is seen, even with the
    # adaptive step turned off: coverage settles near the level, not near 100 %.
    rng = np.random.default_rng(12)
    model = NaiveModel(1, residual_window=2000, residual_half_life=100.0)
    model.fit(100 + rng.normal(0, 1, 50))
    wide = rng.normal(0, 3, 1000)
    model.recalibrate({1: (wide, np.full(len(wide), 100.0))})
    covered = []
    for _ in range(1500):
        # the window's own bound, without the adaptive step that predict() adds
        upper = model.latest_path()[0] + model.residuals.margin(1, 0.9)
        value = 100 + rng.normal(0, 1)
        covered.append(value <= upper)
        model.update(value)
    assert 0.86 <= np.mean(covered[-1000:]) <= 0.94
