"""Backtest measures on small cases computed by hand, and model selection."""

from __future__ import annotations

import numpy as np
import pytest

from predictor.backtest import (
    BacktestResult,
    coverage,
    expanding_origin,
    forecast_targets,
    replay_with_selection,
    rolling_origin,
    smape,
    under_rate,
    wape,
)
from predictor.models import (
    Combination,
    NaiveModel,
    SeasonalNaiveModel,
    candidate_factories,
    shortest_cycle,
)
from predictor.models.base import ForecastModel
from predictor.selection import (
    candidate_forecasts,
    choose,
    refit_starts,
    select_model,
    significant_lead,
    validation_blocks,
)


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


def test_replay_with_selection_uses_each_horizons_model_and_reselects_on_schedule():
    t = np.arange(24 * 8)
    y = 50 + 20 * np.sin(2 * np.pi * t / 24)
    calls = []

    def select(history):
        calls.append(len(history))
        naive, seasonal = NaiveModel(2), SeasonalNaiveModel(24, 2)
        naive.fit(history)
        seasonal.fit(history)
        return {1: naive, 2: seasonal}

    result = replay_with_selection(select, y, [1, 2], test_start=24 * 6, reselect_every=24)
    assert result.wape[2] < 1e-9 < result.wape[1]
    assert calls == [24 * 6, 24 * 7]


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


def test_blocks_are_whole_cycles_after_the_first_quarter_with_few_refits():
    # 300 hourly points, daily season: the first quarter (75) is training only; then whole
    # days ending at the last point, the first starting at 300 - 9 * 24 = 84.
    assert validation_blocks(300, 6, cycle=24) == (84, 24)
    # without a season, blocks of four times the deepest horizon
    assert validation_blocks(200, 5) == (60, 20)
    # at most 28 blocks however long the history
    first, block = validation_blocks(24 * 100, 6, cycle=24)
    assert (first, block) == (24 * 72, 24)
    # refits spread over the blocks, at most six, the first at the first block
    assert refit_starts(84, 24, 9, max_refits=6) == [84, 108, 156, 180, 228, 252]
    assert refit_starts(84, 24, 3) == [84, 108, 132]
    assert shortest_cycle(3600, (86400.0, 604800.0), 24 * 13) == 24
    assert shortest_cycle(3600, (604800.0,), 24 * 13) == 0  # not two weeks yet: no season


def test_a_lead_is_significant_only_when_steady_across_blocks():
    equal = np.ones(6)
    assert significant_lead(np.array([2.0, 1.5, 2.5, 1.8, 2.2, 2.0]), equal)
    # the same mean lead, but from one lucky block: within the noise
    assert not significant_lead(np.array([-1.0, -1.0, 13.0, -1.0, -1.0, 3.0]), equal)
    # losing on average is never a lead
    assert not significant_lead(np.array([-2.0, -1.0, -3.0]), np.ones(3))
    # recent blocks weigh more: a lead in the recent blocks outweighs older deficits
    recent = 0.5 ** np.arange(5, -1, -1)
    assert significant_lead(np.array([-1.0, -1.0, -1.0, 2.0, 2.1, 1.9]), recent)
    assert not significant_lead(np.array([-1.0, -1.0, -1.0, 2.0, 2.1, 1.9]), equal)


def test_selection_weights_recent_blocks_more():
    # Load sat at 10 for most of the history and moved to 20 in the last block.
    y = np.concatenate([np.full(180, 10.0), np.full(12, 20.0)])
    factories = {
        "old": lambda: ConstantModel(10.0, "old"),
        "recent": lambda: ConstantModel(20.0, "recent"),
    }
    # blocks of 4 (h=1), equal weights: "old" errs on one block of 36, "recent" on 35
    assert select_model(factories, y, [1], half_life=1e9).overall == "old"
    chosen = select_model(factories, y, [1], half_life=0.5)
    assert chosen.overall == "recent"
    assert chosen.results["recent"].origins == len(y) - validation_blocks(len(y), 1)[0]


def test_a_model_that_cannot_run_on_older_blocks_is_scored_on_the_recent_ones():
    y = 50 + 20 * np.sin(2 * np.pi * np.arange(24 * 4) / 24)
    factories = {
        "naive": lambda: NaiveModel(1),
        "seasonal_56": lambda: SeasonalNaiveModel(56, 1),  # needs 57 points
    }
    selection = select_model(factories, y, [1], cycle=24)
    assert selection.results["seasonal_56"].origins < selection.results["naive"].origins
    assert not selection.failures


def test_seasonal_level_compares_the_last_day_and_the_gru_only_on_request():
    factories = candidate_factories(900, [86400, 604800], 4, 96 * 15)
    assert factories["seasonal_level"]().window == 96
    assert "gru" not in factories
    requested = candidate_factories(900, [86400, 604800], 4, 96 * 15, include=["gru"])
    assert requested["gru"]().window == 24


def test_a_combination_is_scored_from_its_members_as_it_would_forecast_fitted_alone():
    t = np.arange(24 * 16)
    rng = np.random.default_rng(3)
    y = rng.poisson(50 + 20 * np.sin(2 * np.pi * t / 24)).astype(float)
    factories = candidate_factories(3600, [86400], 3, len(y))
    starts = [24 * 10, 24 * 13]
    forecasts, errors, names = candidate_forecasts(factories, y, starts[0], starts, 3)
    assert not errors and set(names) == set(factories)
    for name in ("combination", "ensemble", "ensemble_trimmed"):
        model = factories[name]()
        model.fit(y[: starts[1]])
        paths = np.vstack([model.latest_path(), model.replay(y[starts[1] : -1])])
        np.testing.assert_allclose(forecasts[name].point[24 * 3 :], paths, rtol=1e-9)
    # four members or fewer (no season): the trimmed mean is the median, so it is not offered
    assert "ensemble_trimmed" not in candidate_factories(3600, [], 2, len(y))


def test_the_combination_weighs_the_best_members_and_always_the_best_seasonal_copy():
    factories = candidate_factories(3600, [86400], 2, 24 * 10, include=["ensemble"])
    assert set(factories) == {"naive", "seasonal_naive_daily", "ensemble"}
    members = [m.name for m in factories["ensemble"]().members]
    assert members == [
        "ets_log",
        "mstl",
        "autoregressive",
        "calendar",
        "seasonal_level",
        "seasonal_blend",
        "seasonal_mean",
    ]
    # Offered on request, the temporal hierarchy joins the median only when named.
    named = candidate_factories(3600, [86400], 2, 24 * 10, include=["ensemble", "hierarchy"])
    assert [m.name for m in named["ensemble"]().members] == [*members, "hierarchy"]
    combination = Combination(
        [NaiveModel(1), SeasonalNaiveModel(24, 1, name="seasonal_naive_daily")]
        + [ConstantModel(c, f"c{c:g}") for c in (1.0, 2.0, 3.0)],
        rule="inverse_error",
        top=2,
    )
    tails = {
        "naive": [np.array([1.0, -1.0])],  # error 1
        "seasonal_naive_daily": [np.array([4.0])],  # error 4: last, but the anchor
        "c1": [np.array([2.0])],
        "c2": [np.array([3.0])],
        "c3": [np.array([-2.0])],
    }
    weights = combination.weights_for(tails)[0]
    inverse = np.array([1, 1 / 16, 1 / 4, 0, 0])
    np.testing.assert_allclose(weights, inverse / inverse.sum())


def test_a_challenger_replaces_the_incumbent_only_with_a_significant_lead():
    results = {
        "combination": _result("combination", {1: 31.0}),
        "blend": _result("blend", {1: 30.0}),
    }
    noisy = {"combination": _blocks([30, 30, 36, 30]), "blend": _blocks([33, 28, 31, 28])}
    assert choose(results, [1], noisy).per_horizon == {1: "combination"}
    steady = {"combination": _blocks([31, 32, 30, 31]), "blend": _blocks([30, 31, 29, 30])}
    assert choose(results, [1], steady).per_horizon == {1: "blend"}
    # no per-block scores: the lowest pooled WAPE
    assert choose(results, [1]).per_horizon == {1: "blend"}


def test_the_previous_choice_is_the_incumbent():
    results = {
        "combination": _result("combination", {1: 30.0, 2: 30.0}),
        "blend": _result("blend", {1: 29.0, 2: 29.0}),
    }
    noisy = {
        "combination": {0: {1: 30, 2: 30}, 1: {1: 34, 2: 34}, 2: {1: 26, 2: 26}},
        "blend": {0: {1: 32, 2: 32}, 1: {1: 28, 2: 28}, 2: {1: 27, 2: 27}},
    }
    previous = choose(results, [1, 2], {n: dict(v) for n, v in noisy.items()})
    assert previous.per_horizon == {1: "combination", 2: "combination"}
    flipped = {
        "combination": _result("combination", {1: 29.0, 2: 29.0}),
        "blend": _result("blend", {1: 30.0, 2: 30.0}),
    }
    kept = choose(flipped, [1, 2], noisy, previous=choose(results, [1, 2]))
    assert kept.per_horizon == {1: "blend", 2: "blend"}  # "blend" was chosen last time


def _blocks(per_block: list[float], h: int = 1) -> dict[int, dict[int, float]]:
    return {k: {h: v} for k, v in enumerate(per_block)}


def test_the_chosen_model_is_calibrated_with_the_backtests_out_of_sample_errors():
    rng = np.random.default_rng(4)
    t = np.arange(24 * 14)
    y = rng.poisson(60 + 25 * np.sin(2 * np.pi * t / 24)).astype(float)
    factories = candidate_factories(3600, [86400], 3, len(y))
    selection = select_model(factories, y, [1, 3], cycle=24)
    name = selection.per_horizon[3]
    first, _ = validation_blocks(len(y), 3, 24)
    starts = refit_starts(first, 24, (len(y) - first) // 24)
    point = candidate_forecasts({name: factories[name]}, y, first, starts, 3)[0][name].point
    actual = forecast_targets(y, first, 3)
    errors, levels = selection.calibration[name][3]
    # from the fits on at least half the history on
    skip = next(s for s in starts if s >= len(y) / 2) - first
    rows = slice(skip, len(y) - first - 2)
    np.testing.assert_allclose(levels, point[rows, 2])
    np.testing.assert_allclose(errors, (actual - point)[rows, 2])
    model = factories[name]()
    model.fit(y)
    selection.calibrate(model)
    np.testing.assert_allclose(model.residuals.errors(3), errors)
    # the split-conformal bounds of the backtest cover about 90 %
    for h in (1, 3):
        assert 80 <= selection.results[name].coverage[h] <= 97


def test_expanding_origin_refits_a_fresh_model_at_each_start():
    CountingSeasonal.made = 0
    y = 50 + 20 * np.sin(2 * np.pi * np.arange(24 * 6) / 24)
    result = expanding_origin(lambda: CountingSeasonal(24, 2), y, 48, [48, 96], 2)
    assert CountingSeasonal.made == 2 and result.error is None
    np.testing.assert_allclose(result.point[:, 0], y[48:], atol=1e-9)
    short = expanding_origin(lambda: SeasonalNaiveModel(72, 2), y, 48, [48, 96], 2)
    assert np.isnan(short.point[:48]).all() and np.isfinite(short.point[48:]).all()
    assert "needs at least" in short.error


class CountingSeasonal(SeasonalNaiveModel):
    made = 0

    def __init__(self, *args, **kwargs):
        CountingSeasonal.made += 1
        super().__init__(*args, **kwargs)


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
