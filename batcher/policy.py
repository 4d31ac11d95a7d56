"""When to start a batch, how large it may be, and whom to refuse: pure decisions, no clock.

Every function here takes the time as an argument and the cost model as a callable, so the rules
are tested by stating a queue and a time and reading the answer. ``cost(n)`` is the conservative
time of a batch of ``n`` items as it would run (after padding to a bucket).

Dispatch (adaptive): a batch is the longest prefix of the queue, in dispatch order, that fits the
cap; the decision is taken whenever the device is free and re-made on every arrival. A batch
starts at once when it is full. A partial batch also starts at once:
* when it serves items comfortably faster than they arrive (``n / t(n) >= KEEP_UP_HEADROOM *
  arrival rate``, with the expected time t, no margin): light load, no waiting;
* when even full batches would keep the device at least ``SELF_CLOCK_BUSY`` of the time busy
  (``rate * t(cap) >= SELF_CLOCK_BUSY * cap``): the device is becoming the bottleneck, and leaving
  it idle while a batch fills only adds latency. Starting whatever waits whenever the device
  frees (self-clocking) makes the batch grow with the load by itself, to the size at which the
  device just keeps up; with t increasing in b, no waiting rule gives a lower latency (a longer
  cycle means both a longer wait and a larger batch). In simulation (``bench/batcher.py``) from
  about half the peak rate on its p99 is the greedy batcher's to within 1%, while a 60 ms fixed
  delay is up to 12% higher below 0.7 of the peak and within a few percent either way above.
Otherwise (a light load whose batches are inefficient) the batch waits to fill, at most as long as
a full batch takes (``t(cap)`` after its oldest request arrived) and never past the latest moment
at which its earliest deadline can still be met by a full batch (the size it would then
dispatch). Within the SLO, that trades latency for device time: at 30% of the peak the device is
busy about two thirds of the time instead of all of it, which co-tenants (on a CPU, the HTTP
server itself) can use.

The two early starts suit a device of its own (a GPU), whose idle time nobody else uses. A model
on the CPU shares the cores with the server's own request handling, and a row costs it less in
a larger batch: there ``fill`` (``dispatch: auto`` on a CPU) drops both early starts once full
batches would keep the device at least ``FILL_FROM_BUSY`` busy, so a partial batch waits to fill
as above; under a lighter load it starts as eagerly as on a GPU (docs/batcher-serving.md has the
measurements).

Deadline: a request's dispatch deadline is ``arrival + TARGET_FRACTION * slo`` (or its own
timeout, when earlier). The remaining fraction absorbs what the engine does not see: request
parsing, response encoding, the network.

Admission (:func:`admission_refusal`): a request is refused at once, rather than queued to be
answered late, when the queue bound is reached, when its batch is predicted to complete past the
SLO (the work ahead at the current cap plus its own batch, at the expected cost), or when the
work ahead cannot start within its timeout. Near saturation a Poisson burst otherwise queues
requests that will all be late and makes every request behind them later; refusing the few
doomed ones keeps the rest within the SLO.

Cap: the largest batch allowed. The target is the size with the most items per second among
those whose time (one noise deviation above the mean) fits ``BATCH_BUDGET_FRACTION`` of the SLO:
a request may wait for the batch in flight and then run in its own, so two batches must fit. The
engine lets the budget give way to throughput near saturation (when that size serves fewer than
``CAP_LOAD_HEADROOM`` times the items arriving per second), since smaller batches would only grow
the backlog and a burst is drained fastest in the most efficient batches. :class:`AdaptiveCap`
holds a limit on top of the target:
* backed off multiplicatively only when a batch's own execution breaks the SLO: it ran clearly
  longer than planned and a request that would have made it in time missed. Misses from waiting
  behind a backlog (overload) never shrink the cap: a smaller batch drains a backlog more slowly,
  the usual AIMD death spiral. For the same reason no back-off goes below the smallest size that
  serves ``CAP_LOAD_HEADROOM`` times the arrivals: on a noisy device (a CPU shared with other
  work) overruns are frequent, and unbounded back-offs walked the cap into overload;
* grown additively, up to the target, while batches are limited by it;
* halved on out-of-memory, with a ceiling below the size that failed until memory is released.
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

TARGET_FRACTION = 0.8
BATCH_BUDGET_FRACTION = 0.5
OVERRUN_TOLERANCE = 0.05  # a batch this much over its planned time ran longer than planned
KEEP_UP_HEADROOM = 1.5  # a partial batch starts at once if it serves this many times the arrivals
SELF_CLOCK_BUSY = 0.35  # full batches would keep the device this busy: start whatever waits
FILL_FROM_BUSY = 0.1  # with fill, the early starts end once full batches would keep it this busy
CAP_LOAD_HEADROOM = 1.5  # the SLO-sized cap must serve this many times the arrivals
CAP_MARGIN_STDDEVS = 1.0  # noise allowed for when sizing the cap (deadlines use the full margin)
BACKOFF_FACTOR = 0.75
GROWTH_FRACTION = 0.125
OOM_CEILING_FRACTION = 0.75
LOOKAHEAD_FRACTION = 0.25  # the next batch is formed this share of the running one's time early
LOOKAHEAD_MIN_SECONDS = 0.001

Cost = Callable[[int], float]


@dataclass(frozen=True)
class Pending:
    """What dispatch needs to know about one waiting request."""

    size: int  # items in the request (its batch dimension)
    arrival: float
    deadline: float  # latest completion time the request should see


@dataclass(frozen=True)
class Decision:
    """Start the first ``take`` queued requests now, or (``take == 0``) wait until ``wake_at``.

    ``wake_at`` None means: nothing to do until something arrives.
    """

    take: int
    wake_at: float | None = None


@dataclass(frozen=True)
class DispatchState:
    """What a dispatch decision looks at, taken when the device is free."""

    queue: Sequence[Pending]  # in dispatch order: priority level, then deadline, then arrival
    now: float
    cap: int
    earliest_start: float = -math.inf  # set by the utilization cap
    arrival_rate: float = math.inf  # items per second recently; inf: assume more will come


class DispatchPolicy(Protocol):
    """Chooses the next batch from a queue given in dispatch order."""

    def decide(self, state: DispatchState, cost: Cost, expected: Cost | None = None) -> Decision:
        """``cost``: conservative time of a batch; ``expected``: its mean (default ``cost``)."""
        ...


def dispatch_deadline(arrival: float, slo_seconds: float, timeout_seconds: float) -> float:
    """The time by which a request should be answered, as the adaptive policy plans it."""
    return arrival + min(TARGET_FRACTION * slo_seconds, timeout_seconds)


def fitting_prefix(queue: Sequence[Pending], cap: int) -> tuple[int, int, bool]:
    """(requests, items, full) of the longest queue prefix within ``cap`` items.

    A first request larger than the cap is taken alone (a request is never split across batches).
    ``full`` says the batch cannot grow: it reached the cap or the next request would not fit.
    """
    count = items = 0
    for pending in queue:
        if items + pending.size > cap:
            if count == 0:
                return 1, pending.size, True
            return count, items, True
        count += 1
        items += pending.size
    return count, items, items >= cap


@dataclass(frozen=True)
class DeadlinePolicy:
    """The adaptive runtime's dispatch rule: full, keeping up, or the last safe moment.

    ``fill`` drops the two early starts (keeping up, self-clocking) once the load is more than
    light (full batches would keep the device at least ``FILL_FROM_BUSY`` of the time busy): a
    partial batch then waits to fill until a full batch's time after its oldest request or its
    last safe moment. For a model on the CPU, where idle device time is the server's own CPU and
    a row costs less in a larger batch, that serves more requests per core within the same SLO;
    under a light load the CPU has time to spare and a request is not held for company.
    """

    fill: bool = False

    def decide(self, state: DispatchState, cost: Cost, expected: Cost | None = None) -> Decision:
        if not state.queue:
            return Decision(0)
        if state.now < state.earliest_start:
            return Decision(0, state.earliest_start)
        count, items, full = fitting_prefix(state.queue, state.cap)
        if full:
            return Decision(count)
        full_seconds = (expected or cost)(state.cap)
        busy_when_full = state.arrival_rate * full_seconds / state.cap
        if not self.fill or busy_when_full < FILL_FROM_BUSY:
            seconds = (expected or cost)(items)
            if seconds <= 0 or items / seconds >= KEEP_UP_HEADROOM * state.arrival_rate:
                return Decision(count)
            if busy_when_full >= SELF_CLOCK_BUSY:
                return Decision(count)
        batch = state.queue[:count]
        latest_start = min(p.deadline for p in batch) - max(cost(items), cost(state.cap))
        # Waiting longer than a full batch takes never pays: the batch would have run and the
        # next one formed meanwhile. This is the delay Triton users tune by hand, set online.
        worth_waiting = min(p.arrival for p in batch) + (expected or cost)(state.cap)
        wake_at = min(latest_start, worth_waiting)
        if wake_at <= state.now:
            return Decision(count)
        return Decision(0, wake_at)


@dataclass(frozen=True)
class FixedDelayPolicy:
    """Baseline in the style of Triton's dynamic batcher, for comparison.

    Starts a batch once ``preferred`` items wait or once the oldest has waited ``max_delay``
    seconds, whatever the load and the SLO. With ``max_delay = 0`` and a cap of 1 it is
    no batching at all.
    """

    max_delay: float
    preferred: int

    def decide(self, state: DispatchState, cost: Cost, expected: Cost | None = None) -> Decision:
        if not state.queue:
            return Decision(0)
        if state.now < state.earliest_start:
            return Decision(0, state.earliest_start)
        count, items, full = fitting_prefix(state.queue, state.cap)
        if full or items >= self.preferred:
            return Decision(count)
        release = min(p.arrival for p in state.queue[:count]) + self.max_delay
        if state.now >= release:
            return Decision(count)
        return Decision(0, release)


def lookahead_at(started: float, expected_seconds: float) -> float:
    """When to form the next batch while one that started at ``started`` runs, for an executor
    that queues batches: early enough that it waits on the device when the running batch ends
    (the engine learns of that end late when its loop is busy), late enough that it still takes
    most of what arrives meanwhile. At once for a batch shorter than the minimum lead."""
    lead = max(LOOKAHEAD_MIN_SECONDS, LOOKAHEAD_FRACTION * expected_seconds)
    return started + max(0.0, expected_seconds - lead)


def next_start_for_utilization(end: float, duration: float, utilization_cap: float) -> float:
    """Earliest next batch start so the device is busy at most ``utilization_cap`` of the time.

    After a batch of ``duration`` seconds the device idles ``duration * (1/cap - 1)``.
    """
    if utilization_cap >= 1.0:
        return end
    return end + duration * (1.0 / utilization_cap - 1.0)


def arrival_rate(mean_gap: float, since_last: float, weight: float) -> float:
    """Requests per second from the running mean inter-arrival gap, decaying while none come.

    The gap still open counts, once it is longer than the mean, as if it had just closed (with
    the running mean's ``weight``): a silence lowers the rate gradually. Taking the open gap for
    the mean itself would halve the rate on every gap twice the mean, which a Poisson stream
    shows one time in seven, and so make the cap flip under steady load.
    """
    gap = mean_gap + weight * max(0.0, since_last - mean_gap)
    return math.inf if gap <= 0 else 1.0 / gap


@dataclass(frozen=True)
class Backlog:
    """The work a new request would queue behind, as admission sees it."""

    queued_items: int  # every waiting item: the queue bound counts them all
    items_ahead: int  # those dispatched before the new request (same or higher priority)
    cap: int  # batch-size cap in force now
    busy_for: float  # predicted rest of the batch running now, seconds
    arrival_rate: float = 0.0  # items per second arriving recently


@dataclass(frozen=True)
class Refusal:
    """Why a request is refused at once.

    ``reason`` labels the rejection metric (``queue_full`` or ``past_deadline``); ``message``
    tells the client what happened and what to do; ``retry_after`` is how many seconds of the
    work ahead must drain before the same request would be accepted.
    """

    reason: str
    message: str
    retry_after: float


def predicted_finish(backlog: Backlog, size: int, cost: Cost) -> tuple[float, float]:
    """(start, finish) of a new request of ``size`` items, seconds from now, as ``cost`` predicts.

    The items ahead run in batches of the cap after the running batch; the request rides in the
    batch holding the last of them (``ceil((ahead + size) / cap)``-th). That batch also takes
    what arrives until it starts (at the recent arrival rate, up to the cap): a batch starts when
    the device frees with whatever waits then, so near saturation it fills, and predicting it
    with only the items already queued would be optimistic. A request is never split, so with
    multi-item requests this is a close estimate, not an exact schedule.
    """
    cap = max(backlog.cap, 1)
    full_batches_before = (backlog.items_ahead + size - 1) // cap
    start = backlog.busy_for + full_batches_before * cost(cap)
    queued_in_own = backlog.items_ahead + size - full_batches_before * cap
    own = min(cap, queued_in_own + math.floor(backlog.arrival_rate * start))
    return start, start + cost(max(own, queued_in_own))


def admission_refusal(
    backlog: Backlog,
    size: int,
    max_queue: int,
    cost: Cost,
    timeout_seconds: float,
    *,
    expected: Cost | None = None,
    slo_seconds: float | None = None,
) -> Refusal | None:
    """Why a new request must be refused at once, or None to accept it.

    Refusing now beats queueing a request that will be answered too late: the client learns at
    once and can go elsewhere, and the late work it would have made the requests behind it wait
    for is not done at all. Three rules, in order:

    * the queue bound: ``max_queue`` items may wait;
    * the SLO (when ``slo_seconds`` is given: the rule is on and the request set no timeout of
      its own): refused when its batch, run at the ``expected`` (mean, no margin) cost, would
      complete after the SLO. Past it the answer is late for an online client anyway. The
      expected cost and the SLO itself (not the conservative cost, not the earlier deadline the
      dispatcher plans for) so that only requests more likely late than not are refused: in
      simulation, refusing at 80% of the SLO shed about twice as many requests near the peak
      and sustained lower rates. Never a request that alone, on an idle device, would miss
      the SLO too (an SLO below the model's own time: refusing would fail them all);
    * the timeout: refused when the work ahead, at the conservative ``cost``, cannot even start
      within ``timeout_seconds`` (the time a request may wait to start, as in Triton). A client
      that set a long timeout of its own tolerates a late answer and is judged by this rule only.
    """
    mean = expected or cost
    excess = backlog.queued_items + size - max_queue
    if excess > 0:
        batches = math.ceil(excess / max(backlog.cap, 1))
        return Refusal(
            "queue_full",
            f"queue full ({backlog.queued_items} of {max_queue} items waiting); "
            "retry later or send it to another replica",
            backlog.busy_for + batches * mean(backlog.cap),
        )
    if slo_seconds is not None:
        _, finish = predicted_finish(backlog, size, mean)
        # Alone on an idle device it would be late too: the SLO is below what the model can do,
        # and refusing would fail every such request; serve it (the SLO-miss metrics show it).
        if finish > slo_seconds and mean(size) <= slo_seconds:
            return Refusal(
                "past_deadline",
                f"would finish in about {finish:.3f} s, past the {slo_seconds:.3f} s latency "
                "SLO; retry later, send it to another replica, or raise --slo-seconds",
                finish - slo_seconds,
            )
    start = backlog.busy_for + math.ceil(backlog.items_ahead / max(backlog.cap, 1)) * cost(
        backlog.cap
    )
    if start > timeout_seconds:
        return Refusal(
            "past_deadline",
            f"queue too long to start within the timeout: about {start:.3f} s of work "
            f"ahead, timeout {timeout_seconds:.3f} s; retry later or raise the timeout",
            start - timeout_seconds,
        )
    return None


def broken_by_execution(
    waits: Sequence[float], compute_seconds: float, planned_seconds: float, slo_seconds: float
) -> bool:
    """Whether a batch's own execution made a request miss the SLO.

    True when some request would have met the SLO had the batch taken the planned time, but
    missed because it ran longer. A request that had already waited too long to make it (a
    backlog: overload) does not count: shrinking batches would only drain the backlog slower.
    """
    if compute_seconds <= (1 + OVERRUN_TOLERANCE) * planned_seconds:
        return False  # as planned, give or take timer granularity
    return any(w + planned_seconds <= slo_seconds < w + compute_seconds for w in waits)


def split_index(sizes: Sequence[int]) -> int:
    """How many of a failed batch's requests (of ``sizes`` items) go into the first half.

    Halves hold about equal items and neither is empty; needs at least two requests.
    """
    total = sum(sizes)
    running = 0
    for count, size in enumerate(sizes[:-1], start=1):
        running += size
        if running >= total / 2:
            return count
    return len(sizes) - 1


def largest_within(limit: int, allowed: Sequence[int] | None) -> int | None:
    """The largest batch size the executor runs as it is (``allowed``, ascending; None or empty:
    every size) that is at most ``limit``; None when none is. A cap at such a size is never
    padded past what it meant to allow."""
    if not allowed:
        return limit
    fitting = bisect_right(allowed, limit)
    return allowed[fitting - 1] if fitting else None


class AdaptiveCap:
    """The batch-size cap, adapted to SLO outcomes, the cost model and OOMs (see module doc)."""

    def __init__(self, maximum: int, initial: int | None = None) -> None:
        self.maximum = maximum
        self.value = min(maximum, initial or maximum)
        self.ceiling = maximum
        self._last_backoff = -math.inf

    def effective(self, cost_bound: int, allowed: Sequence[int] | None = None) -> int:
        """The cap to use now, given the size the cost model chose.

        With ``allowed`` (the sizes run as they are, ascending) the cap is the largest of them
        within the limits, so a batch is never padded past what the cap meant to allow.
        """
        limit = max(1, min(self.value, self.ceiling, cost_bound))
        fitting = largest_within(limit, allowed)
        if fitting is None:  # every size the executor runs is above the limit: its smallest
            assert allowed
            return allowed[0]
        return fitting

    def on_batch(
        self,
        size: int,
        started: float,
        waits: Sequence[float],
        compute_seconds: float,
        planned_seconds: float,
        slo_seconds: float,
        cost_bound: int,
        allowed: Sequence[int] | None = None,
        floor: int = 1,
    ) -> bool:
        """Adapt to one finished batch of ``size`` items that started at ``started``.

        ``waits`` are its requests' times in the queue; it ran ``compute_seconds`` where the cost
        model planned ``planned_seconds``; ``cost_bound`` and ``allowed`` are as for
        :meth:`effective`. Backs off when the batch's own execution broke the SLO, but never
        below ``floor``, the smallest size that keeps up with the arrivals: below it the backlog
        grows and every request is late (on a noisy device an overrun is often noise, and
        repeated back-offs would otherwise walk the cap down into overload). Else grows when the
        cap was what limited the batch (the cost model bounds the growth). Returns whether it
        backed off.
        """
        if broken_by_execution(waits, compute_seconds, planned_seconds, slo_seconds):
            # Only one back-off per batch started after the previous one: the batches already
            # running were sized before it and say nothing new.
            if started > self._last_backoff and self.value > floor:
                shrunk = int(min(self.value, size) * BACKOFF_FACTOR)
                self.value = max(1, floor, shrunk)
                self._last_backoff = started
                return True
            return False
        if size >= self.effective(cost_bound, allowed):
            self._grow(cost_bound)
        return False

    def on_oom(self, size: int) -> None:
        """A batch of ``size`` items ran out of memory: halve, and stay below that size."""
        self.value = max(1, size // 2)
        self.ceiling = max(1, min(self.ceiling, int(size * OOM_CEILING_FRACTION)))

    def on_memory_released(self) -> None:
        """Cached memory went back to the device: sizes that failed may fit again."""
        self.ceiling = self.maximum

    def _grow(self, cost_bound: int) -> None:
        """Step towards the cost model's size; never past it, and never down to it."""
        limit = min(self.maximum, self.ceiling, max(cost_bound, 1))
        if self.value < limit:
            self.value = min(limit, self.value + max(1, int(self.value * GROWTH_FRACTION)))
