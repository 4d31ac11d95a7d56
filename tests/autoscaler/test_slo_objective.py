"""The per-request exceedance an SLO objective over windows allows: exact binomial tails, the
derived target's shape in the window's size, and its use by the simulator's SLO sizing."""

from __future__ import annotations

import math
from dataclasses import replace
from fractions import Fraction

import pytest

from autoscaler.core.slo_objective import (
    late_requests_allowed,
    request_exceedance_for_objective,
    sizing_quantile_for_objective,
    window_breach_probability,
)
from autoscaler.core.slo_sizing import ServiceModel
from autoscaler.simulator.engine import SimulationConfig, sized_replicas


def exact_breach(requests: int, exceedance: Fraction, allowed: int) -> Fraction:
    """P(Binomial > allowed) in exact rational arithmetic."""
    within = sum(
        math.comb(requests, k) * exceedance**k * (1 - exceedance) ** (requests - k)
        for k in range(allowed + 1)
    )
    return 1 - within


@pytest.mark.parametrize(
    ("requests", "exceedance"), [(1, "1/200"), (7, "1/50"), (100, "1/1000"), (250, "3/1000")]
)
def test_breach_probability_is_the_exact_binomial_tail(requests: int, exceedance: str) -> None:
    p = Fraction(exceedance)
    allowed = late_requests_allowed(requests, 0.99)
    expected = exact_breach(requests, p, allowed)
    assert window_breach_probability(requests, float(p), 0.99) == pytest.approx(
        float(expected), rel=1e-9
    )


def test_a_window_allows_one_late_request_per_hundred_at_p99() -> None:
    assert [late_requests_allowed(n, 0.99) for n in (1, 99, 100, 199, 200, 1000)] == [
        0,
        0,
        1,
        1,
        2,
        10,
    ]


def test_breach_probability_rises_with_the_exceedance() -> None:
    values = [window_breach_probability(150, p / 1000, 0.99) for p in range(0, 50)]
    assert values == sorted(values)
    assert values[0] == 0.0


@pytest.mark.parametrize("requests", [1, 2, 10, 57, 99])
def test_small_windows_allow_no_late_request_closed_form(requests: int) -> None:
    # no late request allowed: P(bad) = 1 - (1 - p)^n, so p = 1 - objective^(1/n)
    p = request_exceedance_for_objective(requests, 0.99, 0.995)
    assert p == pytest.approx(1 - 0.995 ** (1 / requests), rel=1e-9)


def test_the_derived_exceedance_meets_the_objective_and_is_the_largest_that_does() -> None:
    for requests in (1, 40, 100, 333, 2000):
        p = request_exceedance_for_objective(requests, 0.99, 0.995)
        assert window_breach_probability(requests, p, 0.99) <= 0.005 * (1 + 1e-9)
        assert window_breach_probability(requests, p * 1.001, 0.99) > 0.005


def test_small_windows_need_a_far_stricter_target_than_the_quantile() -> None:
    assert request_exceedance_for_objective(99, 0.99, 0.995) < 0.01 / 100


def test_large_windows_tend_to_the_windows_own_quantile() -> None:
    p = [request_exceedance_for_objective(n, 0.99, 0.995) for n in (1000, 10_000, 100_000)]
    assert p == sorted(p)
    assert 0.0085 < p[-1] < 0.01


def test_within_a_step_a_larger_window_is_stricter_and_one_more_late_request_loosens_it() -> None:
    assert request_exceedance_for_objective(150, 0.99, 0.995) < request_exceedance_for_objective(
        100, 0.99, 0.995
    )
    assert request_exceedance_for_objective(200, 0.99, 0.995) > request_exceedance_for_objective(
        199, 0.99, 0.995
    )


def test_a_stricter_objective_asks_for_a_stricter_target() -> None:
    loose = request_exceedance_for_objective(300, 0.99, 0.99)
    strict = request_exceedance_for_objective(300, 0.99, 0.999)
    assert strict < loose


def test_sizing_quantile_reads_the_windows_expected_requests() -> None:
    # 1.5 req/s over a minute: 90 requests, none of them may be late
    assert sizing_quantile_for_objective(1.5, 0.99, 0.995) == pytest.approx(0.995 ** (1 / 90))
    # an idle fleet is sized for the window's first request
    assert sizing_quantile_for_objective(0.0, 0.99, 0.995) == pytest.approx(0.995)
    assert sizing_quantile_for_objective(2.0, 0.99, 0.995, window_seconds=30.0) == pytest.approx(
        0.995 ** (1 / 60)
    )


@pytest.mark.parametrize(
    "call",
    [
        lambda: window_breach_probability(0, 0.1, 0.99),
        lambda: window_breach_probability(10, 1.5, 0.99),
        lambda: request_exceedance_for_objective(10, 0.99, 1.0),
        lambda: request_exceedance_for_objective(10, 1.0, 0.995),
        lambda: sizing_quantile_for_objective(-1.0, 0.99, 0.995),
        lambda: sizing_quantile_for_objective(1.0, 0.99, 0.995, window_seconds=0.0),
    ],
)
def test_bad_input_is_refused_with_a_reason(call) -> None:
    with pytest.raises(ValueError, match="must"):
        call()


def test_the_simulator_sizes_for_the_derived_quantile() -> None:
    service = ServiceModel(22.0, 2.5, 1, service_scv=0.0)
    base = SimulationConfig(service=service, slo_seconds=60.0, sizing="slo")
    with_objective = replace(base, slo_objective=0.995)
    rate = 1.0  # 60 requests a minute, none may be late: far stricter than p99
    derived = replace(base, slo_quantile=sizing_quantile_for_objective(rate, 0.99, 0.995))
    assert sized_replicas(with_objective, rate) == sized_replicas(derived, rate)
    assert sized_replicas(with_objective, rate) > sized_replicas(base, rate)


def test_the_simulator_refuses_an_objective_outside_zero_and_one() -> None:
    with pytest.raises(ValueError, match="slo_objective"):
        SimulationConfig(service=ServiceModel(1.0, 0.1, 4), slo_objective=1.0)


def test_an_objective_that_leaves_no_late_request_is_refused_with_the_fix() -> None:
    with pytest.raises(ValueError, match="lower it"):
        sizing_quantile_for_objective(99 / 60, 0.99, 1 - 1e-15)
