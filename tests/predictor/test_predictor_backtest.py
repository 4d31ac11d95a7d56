"""Backtest measures on small cases computed by hand, and model selection."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.backtest import (
    BacktestResult,
    coverage,
    pool,
    replay_with_selection,
    rolling_origin,
    rolling_origin_with_parts,
    smape,
    under_rate,
    wape,
)
from predictor.models import (
    MedianEnsemble,
    NaiveModel,
    SeasonalLevelModel,
    SeasonalNaiveModel,
    candidate_factories,
    shortest_cycle,
)
from predictor.models.base import ForecastModel
from predictor.selection import choose, select_model, validation_folds


def test_measures_on_a_hand_computed_case():
    actual = np.array([0.0, 2.0, 4.0, 2.0])
    point = np.array([0.0, 1.0, 5.0, 4.0])
    assert wape(actual, point) == pytest.approx(100 * (0 + 1 + 1 + 2) / 8)
    # 0/0 counts as a perfect 0, then 2*1/3, 2*1/9, 2*2/6
    assert smape(actual, point) == pytest.approx(100 * (0 + 2 / 3 + 2 / 9 + 4 / 6) / 4)
    assert under_rate(actual, point) == 25.0
    assert coverage(actual, point) == 75.0
    assert np.isnan(wape(np.zeros(3), np.ones(3)))


def test_rolling_origin_scores_each_horizon_against_the_right_point():
    ticks = iter(range(100))
    result = rolling_origin(
        lambda: NaiveModel(2), [1, 2, 3, 4, 5], [1, 2], test_start=2, clock=lambda: next(ticks)
    )
    # h=1: forecasts 2,3,4 for 3,4,5; h=2: forecasts 2,3 for 4,5.
    assert result.wape[1] == pytest.approx(100 * 3 / 12)
    assert result.wape[2] == pytest.approx(100 * 4 / 9)
    assert list(result.point[2]) == [2, 3]
    assert result.under_rate[1] == 100.0
    assert result.origins == 3
    assert result.fit_seconds == 1.0 and result.update_seconds == 1.0


def test_refits_on_schedule_are_counted_in_fit_time():
    ticks = iter(range(1000))
    result = rolling_origin(
        lambda: NaiveModel(1),
        np.arange(20.0),
        [1],
        test_start=10,
        refit_every=5,
        clock=lambda: next(ticks),
    )
    assert result.origins == 10 and result.fit_seconds == 1.0


def _result(name: str, wapes: dict[int, float]) -> BacktestResult:
    return BacktestResult(name, tuple(wapes), wapes, wapes, wapes, wapes, 0.0, 0.0, 1)


def test_choose_per_horizon_and_overall_with_ties_to_the_first():
    results = {
        "naive": _result("naive", {1: 10.0, 2: 50.0}),
        "ets": _result("ets", {1: 20.0, 2: 30.0}),
        "twin": _result("twin", {1: 10.0, 2: 50.0}),
        "broken": _result("broken", {1: float("nan"), 2: float("nan")}),
    }
    selection = choose(results, [1, 2])
    assert selection.per_horizon == {1: "naive", 2: "ets"}
    assert selection.overall == "ets"


def test_selection_prefers_the_seasonal_copy_on_a_seasonal_series_and_keeps_failures():
    t = np.arange(24 * 6)
    y = 50 + 20 * np.sin(2 * np.pi * t / 24)

    def failing():
        raise ValueError("cannot fit")

    factories = {
        "naive": lambda: NaiveModel(3),
        "seasonal_naive_daily": lambda: SeasonalNaiveModel(24, 3),
        "broken": failing,
    }
    selection = select_model(factories, y, [1, 3])
    assert selection.overall == "seasonal_naive_daily"
    assert selection.per_horizon == {1: "seasonal_naive_daily", 3: "seasonal_naive_daily"}
    assert selection.failures == {"broken": "cannot fit"}
    assert selection.results["seasonal_naive_daily"].wape[3] < 1e-9


def test_weekly_models_need_two_weeks_and_unknown_models_are_named():
    names = set(candidate_factories(3600, [86400, 604800], 2, 24 * 13))
    assert "seasonal_naive_daily" in names and "seasonal_naive_weekly" not in names
    names = set(candidate_factories(3600, [86400, 604800], 2, 24 * 14))
    assert "seasonal_naive_weekly" in names
    with pytest.raises(ValueError, match="unknown model 'arima'"):
        candidate_factories(3600, [86400], 2, 100, include=["arima"])


def test_replay_with_selection_uses_each_horizons_winner():
    t = np.arange(24 * 8)
    y = 50 + 20 * np.sin(2 * np.pi * t / 24)

    def select(history):
        return {1: "naive", 2: "seasonal"}, {
            "naive": lambda: NaiveModel(2),
            "seasonal": lambda: SeasonalNaiveModel(24, 2),
        }

    result = replay_with_selection(select, y, [1, 2], test_start=24 * 6, reselect_every=24)
    assert result.wape[2] < 1e-9 < result.wape[1]


class ConstantModel(ForecastModel):
    """Always forecasts ``value``: a model whose errors are known exactly."""

    def __init__(self, value: float, name: str) -> None:
        self.value, self.name = value, name
        super().__init__(1)

    @property
    def min_points(self) -> int:
        return 1

    def _fit(self, y: np.ndarray, state_at: int) -> None:
        return None

    def _forecast_path(self) -> np.ndarray:
        return np.array([self.value])


def test_pool_weights_each_windows_errors_and_actuals():
    a = rolling_origin(lambda: ConstantModel(10.0, "c"), [10.0, 10, 10, 20, 20], [1], 3)
    b = rolling_origin(lambda: ConstantModel(10.0, "c"), [10.0, 10, 10, 10, 10], [1], 3)
    pooled = pool([a, b], [1.0, 0.5])
    # window a: errors 10+10 over actuals 40; window b: no error over 20, counted half
    assert pooled.wape[1] == pytest.approx(100 * 20 / (40 + 0.5 * 20))
    # a's first miss widens its bound to cover the second point; b covers both
    assert list(a.upper[1] >= a.actual[1]) == [False, True]
    assert pooled.coverage[1] == pytest.approx(100 * (1 + 0.5 * 2) / (2 + 0.5 * 2))
    assert pooled.origins == 4


def test_validation_folds_split_the_recent_history_and_shrink_when_short():
    assert validation_folds(200, 2, 48, 4) == [152, 164, 176, 188]
    assert validation_folds(200, 6, 24, 4) == [176, 188]  # 12 points each: >= 2 * horizon
    assert validation_folds(200, 6, 8, 4) == [192]


def test_validation_windows_each_span_a_whole_cycle_of_the_shortest_season():
    # 72 hourly points with a daily season: three whole days, not four windows of 18 hours
    assert validation_folds(300, 6, 72, 4, cycle=24) == [228, 252, 276]
    assert validation_folds(300, 6, 96, 4, cycle=24) == [204, 228, 252, 276]
    assert validation_folds(300, 6, 20, 4, cycle=24) == [280]  # less than a cycle: one window
    assert shortest_cycle(3600, (86400.0, 604800.0), 24 * 13) == 24
    assert shortest_cycle(3600, (604800.0,), 24 * 13) == 0  # not two weeks yet: no season


def test_selection_weights_recent_windows_more():
    # Load sat at 10 for most of the history and moved to 20 in the last validation window.
    y = np.concatenate([np.full(180, 10.0), np.full(12, 20.0)])
    factories = {
        "old": lambda: ConstantModel(10.0, "old"),
        "recent": lambda: ConstantModel(20.0, "recent"),
    }
    # Four windows of 12; equal weights: "old" errs on 12 points, "recent" on 36.
    assert select_model(factories, y, [1], validation=48, half_life=1e9).overall == "old"
    # Halving the weight every half window back makes the last window dominate.
    chosen = select_model(factories, y, [1], validation=48, half_life=0.5)
    assert chosen.overall == "recent"
    assert chosen.results["recent"].origins == 48


def test_a_model_that_cannot_run_on_older_windows_is_scored_on_the_recent_ones():
    y = 50 + 20 * np.sin(2 * np.pi * np.arange(24 * 3) / 24)
    factories = {
        "naive": lambda: NaiveModel(1),
        "seasonal_56": lambda: SeasonalNaiveModel(56, 1),  # needs 57 points
    }
    selection = select_model(factories, y, [1], validation=24, folds=4)
    assert selection.results["seasonal_56"].origins < selection.results["naive"].origins
    assert not selection.failures


def test_seasonal_level_compares_the_last_day_and_the_gru_keeps_its_own_window():
    # 15-min steps, weekly season: the level is measured over the last day (96 steps); the
    # GRU's shorter input window must not leak into it.
    factories = candidate_factories(900, [86400, 604800], 4, 96 * 15)
    assert factories["seasonal_level"]().window == 96
    assert factories["gru"]().window == 24


def test_the_trimmed_ensemble_is_scored_from_the_median_ensembles_pass():
    t = np.arange(24 * 16)
    y = 50 + 20 * np.sin(2 * np.pi * t / 24) + np.random.default_rng(3).normal(0, 3, len(t))
    factories = candidate_factories(3600, [86400], 2, len(y))
    assert "ensemble_trimmed" in factories and "ensemble_trimmed" in factories["ensemble"]().parts()
    selection = select_model(factories, y, [1, 2])
    alone = select_model(
        {"ensemble_trimmed": factories["ensemble_trimmed"], "naive": factories["naive"]}, y, [1, 2]
    )
    for h in (1, 2):
        np.testing.assert_allclose(
            selection.results["ensemble_trimmed"].wape[h],
            alone.results["ensemble_trimmed"].wape[h],
            rtol=1e-6,
        )
    # four members or fewer (no season): the trimmed mean is the median, so it is not offered
    assert "ensemble_trimmed" not in candidate_factories(3600, [], 2, len(y))


def test_the_ensemble_can_be_chosen_alone_and_has_members_of_every_kind():
    factories = candidate_factories(3600, [86400], 2, 24 * 10, include=["ensemble"])
    assert set(factories) == {"naive", "seasonal_naive_daily", "ensemble"}
    ensemble = factories["ensemble"]()
    assert [m.name for m in ensemble.members] == [
        "ets_log",
        "autoregressive",
        "gru",
        "seasonal_level",
        "seasonal_blend",
    ]


def _folds(per_fold: list[float], h: int = 1) -> dict[int, dict[int, float]]:
    return {k: {h: v} for k, v in enumerate(per_fold)}


def test_a_challenger_replaces_the_ensemble_only_when_ahead_by_more_than_a_standard_error():
    results = {"ensemble": _result("ensemble", {1: 31.0}), "blend": _result("blend", {1: 30.0})}
    # One point ahead pooled, but the per-window differences (-3, +2, -2, +1) have a standard
    # error of about 1.2: no evidence, the ensemble stays.
    noisy = {"ensemble": _folds([30, 30, 34, 30]), "blend": _folds([27, 32, 32, 31])}
    assert choose(results, [1], noisy).per_horizon == {1: "ensemble"}
    # The same lead, steady on every window (standard error 0.2): the challenger wins.
    steady = {"ensemble": _folds([31, 31, 31, 31]), "blend": _folds([30, 30.5, 29.8, 30])}
    assert choose(results, [1], steady).per_horizon == {1: "blend"}
    # Without per-window scores the noise is unknown: the lowest WAPE wins.
    assert choose(results, [1]).per_horizon == {1: "blend"}


def test_the_previous_choice_is_the_incumbent_and_a_clear_lead_still_wins():
    results = {
        "ensemble": _result("ensemble", {1: 30.0, 2: 40.0}),
        "blend": _result("blend", {1: 31.0, 2: 30.0}),
    }
    folds = {
        "ensemble": {k: {1: 30.0 + d, 2: 40.0} for k, d in enumerate([1, -1, 1, -1])},
        "blend": {k: {1: 31.0 - d, 2: 30.0} for k, d in enumerate([1, -1, 1, -1])},
    }
    previous = choose(results, [1, 2], folds)
    assert previous.per_horizon == {1: "ensemble", 2: "blend"}
    flipped = {
        "ensemble": _result("ensemble", {1: 31.0, 2: 40.0}),
        "blend": _result("blend", {1: 30.0, 2: 30.0}),
    }
    # blend now leads at h1 by 1 point, within the noise: the previous choice (ensemble) stays;
    # at h2 blend's ten-point lead is steady: it stays chosen too.
    again = choose(flipped, [1, 2], folds, previous=previous)
    assert again.per_horizon == {1: "ensemble", 2: "blend"}


class CountingNaive(NaiveModel):
    fits = 0

    def _fit(self, y, state_at):
        CountingNaive.fits += 1


def test_ensemble_members_are_scored_from_the_ensemble_pass_as_they_would_be_alone():
    t = np.arange(24 * 12)
    rng = np.random.default_rng(1)
    y = 50 + 20 * np.sin(2 * np.pi * t / 24) + rng.normal(0, 3, len(t))
    members = {
        "naive": lambda: NaiveModel(3),
        "seasonal_naive_daily": lambda: SeasonalNaiveModel(24, 3, name="seasonal_naive_daily"),
        "seasonal_level": lambda: SeasonalLevelModel(24, 6, 3, name="seasonal_level"),
    }
    ensemble = lambda: MedianEnsemble([f() for f in members.values()])  # noqa: E731
    together = rolling_origin_with_parts(ensemble, y, [1, 3], test_start=24 * 8)
    assert list(together) == ["ensemble", *members]
    for name, factory in members.items():
        alone = rolling_origin(factory, y, [1, 3], test_start=24 * 8)
        for h in (1, 3):
            np.testing.assert_allclose(together[name].point[h], alone.point[h])
            np.testing.assert_allclose(together[name].upper[h], alone.upper[h])
    # select_model fits a member only inside the ensemble, never a second time alone
    CountingNaive.fits = 0
    factories = {
        "naive": lambda: CountingNaive(3),
        "ensemble": lambda: MedianEnsemble([NaiveModel(3), SeasonalNaiveModel(24, 3)]),
    }
    selection = select_model(factories, y, [1, 3])
    assert CountingNaive.fits == 0 and set(selection.results) == {"naive", "ensemble"}
    assert selection.results["naive"].wape[1] > 0


class CountingSeasonal(SeasonalNaiveModel):
    made = 0

    def __init__(self, *args, **kwargs):
        CountingSeasonal.made += 1
        super().__init__(*args, **kwargs)


def test_selection_refits_one_instance_per_candidate_across_its_windows():
    # A model that can start from its previous fit (the GRU) only gains from it if each
    # window's refit reuses the instance the previous window fitted.
    t = np.arange(24 * 12)
    y = 50 + 20 * np.sin(2 * np.pi * t / 24)
    CountingSeasonal.made = 0
    factories = {"naive": lambda: NaiveModel(3), "copy": lambda: CountingSeasonal(24, 3)}
    selection = select_model(factories, y, [1, 3], folds=4)
    assert len(selection.fold_wape["copy"]) == 4
    assert CountingSeasonal.made == 1


def test_a_restricted_model_waits_for_its_history_while_the_baselines_forecast(caplog):
    caplog.set_level("INFO", logger="predictor.models.catalog")
    early = candidate_factories(3600, [86400], 2, 30, include=["seasonal_level"])
    assert set(early) == {"naive"}
    (record,) = [r for r in caplog.records if "not available yet" in r.getMessage()]
    assert record.models == ["seasonal_level"] and record.needed_points == 48
    later = candidate_factories(3600, [86400], 2, 48, include=["seasonal_level"])
    assert set(later) == {"naive", "seasonal_naive_daily", "seasonal_level"}
    # a custom season's copy is a baseline too, kept whatever the restriction
    assert "seasonal_naive_1200s" in candidate_factories(60, [1200], 2, 60, include=["ets_log"])
