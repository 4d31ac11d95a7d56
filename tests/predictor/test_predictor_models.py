"""Each model on synthetic series whose right answer is known."""

from __future__ import annotations

import subprocess
import sys
from functools import partial

import numpy as np
import pytest
import torch
from statsmodels.tsa.holtwinters import ExponentialSmoothing

from predictor.backtest import rolling_origin
from predictor.models import (
    AutoregressiveModel,
    BoostedTreesModel,
    CalendarRegressionModel,
    Combination,
    ETSModel,
    InsufficientHistory,
    MSTLModel,
    NaiveModel,
    RecentLevelModel,
    SeasonalBlendModel,
    SeasonalLevelModel,
    SeasonalMeanModel,
    SeasonalNaiveModel,
    SequenceModel,
    candidate_factories,
)
from predictor.models.autoregressive import _ridge_by_loo
from predictor.models.base import History

PERIOD = 24


def seasonal(n: int, level: float = 100.0) -> np.ndarray:
    t = np.arange(n)
    return level + 40 * np.sin(2 * np.pi * t / PERIOD) + 15 * np.cos(4 * np.pi * t / PERIOD)


def test_history_keeps_the_most_recent_points_in_order():
    h = History(5)
    h.extend(np.arange(3.0))
    for v in range(3, 12):
        h.append(float(v))
    assert list(h.values()) == [7, 8, 9, 10, 11]
    assert h.ago(1) == 11 and h.ago(5) == 7
    assert list(h.last(2)) == [10, 11]
    h.extend(np.arange(100.0, 108.0))
    assert list(h.values()) == [103, 104, 105, 106, 107]


def test_naive_repeats_the_last_value_at_every_horizon():
    m = NaiveModel(max_horizon=3)
    m.fit([1.0, 5.0, 7.0])
    assert list(m.predict([1, 2, 3]).point) == [7, 7, 7]
    m.update(2.0)
    assert list(m.predict([1, 3]).point) == [2, 2]


@pytest.mark.parametrize(
    "factory",
    [
        lambda: SeasonalNaiveModel(PERIOD, 6),
        lambda: SeasonalLevelModel(PERIOD, 6, 6),
        lambda: SeasonalBlendModel(((PERIOD, 3),), 6),
        lambda: SeasonalBlendModel(((PERIOD, 3), (7 * PERIOD, PERIOD)), 6),
        lambda: SeasonalMeanModel((PERIOD,), 6),
        lambda: SeasonalMeanModel((PERIOD, 7 * PERIOD), 6),
        lambda: ETSModel(6, periods=(PERIOD,), log=False),
        lambda: ETSModel(6, periods=(PERIOD,), log=True),
        lambda: AutoregressiveModel(6, periods=(PERIOD,)),
        lambda: AutoregressiveModel(6, periods=(PERIOD,), transform="none"),
        lambda: CalendarRegressionModel(6, periods=(PERIOD,)),
        lambda: MSTLModel(6, periods=(PERIOD,)),
        lambda: candidate_factories(3600, (86400.0,), 6, 24 * 12, include=("hierarchy",))[
            "hierarchy"
        ](),
    ],
)
def test_a_pure_seasonal_series_is_forecast_almost_exactly(factory):
    y = seasonal(24 * 12)
    model = factory()
    model.fit(y[:-30])
    for v in y[-30:-6]:
        model.update(v)
    point = model.predict(list(range(1, 7))).point
    truth = y[-6:]
    assert np.abs(point - truth).max() < 0.02 * truth.mean()


def test_the_gru_learns_a_seasonal_series_from_a_poor_start():
    y = seasonal(24 * 14)
    model = SequenceModel(4, window=24, periods=(PERIOD,), epochs=10, max_steps=150)
    model.fit(y[:-4])
    point = model.predict([1, 2, 3, 4]).point
    assert np.abs(point - y[-4:]).mean() < 0.05 * y.mean()


def test_the_gru_keeps_the_seasonal_copy_when_training_cannot_beat_it_on_the_holdout():
    # The copy is exact on a pure seasonal series: no training step can do better on the
    # held-out tail, so the untrained start is kept and forecasts are the copy itself.
    y = seasonal(24 * 8)
    model = SequenceModel(3, window=24, periods=(PERIOD,), epochs=3, max_steps=30)
    model.fit(y)
    assert not model.trained
    np.testing.assert_allclose(model.predict([1, 2, 3]).point, y[-PERIOD:][:3], rtol=1e-5)


def test_the_gru_is_reproducible_with_its_fixed_seed():
    rng = np.random.default_rng(5)
    y = seasonal(24 * 8) + rng.normal(0, 5, 24 * 8)
    points = []
    for _ in range(2):
        model = SequenceModel(3, window=24, periods=(PERIOD,), epochs=3, max_steps=30)
        model.fit(y)
        points.append(model.predict([1, 2, 3]).point)
    np.testing.assert_array_equal(points[0], points[1])


def test_the_gru_forecast_in_numpy_is_the_torch_forward():
    rng = np.random.default_rng(6)
    y = seasonal(24 * 10) + rng.normal(0, 5, 240)
    model = SequenceModel(3, window=24, periods=(PERIOD,), epochs=3, max_steps=30)
    model.fit(y)
    z = model.history.values() / model.scale
    windows, extra = model._features(z, np.array([len(z)]))
    with torch.no_grad():
        reference = model.net(
            torch.tensor(windows, dtype=torch.float32), torch.tensor(extra, dtype=torch.float32)
        )
    np.testing.assert_allclose(
        model.latest_path(), reference.numpy()[0] * model.scale, rtol=1e-4, atol=1e-4
    )


def test_a_gru_refit_starts_from_its_previous_weights():
    # With no training steps allowed on a refit, the only way to keep what the first fit
    # learned is to start from its weights: the forecast stays exactly the trained one.
    t = np.arange(24 * 14)
    y = 100 + 40 * np.sin(2 * np.pi * t / PERIOD) + 0.3 * t  # a trend the copy misses
    model = SequenceModel(3, window=24, periods=(PERIOD,), epochs=10, warm_steps=0)
    model.fit(y)
    assert model.trained
    trained = model.latest_path().copy()
    model.fit(y)
    assert model.trained
    np.testing.assert_allclose(model.latest_path(), trained)
    cold = SequenceModel(3, window=24, periods=(PERIOD,), epochs=10, max_steps=0)
    cold.fit(y)
    assert not cold.trained and not np.allclose(cold.latest_path(), trained)


def test_autoregression_beats_the_last_value_on_bursty_seasonal_counts():
    # Poisson counts around a known daily rate: the last count is a noisy guess of the next
    # one; the regression on recent means and smoothed seasonal copies estimates the rate.
    rng = np.random.default_rng(4)
    y = rng.poisson(seasonal(24 * 21) / 5).astype(float)
    test_start = 24 * 18
    ar = rolling_origin(lambda: AutoregressiveModel(2, periods=(PERIOD,)), y, [1, 2], test_start)
    naive = rolling_origin(lambda: NaiveModel(2), y, [1, 2], test_start)
    for h in (1, 2):
        assert ar.wape[h] < 0.85 * naive.wape[h]


def test_autoregression_follows_a_level_shift_after_its_refit():
    rng = np.random.default_rng(1)
    y = np.concatenate([10 + rng.normal(0, 0.3, 300), 30 + rng.normal(0, 0.3, 100)])
    model = AutoregressiveModel(3)
    model.fit(y)
    assert np.all(np.abs(model.predict([1, 2, 3]).point - 30) < 1.5)


def test_ridge_penalty_chosen_by_leave_one_out_follows_the_evidence():
    rng = np.random.default_rng(7)
    x = np.column_stack([np.ones(200), rng.normal(size=(200, 5))])
    weights = np.ones(200)
    truth = np.array([1.0, 2.0, -1.0, 0.5, 0.0, 3.0])
    exact = _ridge_by_loo(x, x @ truth, weights, (0.01, 1.0, 100.0, 1e4))
    np.testing.assert_allclose(exact, truth, atol=0.01)
    noise = _ridge_by_loo(x, rng.normal(size=200), weights, (0.01, 1.0, 100.0, 1e4))
    assert np.abs(noise[1:]).max() < 0.05  # unrelated columns: shrunk to nothing


def test_autoregression_forecasts_stay_within_reach_of_what_was_seen():
    rng = np.random.default_rng(2)
    y = rng.poisson(5, 400).astype(float)
    y[-1] = 5000.0  # one absurd point must not send a linear model off to infinity
    model = AutoregressiveModel(3)
    model.fit(y[:-1])
    model.update(y[-1])
    assert np.all(model.predict([1, 2, 3]).point <= 1.5**2 * y[:-1].max() * 1.01)


def test_seasonal_blend_smooths_bursty_bins_and_beats_the_plain_copy():
    # Poisson counts around a known daily rate: the best guess is the rate, which averaging
    # neighbouring bins of past days estimates far better than one bin a day ago.
    rng = np.random.default_rng(4)
    rate = seasonal(24 * 21) / 10
    y = rng.poisson(rate).astype(float)
    test_start = 24 * 18
    blend = rolling_origin(lambda: SeasonalBlendModel(((PERIOD, 3),), 2), y, [1, 2], test_start)
    copy = rolling_origin(lambda: SeasonalNaiveModel(PERIOD, 2), y, [1, 2], test_start)
    model = SeasonalBlendModel(((PERIOD, 3),), 2)
    model.fit(y[:test_start])
    assert model.smoothing > 0
    for h in (1, 2):
        assert blend.wape[h] < 0.9 * copy.wape[h]


def test_seasonal_blend_follows_a_grown_load():
    t = np.arange(24 * 14)
    y = (50 + 30 * np.sin(2 * np.pi * t / PERIOD)) * (1.03 ** (t / PERIOD))
    model = SeasonalBlendModel(((PERIOD, PERIOD),), 4)
    model.fit(y[:-4])
    assert model.exponent > 0
    err_blend = np.abs(model.predict([1, 2, 3, 4]).point - y[-4:]).sum()
    plain = SeasonalNaiveModel(PERIOD, 4)
    plain.fit(y[:-4])
    err_plain = np.abs(plain.predict([1, 2, 3, 4]).point - y[-4:]).sum()
    assert err_blend < 0.5 * err_plain


def test_seasonal_mean_averages_past_days_and_beats_the_plain_copy():
    # Poisson counts around a known daily rate: the mean of the same hour over several past
    # days estimates the rate far better than that hour of one day.
    rng = np.random.default_rng(6)
    y = rng.poisson(seasonal(24 * 21) / 10).astype(float)
    test_start = 24 * 18
    mean = rolling_origin(lambda: SeasonalMeanModel((PERIOD,), 4), y, [1, 4], test_start)
    copy = rolling_origin(lambda: SeasonalNaiveModel(PERIOD, 4), y, [1, 4], test_start)
    model = SeasonalMeanModel((PERIOD,), 4)
    model.fit(y[:test_start])
    assert model.choices[0][0] > 1  # more than one past day
    for h in (1, 4):
        assert mean.wape[h] < 0.85 * copy.wape[h]


def test_seasonal_mean_rescales_past_days_to_a_grown_load():
    t = np.arange(24 * 14)
    y = (50 + 30 * np.sin(2 * np.pi * t / PERIOD)) * (1.05 ** (t / PERIOD))
    model = SeasonalMeanModel((PERIOD,), 4)
    model.fit(y[:-4])
    assert model.choices[0][3] > 0  # the level ratio is applied
    plain = SeasonalNaiveModel(PERIOD, 4)
    plain.fit(y[:-4])
    error = np.abs(model.predict([1, 2, 3, 4]).point - y[-4:]).sum()
    assert error < 0.5 * np.abs(plain.predict([1, 2, 3, 4]).point - y[-4:]).sum()


def test_recent_level_takes_a_long_median_of_bursty_noise_and_beats_the_last_value():
    # A steady rate with rare large bursts: the best guess of a bin is the typical level,
    # which the median of many recent bins finds and the last value (or a mean) does not.
    rng = np.random.default_rng(8)
    y = rng.poisson(20, 1200).astype(float)
    bursts = rng.random(1200) < 0.05
    y[bursts] += rng.exponential(400, bursts.sum())
    level = rolling_origin(lambda: RecentLevelModel(3), y, [1, 3], 800)
    last = rolling_origin(lambda: NaiveModel(3), y, [1, 3], 800)
    model = RecentLevelModel(3)
    model.fit(y[:800])
    assert np.all(model.window >= 16) and np.all(model.statistic == 1)  # 1: the median
    for h in (1, 3):
        assert level.wape[h] < 0.7 * last.wape[h]


def test_recent_level_follows_a_level_shift_within_its_window():
    y = np.concatenate([np.full(300, 10.0), np.full(100, 50.0)])
    model = RecentLevelModel(2)
    model.fit(y[:300])
    for v in y[300:]:
        model.update(v)
    np.testing.assert_allclose(model.predict([1, 2]).point, [50.0, 50.0])


def test_a_level_shift_is_followed_by_updates_alone_for_naive():
    rng = np.random.default_rng(1)
    model = NaiveModel(3)
    model.fit(10 + rng.normal(0, 0.3, 200))
    for v in 30 + rng.normal(0, 0.3, 5):
        model.update(v)
    assert abs(model.predict(3).point[0] - 30) < 1.5


@pytest.mark.parametrize("log", [False, True])
def test_a_level_shift_is_followed_by_ets_after_its_refit(log):
    # On flat noise ETS smooths hard (small alpha), so between refits it only drifts toward a
    # new level; the scheduled refit, seeing the shift, re-estimates and follows it.
    rng = np.random.default_rng(1)
    y = np.concatenate([10 + rng.normal(0, 0.3, 200), 30 + rng.normal(0, 0.3, 60)])
    model = ETSModel(3, log=log)
    model.fit(y[:200])
    assert abs(model.predict(1).point[0] - 10) < 1.5
    for v in y[200:]:
        model.update(v)
    drifted = model.predict(3).point[0]
    assert drifted > 10
    model.fit(y)
    assert abs(model.predict(3).point[0] - 30) < 1.5


def test_seasonal_level_scales_last_season_to_a_grown_load():
    t = np.arange(24 * 14)
    y = (50 + 30 * np.sin(2 * np.pi * t / PERIOD)) * (1.02 ** (t / PERIOD))
    model = SeasonalLevelModel(PERIOD, PERIOD, 4)
    model.fit(y[:-4])
    assert model.exponent > 0
    plain = SeasonalNaiveModel(PERIOD, 4)
    plain.fit(y[:-4])
    err_level = np.abs(model.predict([1, 2, 3, 4]).point - y[-4:]).sum()
    err_plain = np.abs(plain.predict([1, 2, 3, 4]).point - y[-4:]).sum()
    assert err_level < 0.5 * err_plain


def test_ets_update_runs_the_same_recursion_as_statsmodels():
    rng = np.random.default_rng(2)
    y = seasonal(24 * 10) + rng.normal(0, 3, 240)
    model = ETSModel(5, periods=(PERIOD,), log=False)
    model.fit_until(y, 200)  # estimate on all of y, state after y[:200] ...
    for v in y[200:]:
        model.update(v)  # ... then advance point by point to the end
    reference = ExponentialSmoothing(
        y,
        trend="add",
        damped_trend=True,
        seasonal="add",
        seasonal_periods=PERIOD,
        initialization_method="heuristic",
        bounds={
            "smoothing_level": (0.01, 0.99),
            "smoothing_trend": (0.0, 0.5),
            "smoothing_seasonal": (0.0, 0.99),
            "damping_trend": (0.8, 0.98),
        },
    ).fit()
    np.testing.assert_allclose(
        model.predict([1, 2, 3, 4, 5]).point, reference.forecast(5), rtol=1e-6
    )


def test_ensemble_takes_the_median_of_its_members_each_fitted_alone():
    y = seasonal(24 * 10)
    members = [NaiveModel(2), SeasonalNaiveModel(PERIOD, 2), ETSModel(2, periods=(PERIOD,))]
    ensemble = Combination(members)
    ensemble.fit(y)
    alone = ETSModel(2, periods=(PERIOD,))
    alone.fit(y)
    np.testing.assert_allclose(members[2].latest_path(), alone.latest_path())
    paths = np.stack([m.latest_path() for m in members])
    np.testing.assert_allclose(ensemble.predict([1, 2]).point, np.median(paths, axis=0))
    with pytest.raises(ValueError, match="unknown combination"):
        Combination(members, rule="mode")


def test_a_member_with_two_votes_counts_twice_in_the_median_everywhere_it_is_combined():
    y = seasonal(24 * 10) + np.random.default_rng(3).normal(0, 4, 24 * 10)
    members = [NaiveModel(2), SeasonalNaiveModel(PERIOD, 2), ETSModel(2, periods=(PERIOD,))]
    voted = Combination(members, votes={"ets_log": 2})
    assert voted.voters() == ["naive", "seasonal_naive_24", "ets_log", "ets_log"]
    voted.fit(y[:-5])
    for v in y[-5:]:
        voted.update(v)
    paths = np.stack([m.latest_path() for m in members])
    # the median of four: halfway from the middle member toward the one with two votes
    np.testing.assert_allclose(voted.latest_path(), np.median(paths[[0, 1, 2, 2]], axis=0))
    assert not np.allclose(voted.latest_path(), np.median(paths, axis=0))
    # the path selection rebuilds from the members' backtests counts the votes too
    replayed = voted.combine_paths({m.name: m.latest_path()[None] for m in members}, tails={})
    np.testing.assert_allclose(replayed[0], voted.latest_path())
    with pytest.raises(ValueError, match="which is no member"):
        Combination(members, votes={"gru": 2})
    with pytest.raises(ValueError, match="at least 1"):
        Combination(members, votes={"naive": 0})
    with pytest.raises(ValueError, match="votes apply to the median and trimmed_mean"):
        Combination(members, rule="inverse_error", votes={"naive": 2})


def test_the_catalog_median_gives_seasonal_mean_a_second_vote_only_where_it_is_a_member():
    seasonal_ensemble = candidate_factories(3600, (86400.0,), 3, 24 * 14)["ensemble"]()
    assert seasonal_ensemble.voters().count("seasonal_mean") == 2
    assert len(seasonal_ensemble.voters()) == len(seasonal_ensemble.member_names()) + 1
    seasonless = candidate_factories(10, (86400.0,), 3, 400)["ensemble"]()
    assert seasonless.voters() == seasonless.member_names()


def test_an_inverse_error_combination_leans_on_the_member_that_erred_least():
    rng = np.random.default_rng(8)
    y = seasonal(24 * 12) + rng.normal(0, 4, 24 * 12)
    members = [NaiveModel(3), SeasonalNaiveModel(PERIOD, 3, name="seasonal_naive_daily")]
    combination = Combination(members, name="combination", rule="inverse_error")
    combination.fit(y[:-10])
    for v in y[-10:]:
        combination.update(v)
    # the seasonal copy erred far less on this seasonal series, above all further ahead
    assert combination.weights[2, 1] > combination.weights[0, 1] > 0.5
    paths = np.stack([m.latest_path() for m in members])
    np.testing.assert_allclose(
        combination.latest_path(), np.einsum("mh,hm->h", paths, combination.weights)
    )
    assert combination.predict([3]).upper[0] > combination.predict([3]).point[0]


def test_the_calendar_regression_keeps_its_phase_across_updates():
    # A daily and a weekly cycle; no seasonal lag in the features, only the phase.
    t = np.arange(24 * 7 * 4)
    y = 100 + 30 * np.sin(2 * np.pi * t / 24) + 20 * np.cos(2 * np.pi * t / (24 * 7))
    model = CalendarRegressionModel(4, periods=(24, 24 * 7))
    model.fit(y[: 24 * 7 * 3])
    for v in y[24 * 7 * 3 : -4]:
        model.update(v)
    assert np.abs(model.predict([1, 2, 3, 4]).point - y[-4:]).max() < 1.0


def from_catalog(step: int, name: str, include: tuple[str, ...] = ()):
    """A test parameter: the catalog's factory for ``name`` on a series of n points."""

    def factory_for(n: int):
        return candidate_factories(step, (86400.0,), 3, n, include=include)[name]

    return pytest.param(factory_for, id=f"{step}-{name}")


HOURLY = [from_catalog(3600, name) for name in candidate_factories(3600, (86400.0,), 3, 24 * 14)]
NO_SEASON = [from_catalog(10, name) for name in ("recent_level", "ensemble")]
ON_REQUEST = [
    from_catalog(3600, "boosted", include=("boosted",)),
    # The catalog does not offer boosted trees without a season; the model still works.
    pytest.param(lambda n: partial(BoostedTreesModel, 3), id="boosted-without-season"),
    from_catalog(3600, "hierarchy", include=("hierarchy",)),
]


@pytest.mark.parametrize("factory_for", HOURLY + NO_SEASON + ON_REQUEST)
def test_a_replay_in_bulk_leaves_a_model_as_point_by_point_updates_would(factory_for):
    # The calibration replay after each fit runs in bulk (batched forecasts for the models
    # whose state is their history); forecasts, errors and bounds must be the updates' own,
    # including forecasts still pending from updates before the replay, and the calendar
    # phase of models that read it.
    rng = np.random.default_rng(5)
    y = rng.poisson(seasonal(24 * 14, level=60.0)).astype(float)
    factory = factory_for(len(y))
    stepped, bulk = factory(), factory()
    for model in (stepped, bulk):
        model.fit(y[:250])
        model.update(y[250])
    paths = []
    for v in y[251:320]:
        stepped.update(v)
        paths.append(stepped.latest_path())
    np.testing.assert_allclose(bulk.replay(y[251:320]), np.stack(paths), rtol=1e-9)
    for v in y[320:325]:
        stepped.update(v)
        bulk.update(v)
    for h in (1, 2, 3):
        np.testing.assert_allclose(stepped.residuals.errors(h), bulk.residuals.errors(h))
    ahead, again = stepped.predict([1, 2, 3]), bulk.predict([1, 2, 3])
    np.testing.assert_allclose(ahead.point, again.point, rtol=1e-9)
    np.testing.assert_allclose(ahead.upper, again.upper, rtol=1e-9)


def test_upper_bound_is_never_below_the_point_and_counts_forecasts_are_not_negative():
    rng = np.random.default_rng(3)
    y = rng.poisson(0.3, 300).astype(float)
    model = ETSModel(3, log=False)
    model.fit(y)
    p = model.predict([1, 2, 3])
    assert np.all(p.point >= 0) and np.all(p.upper >= p.point)


def test_bad_input_and_misuse_get_clear_errors():
    with pytest.raises(InsufficientHistory, match="needs at least 25 points"):
        SeasonalNaiveModel(PERIOD, 2).fit(np.ones(10))
    with pytest.raises(ValueError, match="fill gaps first"):
        NaiveModel(2).fit([1.0, float("nan"), 2.0])
    model = NaiveModel(2)
    with pytest.raises(RuntimeError, match="fit"):
        model.predict(1)
    model.fit([1.0, 2.0])
    with pytest.raises(ValueError, match=r"outside 1\.\.2"):
        model.predict(3)
    with pytest.raises(ValueError, match="finite"):
        model.update(float("inf"))


def test_the_catalog_imports_no_model_library_until_a_model_fits() -> None:
    """Processes that only name the models (the simulator's configuration check, the stack's
    start, the predictor before its first fit) must not pay torch's, statsmodels' or LightGBM's
    import; each is loaded by the first fit of a model that uses it."""
    libraries = ("torch", "statsmodels", "lightgbm")
    script = (
        "import sys\n"
        "from predictor.api import model_names\n"
        "from predictor.models import ETSModel, candidate_factories\n"
        "import predictor.service, stack.stack\n"
        "model_names([86400.0]); candidate_factories(60.0, [86400.0], 4, 400)\n"
        f"print([name for name in {libraries!r} if name in sys.modules])\n"
        "ETSModel(2).fit(__import__('numpy').arange(40.0))\n"
        f"print([name for name in {libraries!r} if name in sys.modules])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=120
    )
    before_fit, after_fit = result.stdout.splitlines()
    assert before_fit == "[]", result.stdout
    assert after_fit == "['statsmodels']", result.stdout
