"""How many replicas an arrival rate needs for its latency SLO, from the batch cost model.

A replica serves batches of up to ``max_batch`` requests in ``t(b) = fixed + per_item * b``
seconds (the batcher fits and exports both terms). Requests wait in one queue that every replica
drains, so the fleet is a multi-server queue whose servers grow more efficient as their batches
fill. A utilization target cannot express that: the same 0.7 is lavish for a large fleet and
tight for a small one, and it ignores how long a batch takes against the SLO. This module asks
the question the SLO poses directly: the fewest replicas whose modelled p99 latency holds.

Why an Erlang C approximation (M/G/n with a Kingman-style tail) rather than a look-ahead
simulation: the answer must be monotone in the rate and in the replica count (or the autoscaler
flaps on noise), cost microseconds (the simulator asks every tick of a month-long replay), and
be explainable in one status line. The model:

* the chance that a request waits at all is Erlang C at the load of requests served one by one
  (1 once batches form: one replica could not keep up serving them one by one);
* the wait beyond that decays exponentially at the backlog's drain rate at full-batch
  throughput, scaled by Kingman's ``2 / (1 + scv)``. For one-by-one service this is exact for
  exponential service times (Erlang C's tail) and gives Pollaczek-Khinchine's mean wait on one
  replica; for deterministic service it errs long, less so as the load grows;
* once batches form every replica is busy, and a request first waits for the next one to free
  up; a request that waits rides a full batch (``t(max_batch)``), the slowest kind;
* the latency quantile is that of the wait plus the request's own service, whose spread
  (``service_scv``, normal: the batchers' spreads are narrow) is convolved with the wait. Adding
  a service quantile to a wait quantile instead counts two rare events as one and overstates
  the p99 of a fleet whose requests vary.

The simulator's fleet model is the referee: tests and the bench compare this p99 with the
simulated one over a grid of rates, fleet sizes and cost models.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np


@dataclass(frozen=True)
class ServiceModel:
    """Batch service time ``fixed_seconds + per_item_seconds * b`` for ``b <= max_batch``.

    ``service_scv`` is the squared coefficient of variation of one request's service time (0:
    every request takes the mean). Requests differ in size and batch times jitter; the batcher
    measures both and exports their combined spread beside the two cost terms, because a mean
    alone sizes a fleet whose slowest requests miss the SLO.
    """

    fixed_seconds: float
    per_item_seconds: float
    max_batch: int
    service_scv: float = 0.0

    def __post_init__(self) -> None:
        values = (self.fixed_seconds, self.per_item_seconds)
        if not all(math.isfinite(v) and v >= 0 for v in values) or sum(values) <= 0:
            raise ValueError(
                "service time needs fixed_seconds >= 0, per_item_seconds >= 0 and a positive "
                f"sum (seconds), got {self.fixed_seconds!r} and {self.per_item_seconds!r}"
            )
        if isinstance(self.max_batch, bool) or int(self.max_batch) != self.max_batch:
            raise ValueError(f"max_batch must be a whole number, got {self.max_batch!r}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if not (math.isfinite(self.service_scv) and self.service_scv >= 0):
            raise ValueError(f"service_scv must be a finite number >= 0, got {self.service_scv!r}")

    def batch_seconds(self, size: float) -> float:
        """Seconds one replica takes for a batch of ``size`` average requests."""
        return self.fixed_seconds + self.per_item_seconds * size

    @property
    def capacity_rps(self) -> float:
        """Average requests per second one busy replica serves at full batches."""
        return self.max_batch / self.batch_seconds(self.max_batch)

    @classmethod
    def calibrate(
        cls, batch_sizes: np.ndarray, seconds: np.ndarray, max_batch: int
    ) -> ServiceModel:
        """Least-squares fit of both terms to measured (batch size, batch seconds) pairs."""
        b = np.asarray(batch_sizes, float)
        y = np.asarray(seconds, float)
        if b.size < 2 or np.ptp(b) == 0:
            raise ValueError("calibration needs measurements at two or more batch sizes")
        per_item, fixed = np.polyfit(b, y, 1)
        return cls(max(0.0, float(fixed)), max(0.0, float(per_item)), max_batch)


@dataclass(frozen=True)
class SloSizing:
    replicas: int
    modelled_p99_seconds: float  # at ``replicas``; math.inf when the fleet cannot keep up
    feasible: bool  # False when even max_replicas cannot hold the SLO
    reason: str  # one sentence for status conditions and events


def erlang_c(servers: int, offered_erlangs: float) -> float:
    """Probability that an arrival finds all ``servers`` busy (M/M/n), 1.0 when unstable."""
    if offered_erlangs <= 0:
        return 0.0
    if offered_erlangs >= servers:
        return 1.0
    blocking = 1.0  # Erlang B by its stable recurrence
    for k in range(1, servers + 1):
        blocking = offered_erlangs * blocking / (k + offered_erlangs * blocking)
    return servers * blocking / (servers - offered_erlangs * (1.0 - blocking))


def modelled_p99(
    rate_rps: float,
    replicas: int,
    model: ServiceModel,
    *,
    quantile: float = 0.99,
    backlog_requests: float = 0.0,
) -> float:
    """The modelled ``quantile`` of end-to-end latency (seconds) at ``rate_rps`` on ``replicas``.

    Latency is a request's wait plus its own service, and the quantile is taken of their sum:
    the service spread (``model.service_scv``) widens both the no-wait and the waiting branch
    rather than being added on as a quantile of its own. Returns ``math.inf`` when the replicas
    cannot keep up at full batches.

    ``backlog_requests`` is the queue waiting now. The steady-state model knows only the queues
    its own load makes; a fleet sized for the arrival rate alone drains a larger backlog (left
    by a burst or a late scale-up) with its spare capacity only, for minutes on end. A request
    arriving behind it waits at least for the backlog to be served at full-batch throughput,
    ``backlog / (replicas * capacity)``, then rides a full batch: the quantile is the longer of
    that and the steady state's.
    """
    _check_rate(rate_rps)
    _check_quantile(quantile)
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    _check_backlog(backlog_requests)
    steady = _steady_p99(rate_rps, replicas, model, quantile)
    if backlog_requests == 0 or math.isinf(steady):
        return steady
    behind = backlog_requests / (replicas * model.capacity_rps) + model.batch_seconds(
        model.max_batch
    ) * _service_spread(quantile, model.service_scv)
    return max(steady, behind)


def _steady_p99(rate_rps: float, replicas: int, model: ServiceModel, quantile: float) -> float:
    """The latency quantile in the steady state of ``rate_rps`` on ``replicas`` (no backlog)."""
    alone = model.batch_seconds(1)
    if rate_rps == 0:
        return alone * _service_spread(quantile, model.service_scv)
    wait = _waiting_time(rate_rps, replicas, model)
    if wait is None:
        return math.inf
    spread = math.sqrt(model.service_scv)
    full = model.batch_seconds(model.max_batch)
    budget = 1.0 - quantile

    def exceedance(seconds: float) -> float:
        # P(latency > seconds): served at once, alone; or after waiting, in a full batch
        served_at_once = (1.0 - wait.probability) * _normal_tail(seconds, alone, alone * spread)
        waited = wait.probability * _normal_plus_exponential_tail(
            seconds - wait.shift_seconds, full, full * spread, wait.decay_per_second
        )
        return served_at_once + waited

    # No latency quantile is below a lone request's own: where that holds, it is the answer.
    low = alone * _service_spread(quantile, model.service_scv)
    if exceedance(low) <= budget:
        return low
    high = wait.shift_seconds + full * (1.0 + 4.0 * spread) + low
    while exceedance(high) > budget:
        high *= 2.0
    # the exceedance falls with the latency, so its quantile is found by bisection
    while high - low > 1e-9 * high:
        middle = (low + high) / 2.0
        if exceedance(middle) > budget:
            low = middle
        else:
            high = middle
    return high


@dataclass(frozen=True)
class _Wait:
    """A request waits with ``probability``; given that, ``shift_seconds`` plus an exponential
    time of rate ``decay_per_second``."""

    probability: float
    shift_seconds: float
    decay_per_second: float


def wait_exceedance(seconds: float, rate_rps: float, replicas: int, model: ServiceModel) -> float:
    """The modelled chance that a request waits longer than ``seconds`` before its service.

    For one-by-one service (``max_batch`` 1) it is the M/G/n approximation
    ``C(n, A) * exp(-(n*mu - rate) * 2 / (1 + scv) * seconds)``: exact for exponential service
    (scv 1, Erlang C), and its mean is Pollaczek-Khinchine's for one replica.
    """
    _check_rate(rate_rps)
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    wait = _waiting_time(rate_rps, replicas, model)
    if wait is None or seconds < 0:
        return 1.0
    if seconds < wait.shift_seconds:
        return wait.probability
    return wait.probability * math.exp(-wait.decay_per_second * (seconds - wait.shift_seconds))


def _waiting_time(rate_rps: float, replicas: int, model: ServiceModel) -> _Wait | None:
    """How long a request waits, or ``None`` when the replicas cannot keep up at full batches.

    The chance of waiting is Erlang C at the load of requests served one by one (1 once batches
    form). The wait beyond that decays at the backlog's drain rate at full-batch throughput,
    scaled by Kingman's ``2 / (1 + scv)`` (halved decay time for deterministic batches). Once
    batches form every replica is busy, and a request first waits for the next one to free up.
    """
    drain_rps = replicas * model.capacity_rps - rate_rps
    if drain_rps <= 0:
        return None
    offered = rate_rps * model.batch_seconds(1)
    probability = erlang_c(replicas, min(offered, float(replicas)))
    shift = 0.0
    if offered >= replicas:
        shift = model.batch_seconds(_steady_batch(rate_rps, replicas, model)) / replicas
    return _Wait(probability, shift, drain_rps * 2.0 / (1.0 + model.service_scv))


def _normal_tail(seconds: float, mean: float, deviation: float) -> float:
    """P(S > seconds) for a normal service time (a step at the mean when it has no spread)."""
    if deviation == 0:
        return 1.0 if seconds < mean else 0.0
    return 1.0 - _STANDARD_NORMAL.cdf((seconds - mean) / deviation)


def _normal_plus_exponential_tail(
    seconds: float, mean: float, deviation: float, rate: float
) -> float:
    """P(S + E > seconds) for a normal S and an independent exponential E of the given rate
    (the exponentially modified normal), written so that no term overflows."""
    if deviation == 0:
        return 1.0 if seconds < mean else math.exp(-rate * (seconds - mean))
    z = (seconds - mean) / deviation
    tail = 1.0 - _STANDARD_NORMAL.cdf(z)
    spread = rate * deviation
    u = z - spread
    if u >= 0:  # exp(spread^2 / 2 - rate * (seconds - mean)) * Phi(u), the exponent <= 0
        return tail + math.exp(-spread * (u + z) / 2.0) * _STANDARD_NORMAL.cdf(u)
    # phi(z) * Phi(u) / phi(u), with the Mills ratio's expansion where phi(u) underflows
    density = math.exp(-z * z / 2.0) / math.sqrt(2.0 * math.pi) if abs(z) < 40.0 else 0.0
    if u > -30.0:
        ratio = _STANDARD_NORMAL.cdf(u) / _STANDARD_NORMAL.pdf(u)
    else:
        inverse = 1.0 / u
        ratio = -inverse * (1.0 - inverse**2 + 3.0 * inverse**4)
    return tail + density * ratio


_STANDARD_NORMAL = NormalDist()


def _service_spread(quantile: float, service_scv: float) -> float:
    """The ``quantile`` of a service time over its mean, for a normal spread of the given squared
    coefficient of variation (1 for deterministic service): a p99 can be no shorter than the
    p99 request's own service."""
    if service_scv == 0:
        return 1.0
    return 1.0 + max(0.0, _STANDARD_NORMAL.inv_cdf(quantile)) * math.sqrt(service_scv)


def slo_less_best_effort_slice(slo_seconds: float, quantum_seconds: float | None) -> float:
    """The latency the fleet is sized for when best-effort work shares its replicas.

    An online request that arrives while a replica runs a best-effort slice waits up to one
    ``quantum_seconds`` before that replica is free, on top of the queueing the model counts; a
    fleet sized to the whole SLO lets each slice tip the requests at its edge over it. So the
    model holds ``SLO - quantum``. ``None`` (no best-effort work) reserves nothing. A quantum
    that leaves nothing of the SLO raises ``ValueError``: no replica count can help, the
    quantum has to shrink.
    """
    if quantum_seconds is None:
        return slo_seconds
    if not (math.isfinite(quantum_seconds) and quantum_seconds >= 0):
        raise ValueError(
            f"the best-effort quantum must be a finite number of seconds >= 0, got "
            f"{quantum_seconds!r}"
        )
    if quantum_seconds >= slo_seconds:
        raise ValueError(
            f"the best-effort quantum ({quantum_seconds:g} s) leaves nothing of the SLO "
            f"({slo_seconds:g} s) to reserve it from; shorten the quantum"
        )
    return slo_seconds - quantum_seconds


def replicas_for_slo(
    rate_rps: float,
    slo_seconds: float,
    model: ServiceModel,
    *,
    min_replicas: int,
    max_replicas: int,
    quantile: float = 0.99,
    backlog_requests: float = 0.0,
) -> SloSizing:
    """The fewest replicas in ``[min_replicas, max_replicas]`` whose modelled p99 meets the SLO,
    for a request arriving behind ``backlog_requests`` already waiting (see :func:`modelled_p99`).

    When none does, the answer is flagged infeasible. An SLO below a lone request's service
    time ``t(1)`` (which no replica count can beat) is then sized as if it were ``t(1)``: the
    fewest replicas at which the p99 request does not wait (the backlog aside), so it does not
    drive the fleet to its maximum. Any other infeasible SLO gets ``max_replicas``. Both keep
    the answer monotone in the rate and the backlog: the target searched for depends on neither.
    """
    _check_rate(rate_rps)
    _check_quantile(quantile)
    _check_backlog(backlog_requests)
    if not (math.isfinite(slo_seconds) and slo_seconds > 0):
        raise ValueError(f"slo_seconds must be a finite number > 0, got {slo_seconds!r}")
    if not 1 <= min_replicas <= max_replicas:
        raise ValueError(
            f"need 1 <= min_replicas <= max_replicas, got {min_replicas} and {max_replicas}"
        )

    def p99(n: int, backlog: float = backlog_requests) -> float:
        return modelled_p99(rate_rps, n, model, quantile=quantile, backlog_requests=backlog)

    at_max = p99(max_replicas)
    feasible = at_max <= slo_seconds
    # no p99 is shorter than one request's: the SLO is sized as at least this
    floor = model.batch_seconds(1) * _service_spread(quantile, model.service_scv)
    # below it no count helps, nor does draining the backlog faster
    searched = backlog_requests if slo_seconds >= floor else 0.0
    limit = max(slo_seconds, floor)
    # p99 falls as replicas are added, so the fewest that meet the limit are found by bisection.
    lo, hi = (min_replicas if p99(max_replicas, searched) <= limit else max_replicas), max_replicas
    while lo < hi:
        mid = (lo + hi) // 2
        if p99(mid, searched) <= limit:
            hi = mid
        else:
            lo = mid + 1
    latency = p99(lo)
    pct = f"p{_quantile_label(quantile)}"
    waiting = f" with {backlog_requests:.4g} waiting" if backlog_requests > 0 else ""
    if feasible:
        reason = (
            f"{lo} replicas: modelled {pct} {latency:.3g} s <= SLO {slo_seconds:g} s "
            f"at {rate_rps:.4g} req/s{waiting}"
        )
    elif math.isinf(at_max):
        reason = (
            f"SLO {slo_seconds:g} s out of reach: {max_replicas} replicas cannot keep up with "
            f"{rate_rps:.4g} req/s (at most {max_replicas * model.capacity_rps:.4g} req/s)"
        )
    elif slo_seconds < floor and p99(lo, 0.0) <= floor:
        reason = (
            f"SLO {slo_seconds:g} s out of reach: one request takes {floor:.3g} s; {lo} "
            f"replicas keep the {pct} at that at {rate_rps:.4g} req/s{waiting}"
        )
    else:
        reason = (
            f"SLO {slo_seconds:g} s out of reach at {rate_rps:.4g} req/s{waiting}: the best "
            f"modelled {pct} is {at_max:.3g} s, at {lo} replicas"
        )
    return SloSizing(replicas=lo, modelled_p99_seconds=latency, feasible=feasible, reason=reason)


def _steady_batch(rate_rps: float, replicas: int, model: ServiceModel) -> float:
    """The batch size at which busy replicas just keep up (``b = rate * t(b) / replicas``)."""
    spare = replicas - rate_rps * model.per_item_seconds
    if spare <= 0:
        return float(model.max_batch)
    return min(float(model.max_batch), max(1.0, rate_rps * model.fixed_seconds / spare))


def _check_rate(rate_rps: float) -> None:
    if not (math.isfinite(rate_rps) and rate_rps >= 0):
        raise ValueError(f"rate_rps must be a finite number >= 0 requests/s, got {rate_rps!r}")


def _check_backlog(backlog_requests: float) -> None:
    if not (math.isfinite(backlog_requests) and backlog_requests >= 0):
        raise ValueError(
            f"backlog_requests must be a finite number >= 0 requests, got {backlog_requests!r}"
        )


def _check_quantile(quantile: float) -> None:
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must be in (0, 1), e.g. 0.99, got {quantile!r}")


def _quantile_label(quantile: float) -> str:
    """``99``, ``999``, ``9999`` for the usual all-nines quantiles (read as p99.9 and so on);
    any other, such as one derived from an objective, as its percentage to four digits
    (``99.29``), which dropping the point would make unreadable."""
    percent = f"{quantile * 100:.10g}"
    if set(percent) <= set("9."):
        return percent.replace(".", "")
    return f"{quantile * 100:.4g}"
