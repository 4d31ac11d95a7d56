"""Fixed-share Hedge (predictor.aggregation) and the tracking combination built on it."""

from __future__ import annotations

import math

import numpy as np
import pytest

from predictor.aggregation import FixedShareHedge
from predictor.models import candidate_factories
from predictor.models.naive import NaiveModel, SeasonalNaiveModel
from predictor.models.tracking import TrackingCombination
from predictor.selection import candidate_forecasts, select_model

HOUR, DAY, WEEK = 3600.0, 86400.0, 604800.0


def _mixture_losses(hedge: FixedShareHedge, losses: np.ndarray) -> np.ndarray:
    """The loss of the weighted mean of the experts' losses each round (one horizon)."""
    out = []
    for row in losses:
        out.append(float(hedge.weights[0] @ row))
        hedge.step(row[None])
    return np.array(out)


def _switching_losses(rounds: int, switch_at: int, seed: int = 0) -> np.ndarray:
    """Three experts with noisy losses in [0, 1]: expert 0 best before ``switch_at``, expert 2
    after, expert 1 never."""
    rng = np.random.default_rng(seed)
    means = np.where(np.arange(rounds)[:, None] < switch_at, [0.2, 0.5, 0.7], [0.7, 0.5, 0.2])
    return np.clip(means + rng.uniform(-0.15, 0.15, (rounds, 3)), 0.0, 1.0)


def test_weights_follow_the_best_expert_across_a_switch():
    losses = _switching_losses(800, switch_at=400)
    tracking = FixedShareHedge(np.ones(3), 1, learning_rate=0.3, share=0.05)
    plain = FixedShareHedge(np.ones(3), 1, learning_rate=0.3, share=0.0)
    taken_over: dict[str, int] = {}
    for t, row in enumerate(losses):
        for label, hedge in (("tracking", tracking), ("plain", plain)):
            hedge.step(row[None])
            if t == 399:
                assert hedge.weights[0].argmax() == 0
            if t >= 400 and label not in taken_over and hedge.weights[0, 2] > 0.5:
                taken_over[label] = t - 400
    assert tracking.weights[0].argmax() == 2 and tracking.weights[0, 2] > 0.6
    # The share caps how far the old leader's rivals fall: the new leader takes over within
    # tens of rounds, plain Hedge only after about as long as the old one led.
    assert taken_over["tracking"] < 60
    assert taken_over.get("plain", 400) > 3 * taken_over["tracking"]


def test_plain_hedge_stays_within_its_regret_bound_of_the_best_expert():
    rng = np.random.default_rng(1)
    rounds, experts, rate = 2000, 5, 0.1
    losses = rng.uniform(0.0, 1.0, (rounds, experts))
    losses[:, 3] -= 0.05  # one expert slightly better on average
    losses = np.clip(losses, 0.0, 1.0)
    hedge = FixedShareHedge(np.ones(experts), 1, learning_rate=rate, share=0.0)
    regret = _mixture_losses(hedge, losses).sum() - losses.sum(axis=0).min()
    assert regret <= math.log(experts) / rate + rate * rounds / 8


def test_fixed_share_stays_within_its_bound_against_the_best_switching_sequence():
    """Herbster and Warmuth's bound against the sequence of experts that switches at the two
    changes of leader (Cesa-Bianchi and Lugosi 2006, thm 5.2)."""
    rng = np.random.default_rng(2)
    experts, rate, share = 4, 0.3, 0.01
    leaders = [0] * 500 + [2] * 500 + [1] * 500
    losses = rng.uniform(0.3, 1.0, (len(leaders), experts))
    for t, leader in enumerate(leaders):
        losses[t, leader] = rng.uniform(0.0, 0.4)
    hedge = FixedShareHedge(np.ones(experts), 1, learning_rate=rate, share=share)
    mixture = _mixture_losses(hedge, losses).sum()
    sequence = losses[np.arange(len(leaders)), leaders].sum()
    switches, rounds = 2, len(leaders)
    bound = (
        (switches + 1) * math.log(experts)
        + switches * math.log(1 / share)
        + (rounds - switches - 1) * math.log(1 / (1 - share))
    ) / rate + rate * rounds / 8
    assert mixture - sequence <= bound
    # and it beats every single expert kept throughout, which the switches defeat
    assert mixture < losses.sum(axis=0).min()


def test_hedge_keeps_finite_weights_on_zero_infinite_and_missing_losses():
    hedge = FixedShareHedge(np.array([1.0, 1.0, 2.0]), 2, learning_rate=50.0, share=0.0)
    hedge.step(np.zeros((2, 3)))
    np.testing.assert_allclose(hedge.weights, [[0.25, 0.25, 0.5]] * 2)
    hedge.step(np.array([[np.inf, 1e6, 0.0], [np.nan, 0.0, 0.0]]))
    assert np.isfinite(hedge.weights).all()
    np.testing.assert_allclose(hedge.weights.sum(axis=1), 1.0)
    assert hedge.weights[0, 2] == pytest.approx(1.0)
    np.testing.assert_allclose(hedge.weights[1], [0.25, 0.25, 0.5])  # nothing scored there
    hedge.step(np.full((2, 3), np.inf))
    assert np.isfinite(hedge.weights).all()


def test_hedge_rejects_a_prior_without_positive_weights():
    with pytest.raises(ValueError, match="prior"):
        FixedShareHedge(np.array([1.0, 0.0]), 1)
    with pytest.raises(ValueError, match="share"):
        FixedShareHedge(np.ones(2), 1, share=1.5)


def _tracking(max_horizon: int = 4) -> TrackingCombination:
    members = [
        NaiveModel(max_horizon),
        SeasonalNaiveModel(24, max_horizon, name="seasonal_naive_daily"),
    ]
    return TrackingCombination(members, median_of=[m.name for m in members])


@pytest.mark.parametrize("value", [0.0, 7.0])
def test_tracking_forecasts_a_constant_series_without_nan(value):
    model = _tracking()
    model.fit(np.full(24 * 5, value))
    for _ in range(30):
        model.update(value)
    prediction = model.predict([1, 2, 3, 4])
    assert np.isfinite(model.hedge.weights).all()
    np.testing.assert_allclose(prediction.point, value)
    assert np.isfinite(prediction.upper).all()


def test_tracking_leans_on_the_member_that_is_right_lately():
    """A series that repeats yesterday exactly: the daily copy gains weight over its prior
    (a quarter) and the last value loses it, the more so the further ahead (where the last
    value errs most), and the forecast lands closer than the median of the two."""
    t = np.arange(24 * 8)
    y = 100 + 90 * np.sin(2 * np.pi * t / 24)
    model = _tracking()
    model.fit(y[: 24 * 6])
    model.replay(y[24 * 6 :])
    naive, daily = model.hedge.weights[:, 0], model.hedge.weights[:, 1]
    assert (daily > 0.25).all() and (naive < 0.25).all()
    assert (np.diff(daily) > 0).all() and (np.diff(naive) < 0).all()
    truth = y[-24 + 3]  # four steps ahead
    median = 0.5 * (y[-1] + truth)
    assert abs(model.predict([4]).point[0] - truth) < 0.6 * abs(median - truth)


def _series(days: int = 14, seed: int = 3) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(24 * days)
    level = np.where(t < 24 * 10, 60.0, 90.0)  # a change of level on day 10
    return level + 25 * np.sin(2 * np.pi * t / 24) + rng.poisson(6, len(t))


def test_backtest_scoring_reproduces_the_live_model_exactly():
    y = _series()
    start, end = 24 * 11, 24 * 12
    factories = candidate_factories(HOUR, (DAY, WEEK), 8, start, include=("tracking",))
    forecasts, errors, _ = candidate_forecasts(
        {"tracking": factories["tracking"]}, y, start, [start, end], 8
    )
    assert not errors
    live = factories["tracking"]()
    live.fit(y[:start])
    paths = [live.latest_path().copy()]
    for value in y[start:end]:
        live.update(value)
        paths.append(live.latest_path().copy())
    np.testing.assert_allclose(forecasts["tracking"].point[: end - start], paths[:-1], atol=1e-9)


def test_tracking_is_offered_only_when_a_target_names_it():
    assert "tracking" not in candidate_factories(HOUR, (DAY, WEEK), 8, 24 * 14)
    named = candidate_factories(HOUR, (DAY, WEEK), 8, 24 * 14, include=("tracking",))
    assert set(named) == {"naive", "seasonal_naive_daily", "seasonal_naive_weekly", "tracking"}


def test_selection_scores_and_calibrates_the_tracking_combination():
    y = _series()
    factories = {
        **candidate_factories(HOUR, (DAY, WEEK), 8, len(y)),
        **candidate_factories(HOUR, (DAY, WEEK), 8, len(y), include=("tracking",)),
    }
    selection = select_model(factories, y, range(1, 9), cycle=24)
    assert "tracking" in selection.results
    assert np.isfinite(list(selection.results["tracking"].wape.values())).all()
    chosen = {selection.overall, *selection.per_horizon.values()}
    assert chosen <= set(selection.calibration)
