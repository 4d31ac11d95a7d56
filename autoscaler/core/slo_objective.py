"""The per-request latency target that an SLO objective over windows allows.

An SLO is usually stated over windows: "in ``objective`` of the minutes, the minute's p99
latency is within the SLO". Sizing so that each request is late with probability ``1 - q``
(the window's own quantile) does not hold that: a minute of 30 requests breaches its p99 when
one request is late, and a fleet whose requests are late one time in a hundred has most such
minutes bad. How strict a request's target must be depends on how many requests share a window,
so it is derived here from the objective instead of being picked by hand.

A window of ``n`` requests is bad when more than ``floor((1 - q) * n)`` of them exceed the SLO
(its ``q``-quantile is then over). If each request is late with probability ``p``, independently,
the number late is Binomial(n, p), and the window is bad with probability
``P(Binomial(n, p) > floor((1 - q) * n))``. The largest ``p`` that keeps that within
``1 - objective`` is the per-request exceedance to size for. It is an approximation: requests in
one window share the queue, so lateness comes in clusters (fewer windows hit, more late requests
in each); the simulator's fleet model is the referee (``bench/fleet_backfill.py``).

Both directions come from scipy. The tail is ``scipy.stats.binom.sf``, exact to a few units in
the last place (the hand-written sum of ``lgamma`` terms it replaced was off by one part in ten
million on a tail of 5e-8); the largest ``p`` is ``scipy.special.bdtri``, the binomial CDF
inverted in ``p``, in one call instead of a bisection of up to 200 tail sums. scipy is imported
on first use: the controller and the simulator import this module whether or not an objective
is set, and most runs set none.

The answer falls as ``n`` grows towards a multiple of ``1 / (1 - q)`` (one late request spoils
more of the windows, allowing for none more) and jumps up where the window allows one more late
request; for large ``n`` it tends to ``1 - q``. So it is not monotone in the rate: sizing built on
it relies on the scale-down stabilization to hold the larger count across such a step.
"""

from __future__ import annotations

import functools
import math

DEFAULT_OBJECTIVE_WINDOW_SECONDS = 60.0


def window_breach_probability(requests: int, exceedance: float, quantile: float) -> float:
    """``P(Binomial(requests, exceedance) > floor((1 - quantile) * requests))``: the chance that a
    window of ``requests`` has its ``quantile`` latency over the SLO when each request exceeds
    it independently with probability ``exceedance``."""
    _check_requests(requests)
    _check_fraction("quantile", quantile)
    if not 0 <= exceedance <= 1:
        raise ValueError(f"exceedance must be a probability in [0, 1], got {exceedance!r}")
    allowed = late_requests_allowed(requests, quantile)
    if allowed >= requests or exceedance == 0:
        return 0.0
    if exceedance == 1:
        return 1.0
    from scipy.stats import binom

    return min(1.0, max(0.0, float(binom.sf(allowed, requests, exceedance))))


def late_requests_allowed(requests: int, quantile: float) -> int:
    """How many of a window's ``requests`` may exceed the SLO with its ``quantile`` within it."""
    # the small epsilon keeps 0.01 * 100 at 1 despite binary fractions
    return math.floor((1.0 - quantile) * requests + 1e-9)


@functools.lru_cache(maxsize=8192)
def request_exceedance_for_objective(requests: int, quantile: float, objective: float) -> float:
    """The largest per-request chance of exceeding the SLO at which a window of ``requests``
    is good (its ``quantile`` within the SLO) with probability at least ``objective``.

    A window is good when at most ``late_requests_allowed`` of its requests are late, so this is
    the ``p`` at which the binomial CDF at that count equals ``objective``: ``bdtri`` solves it
    (the CDF falls as ``p`` rises, so the ``p`` found is the largest)."""
    _check_requests(requests)
    _check_fraction("quantile", quantile)
    _check_fraction("objective", objective)
    from scipy.special import bdtri

    return float(bdtri(late_requests_allowed(requests, quantile), requests, objective))


def sizing_quantile_for_objective(
    rate_rps: float,
    quantile: float,
    objective: float,
    window_seconds: float = DEFAULT_OBJECTIVE_WINDOW_SECONDS,
) -> float:
    """The per-request latency quantile to size for at ``rate_rps`` so that ``objective`` of the
    ``window_seconds`` windows hold their ``quantile`` within the SLO: ``1 - p`` for the ``p`` of
    :func:`request_exceedance_for_objective` at the window's expected request count (at least
    one: a window that is scored has a request)."""
    if not (math.isfinite(rate_rps) and rate_rps >= 0):
        raise ValueError(f"rate_rps must be a finite number >= 0 requests/s, got {rate_rps!r}")
    if not (math.isfinite(window_seconds) and window_seconds > 0):
        raise ValueError(f"window_seconds must be a finite number > 0, got {window_seconds!r}")
    requests = max(1, round(rate_rps * window_seconds))
    exceedance = request_exceedance_for_objective(requests, quantile, objective)
    sizing = 1.0 - exceedance
    if not sizing < 1.0:
        raise ValueError(
            f"objective {objective!r} leaves no room for a late request; lower it below 1"
        )
    return sizing


def _check_requests(requests: int) -> None:
    if isinstance(requests, bool) or int(requests) != requests or requests < 1:
        raise ValueError(f"requests must be a whole number >= 1, got {requests!r}")


def _check_fraction(name: str, value: float) -> None:
    if not (isinstance(value, (int, float)) and 0 < value < 1):
        raise ValueError(f"{name} must be in (0, 1), e.g. 0.99, got {value!r}")
