"""SLO-driven sizing: the queueing model's guarantees, its validation, and its fit to the fleet."""

from __future__ import annotations

import math
from dataclasses import replace
from decimal import Decimal, getcontext

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.core.slo_sizing import (
    ServiceModel,
    SloSizing,
    erlang_c,
    modelled_p99,
    replicas_for_slo,
    slo_less_best_effort_slice,
    wait_exceedance,
)
from autoscaler.simulator.fleet import Fleet

BATCHED = ServiceModel(fixed_seconds=1.5, per_item_seconds=0.4, max_batch=8)
ONE_BY_ONE = ServiceModel(fixed_seconds=22.0, per_item_seconds=2.5, max_batch=1)
FAST = ServiceModel(fixed_seconds=0.05, per_item_seconds=0.01, max_batch=32)

models = st.builds(
    ServiceModel,
    fixed_seconds=st.floats(0.0, 30.0),
    per_item_seconds=st.floats(0.001, 5.0),
    max_batch=st.integers(1, 64),
)


def test_erlang_c_matches_the_closed_form_for_two_servers():
    # M/M/2: C = A^2 / (2 + A) / (1 + A + A^2 / (2 + A)) ... written as 2 rho^2 / (1 + rho)
    for offered in (0.2, 1.0, 1.7):
        rho = offered / 2
        assert erlang_c(2, offered) == pytest.approx(2 * rho**2 / (1 + rho))
    assert erlang_c(3, 0.0) == 0.0
    assert erlang_c(3, 3.0) == 1.0


def test_service_model_rejects_what_no_batcher_measures():
    with pytest.raises(ValueError, match="fixed_seconds"):
        ServiceModel(0.0, 0.0, 4)
    with pytest.raises(ValueError, match="fixed_seconds"):
        ServiceModel(-1.0, 0.5, 4)
    with pytest.raises(ValueError, match="fixed_seconds"):
        ServiceModel(math.nan, 0.5, 4)
    with pytest.raises(ValueError, match="max_batch"):
        ServiceModel(1.0, 0.5, 0)
    with pytest.raises(ValueError, match="whole number"):
        ServiceModel(1.0, 0.5, 2.5)


def test_calibrate_recovers_the_cost_terms():
    sizes = np.array([1, 2, 4, 8, 1, 8])
    fitted = ServiceModel.calibrate(sizes, 0.3 + 0.05 * sizes, max_batch=8)
    assert fitted.fixed_seconds == pytest.approx(0.3)
    assert fitted.per_item_seconds == pytest.approx(0.05)
    assert fitted.capacity_rps == pytest.approx(8 / 0.7)
    with pytest.raises(ValueError, match="two or more batch sizes"):
        ServiceModel.calibrate(np.array([4, 4]), np.array([1.0, 1.1]), 8)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: modelled_p99(-1.0, 2, BATCHED), "rate_rps"),
        (lambda: modelled_p99(math.nan, 2, BATCHED), "rate_rps"),
        (lambda: modelled_p99(1.0, 0, BATCHED), "replicas"),
        (lambda: modelled_p99(1.0, 2, BATCHED, quantile=1.0), "quantile"),
        (lambda: modelled_p99(1.0, 2, BATCHED, quantile=0.0), "quantile"),
        (lambda: replace(BATCHED, service_scv=-0.1), "service_scv"),
        (lambda: replace(BATCHED, service_scv=math.nan), "service_scv"),
        (lambda: replicas_for_slo(-1, 5, BATCHED, min_replicas=1, max_replicas=4), "rate_rps"),
        (lambda: replicas_for_slo(1, 0, BATCHED, min_replicas=1, max_replicas=4), "slo_seconds"),
        (lambda: replicas_for_slo(1, -2, BATCHED, min_replicas=1, max_replicas=4), "slo_seconds"),
        (
            lambda: replicas_for_slo(1, math.inf, BATCHED, min_replicas=1, max_replicas=4),
            "slo_seconds",
        ),
        (
            lambda: replicas_for_slo(1, 5, BATCHED, min_replicas=1, max_replicas=4, quantile=1.5),
            "quantile",
        ),
        (lambda: replicas_for_slo(1, 5, BATCHED, min_replicas=5, max_replicas=4), "min_replicas"),
        (lambda: replicas_for_slo(1, 5, BATCHED, min_replicas=0, max_replicas=4), "min_replicas"),
    ],
)
def test_bad_inputs_are_refused_with_the_name_of_the_problem(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_an_idle_fleet_is_modelled_at_one_request_service_time():
    assert modelled_p99(0.0, 3, BATCHED) == pytest.approx(1.9)


def test_a_fleet_that_cannot_keep_up_has_unbounded_latency():
    assert math.isinf(modelled_p99(2 * BATCHED.capacity_rps, 2, BATCHED))


def test_sizing_answers_with_a_status_sentence():
    sizing = replicas_for_slo(5.0, 8.0, BATCHED, min_replicas=1, max_replicas=64)
    assert isinstance(sizing, SloSizing)
    assert sizing.feasible
    assert sizing.modelled_p99_seconds <= 8.0
    assert modelled_p99(5.0, sizing.replicas - 1, BATCHED) > 8.0
    assert sizing.reason.startswith(f"{sizing.replicas} replicas: modelled p99 ")
    assert "<= SLO 8 s at 5 req/s" in sizing.reason


@pytest.mark.parametrize(
    ("quantile", "named"),
    [(0.95, "p95 "), (0.999, "p999 "), (0.9999, "p9999 "), (0.9928630186, "p99.29 ")],
)
def test_the_status_sentence_names_the_quantile_sized_for(quantile, named):
    # a quantile derived from an objective has many digits: they must stay readable
    sizing = replicas_for_slo(5.0, 8.0, BATCHED, min_replicas=1, max_replicas=64, quantile=quantile)
    assert f"modelled {named}" in sizing.reason


def test_an_slo_below_the_batch_time_is_infeasible_without_buying_the_whole_fleet():
    sizing = replicas_for_slo(0.5, 1.0, BATCHED, min_replicas=2, max_replicas=50)
    assert not sizing.feasible
    assert sizing.replicas < 50
    # the fewest at which the p99 request does not wait: one request's service time
    assert sizing.modelled_p99_seconds == pytest.approx(BATCHED.batch_seconds(1))
    assert modelled_p99(0.5, sizing.replicas - 1, BATCHED) > BATCHED.batch_seconds(1)
    assert "out of reach: one request takes 1.9 s" in sizing.reason


def test_an_slo_above_the_batch_time_that_no_count_meets_gets_every_replica():
    rate = 4 * BATCHED.capacity_rps * 0.95  # 4 replicas barely keep up, with a long queue tail
    sizing = replicas_for_slo(rate, 5.0, BATCHED, min_replicas=1, max_replicas=4)
    assert (sizing.replicas, sizing.feasible) == (4, False)
    assert "best modelled p99" in sizing.reason


def test_a_rate_beyond_the_largest_fleet_is_infeasible_at_max_replicas():
    sizing = replicas_for_slo(100.0, 10.0, BATCHED, min_replicas=1, max_replicas=10)
    assert (sizing.replicas, sizing.feasible) == (10, False)
    assert math.isinf(sizing.modelled_p99_seconds)
    assert "cannot keep up" in sizing.reason


@settings(max_examples=150, deadline=None)
@given(
    models,
    st.floats(0.0, 500.0),
    st.floats(0.0, 500.0),
    st.floats(0.5, 200.0),
    st.integers(1, 20),
    st.integers(0, 80),
)
def test_sizing_is_monotone_in_rate_and_stays_within_bounds(model, r1, r2, slo, lo, span):
    low, high = sorted((r1, r2))
    a = replicas_for_slo(low, slo, model, min_replicas=lo, max_replicas=lo + span)
    b = replicas_for_slo(high, slo, model, min_replicas=lo, max_replicas=lo + span)
    assert lo <= a.replicas <= b.replicas <= lo + span
    assert a.feasible or not b.feasible
    if a.feasible:
        assert a.modelled_p99_seconds <= slo
        if a.replicas > lo:  # the fewest: one fewer would breach the SLO
            assert modelled_p99(low, a.replicas - 1, model) > slo


@settings(max_examples=150, deadline=None)
@given(models, st.floats(0.0, 200.0), st.integers(1, 60))
def test_modelled_latency_falls_as_replicas_are_added(model, rate, replicas):
    assert modelled_p99(rate, replicas + 1, model) <= modelled_p99(rate, replicas, model)


@settings(max_examples=100, deadline=None)
@given(models, st.floats(0.5, 200.0), st.integers(1, 20), st.integers(0, 40))
def test_zero_rate_needs_only_min_replicas(model, slo, lo, span):
    sizing = replicas_for_slo(0.0, slo, model, min_replicas=lo, max_replicas=lo + span)
    assert sizing.replicas == lo
    assert sizing.feasible == (model.batch_seconds(1) <= slo)


@settings(max_examples=100, deadline=None)
@given(models, st.floats(0.0, 500.0), st.floats(0.5, 200.0), st.integers(1, 30))
def test_infeasible_means_no_allowed_count_meets_the_slo(model, rate, slo, top):
    sizing = replicas_for_slo(rate, slo, model, min_replicas=1, max_replicas=top)
    if not sizing.feasible:
        assert modelled_p99(rate, top, model) > slo


def _simulated_p99(rate: float, replicas: int, model: ServiceModel, requests: int) -> float:
    """p99 latency of Poisson arrivals through the simulator's fleet model (warm-up dropped)."""
    rng = np.random.default_rng(7)
    arrivals = np.cumsum(rng.exponential(1.0 / rate, requests))
    fleet = Fleet(arrivals, np.ones(requests), model, cold_start=0.0, initial_replicas=replicas)
    fleet.advance(float(arrivals[-1]) + 1e6)
    latency = (fleet.finished - arrivals)[requests // 10 :]
    return float(np.percentile(latency, 99))


@pytest.mark.parametrize("model", [BATCHED, ONE_BY_ONE, FAST], ids=["batched", "single", "fast"])
@pytest.mark.parametrize("replicas", [2, 8, 32])
@pytest.mark.parametrize("load", [0.5, 0.85])
def test_the_model_tracks_the_fleet_it_sizes(model, replicas, load):
    """The referee is the simulator's own fleet: the model may overstate the p99 (it assumes a
    waiting request rides a full batch) but never understates it by more than a sixth."""
    rate = load * replicas * model.capacity_rps
    simulated = _simulated_p99(rate, replicas, model, 20000)
    ratio = modelled_p99(rate, replicas, model) / simulated
    assert 0.83 <= ratio <= 2.5, f"model/simulated p99 = {ratio:.2f}"


def test_service_spread_lengthens_the_p99_and_never_asks_for_fewer_replicas():
    """Requests whose service varies (scv 0.045, as on the Alibaba trace): at rest the p99 is the
    p99 request's own service, z(0.99) * sqrt(scv) over the mean; under load it is longer than
    with every request at its mean, so the sizing buys at least as many replicas."""
    spread = 1 + 2.3263 * math.sqrt(0.045)
    varied = replace(ONE_BY_ONE, service_scv=0.045)
    assert modelled_p99(0.0, 3, varied) == pytest.approx(24.5 * spread, rel=1e-4)
    more = 0
    for rate in (0.25, 0.5, 1.0, 2.0, 4.0):
        plain = replicas_for_slo(rate, 60.0, ONE_BY_ONE, min_replicas=1, max_replicas=400)
        spread_out = replicas_for_slo(rate, 60.0, varied, min_replicas=1, max_replicas=400)
        assert modelled_p99(rate, plain.replicas, varied) > plain.modelled_p99_seconds
        assert spread_out.replicas >= plain.replicas
        more += spread_out.replicas > plain.replicas
    assert more >= 1


def _erlang_c_closed_form(servers: int, offered: float) -> float:
    """Erlang C from its textbook sum, independent of the module's recurrence."""
    top = offered**servers / math.factorial(servers) * servers / (servers - offered)
    return top / (sum(offered**k / math.factorial(k) for k in range(servers)) + top)


@pytest.mark.parametrize("servers", [1, 3, 10, 40])
@pytest.mark.parametrize("load", [0.3, 0.7, 0.95])
def test_the_waiting_tail_is_erlang_c_for_exponential_service(servers, load):
    """M/M/n, one by one, exponential service (scv 1): P(W > t) = C(n, A) exp(-(n mu - lambda) t)
    exactly, with mu one request per t(1)."""
    model = ServiceModel(fixed_seconds=2.0, per_item_seconds=0.5, max_batch=1, service_scv=1.0)
    mu = 1 / model.batch_seconds(1)
    rate = load * servers * mu
    chance = _erlang_c_closed_form(servers, rate / mu)
    for seconds in (0.0, 0.7, 3.0, 12.0):
        exact = chance * math.exp(-(servers * mu - rate) * seconds)
        assert wait_exceedance(seconds, rate, servers, model) == pytest.approx(exact, rel=1e-9)
    assert wait_exceedance(-1.0, rate, servers, model) == 1.0


@pytest.mark.parametrize("scv", [0.0, 0.045, 0.5, 1.0])
@pytest.mark.parametrize("load", [0.2, 0.6, 0.9])
def test_one_replica_waits_as_pollaczek_khinchine_on_average(scv, load):
    """M/G/1: E[W] = rho (1 + scv) E[S] / (2 (1 - rho)). The tail integrated over t is the mean."""
    model = replace(ONE_BY_ONE, service_scv=scv)
    mean_service = model.batch_seconds(1)
    rate = load / mean_service
    exact = load * (1 + scv) * mean_service / (2 * (1 - load))
    grid = np.linspace(0.0, 60 * exact + 10 * mean_service, 20001)
    tail = np.array([wait_exceedance(t, rate, 1, model) for t in grid])
    integrated = float(np.sum((tail[1:] + tail[:-1]) / 2 * np.diff(grid)))
    assert integrated == pytest.approx(exact, rel=1e-3)


def _md1_waits_longer_than(seconds: float, rate: float, service: float) -> float:
    """Erlang's exact M/D/1 waiting-time distribution, summed in 80-digit decimals (its terms
    alternate and cancel)."""
    getcontext().prec = 80
    x, lam, d = Decimal(seconds), Decimal(rate), Decimal(service)
    total = Decimal(0)
    for k in range(int(x // d) + 1):
        y = lam * (k * d - x)
        total += y**k / math.factorial(k) * (-y).exp()
    return 1.0 - float((1 - lam * d) * total)


@pytest.mark.parametrize("load", [0.3, 0.5, 0.7, 0.85, 0.95])
def test_deterministic_service_on_one_replica_errs_long_and_less_as_load_grows(load):
    """M/D/1 against Erlang's exact distribution: the model's p99 wait is never shorter than the
    exact one, and no more than 30% longer (the exponential tail is heavier than the truth)."""
    model = ServiceModel(fixed_seconds=1.0, per_item_seconds=0.0, max_batch=1)
    rate = load

    def p99_wait(exceeds) -> float:
        low, high = 0.0, 100.0
        for _ in range(40):
            middle = (low + high) / 2
            low, high = (middle, high) if exceeds(middle) > 0.01 else (low, middle)
        return high

    exact = p99_wait(lambda t: _md1_waits_longer_than(t, rate, 1.0))
    modelled = p99_wait(lambda t: wait_exceedance(t, rate, 1, model))
    assert 1.0 <= modelled / exact <= 1.3


# The Alibaba fleets' request mix: one, two, four or eight images at 22.3 s + 2.46 s per image.
IMAGES = np.array([1.0, 2.0, 4.0, 8.0])
IMAGE_SHARES = np.array([0.58, 0.08, 0.19, 0.15])


def test_the_spread_enters_the_tail_as_a_sum_not_a_sum_of_quantiles():
    """On the Alibaba fleets' own mix of request sizes, told its spread, the model tracks the
    simulated p99 at the fleet sizes and loads those fleets run at. Adding the p99 request's
    service to the p99 wait (the earlier model) overstated it by 30-43% at 4 and 16 replicas."""
    mean_images = float(IMAGES @ IMAGE_SHARES)
    work = IMAGES / mean_images
    seconds = 22.3 + 2.46 * IMAGES
    scv = float(IMAGE_SHARES @ seconds**2 / (IMAGE_SHARES @ seconds) ** 2 - 1)
    model = ServiceModel(22.3, 2.46 * mean_images, 1, service_scv=scv)
    for replicas, load in ((4, 0.7), (16, 0.85), (32, 0.9)):
        rate = load * replicas * model.capacity_rps
        rng = np.random.default_rng(11)
        requests = 20000
        arrivals = np.cumsum(rng.exponential(1.0 / rate, requests))
        sizes = rng.choice(work, requests, p=IMAGE_SHARES)
        fleet = Fleet(arrivals, sizes, model, cold_start=0.0, initial_replicas=replicas)
        fleet.advance(float(arrivals[-1]) + 1e6)
        simulated = float(np.percentile((fleet.finished - arrivals)[requests // 10 :], 99))
        ratio = modelled_p99(rate, replicas, model) / simulated
        assert 0.93 <= ratio <= 1.25, f"n={replicas} load {load}: model/simulated {ratio:.2f}"


@settings(max_examples=100, deadline=None)
@given(models, st.floats(0.0, 200.0), st.floats(0.0, 200.0), st.floats(0.0, 1.0))
def test_sizing_with_spread_is_monotone_in_rate(model, r1, r2, scv):
    low, high = sorted((r1, r2))
    model = replace(model, service_scv=scv)
    a = replicas_for_slo(low, 30.0, model, min_replicas=1, max_replicas=40)
    b = replicas_for_slo(high, 30.0, model, min_replicas=1, max_replicas=40)
    assert a.replicas <= b.replicas


def test_a_best_effort_slice_is_reserved_out_of_the_slo():
    """An online request may wait one best-effort slice for its replica, so the fleet is sized
    for what the SLO leaves after it; no best-effort work reserves nothing."""
    assert slo_less_best_effort_slice(30.0, None) == 30.0
    assert slo_less_best_effort_slice(30.0, 0.0) == 30.0
    assert slo_less_best_effort_slice(30.0, 4.0) == 26.0
    for quantum in (30.0, 45.0):
        with pytest.raises(ValueError, match="leaves nothing of the SLO"):
            slo_less_best_effort_slice(30.0, quantum)
    for quantum in (math.nan, math.inf, -1.0):
        with pytest.raises(ValueError, match="best-effort quantum"):
            slo_less_best_effort_slice(30.0, quantum)


@settings(max_examples=100, deadline=None)
@given(models, st.floats(0.0, 200.0), st.floats(0.0, 20.0))
def test_reserving_a_slice_never_asks_for_fewer_replicas(model, rate, quantum):
    plain = replicas_for_slo(rate, 30.0, model, min_replicas=1, max_replicas=40)
    held = slo_less_best_effort_slice(30.0, quantum)
    reserved = replicas_for_slo(rate, held, model, min_replicas=1, max_replicas=40)
    assert reserved.replicas >= plain.replicas


def test_a_request_behind_a_backlog_waits_for_it_to_drain_at_full_batches():
    """A queue left by a burst is outside the steady-state model: a request arriving behind it
    waits at least for it to be served at full-batch throughput, then rides a full batch."""
    rate, replicas = 0.5 * 4 * BATCHED.capacity_rps, 4
    steady = modelled_p99(rate, replicas, BATCHED)
    assert modelled_p99(rate, replicas, BATCHED, backlog_requests=0.0) == steady
    assert modelled_p99(rate, replicas, BATCHED, backlog_requests=2.0) == steady  # usual queue
    behind = 200 / (replicas * BATCHED.capacity_rps) + BATCHED.batch_seconds(8)
    assert modelled_p99(rate, replicas, BATCHED, backlog_requests=200.0) == pytest.approx(behind)
    calm = replicas_for_slo(rate, 8.0, BATCHED, min_replicas=1, max_replicas=64)
    late = replicas_for_slo(
        rate, 8.0, BATCHED, min_replicas=1, max_replicas=64, backlog_requests=200.0
    )
    assert late.replicas > calm.replicas and late.feasible
    assert "with 200 waiting" in late.reason
    for bad in (-1.0, math.nan, math.inf):
        with pytest.raises(ValueError, match="backlog_requests"):
            modelled_p99(rate, replicas, BATCHED, backlog_requests=bad)


@settings(max_examples=100, deadline=None)
@given(models, st.floats(0.0, 200.0), st.floats(0.0, 500.0), st.floats(0.0, 500.0))
def test_sizing_is_monotone_in_the_backlog(model, rate, q1, q2):
    low, high = sorted((q1, q2))
    a = replicas_for_slo(rate, 30.0, model, min_replicas=1, max_replicas=40, backlog_requests=low)
    b = replicas_for_slo(rate, 30.0, model, min_replicas=1, max_replicas=40, backlog_requests=high)
    assert a.replicas <= b.replicas


def test_an_slo_below_the_batch_time_with_a_backlog_still_does_not_buy_the_whole_fleet():
    sizing = replicas_for_slo(
        0.5, 1.0, BATCHED, min_replicas=2, max_replicas=50, backlog_requests=30.0
    )
    assert not sizing.feasible and sizing.replicas < 50
