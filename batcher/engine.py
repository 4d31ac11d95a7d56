"""The batching engine: admission, a priority queue, one batch at a time on the device.

Used in-process (``await batcher.submit(payload)``) and behind HTTP (:mod:`batcher.server`); the
same object in both. The decisions (when to start, how large, whom to refuse, how the cap moves)
are pure functions in :mod:`batcher.policy`; this module applies them to real requests and time.
All times come from the event loop's clock, so a loop with a virtual clock runs the engine in
simulated time (the tests do). What waits lives in :mod:`batcher.request_queue`, the arrival
rate in :mod:`batcher.arrivals`, the cost model and the caps in :mod:`batcher.batch_sizing`, the
best-effort quantum, pacing and throttle in :mod:`batcher.best_effort_lane`, and why a request
was not served in :mod:`batcher.errors` (the servers map those to HTTP statuses and gRPC codes).
Each batch runs once this model holds the :class:`~batcher.device.SharedDevice`: a device of its
own when the process serves one model, one shared with the other models' engines when it serves
several (:mod:`batcher.repository`).

Guarantees:
* every accepted request is answered exactly once: a result, or an error saying why;
* a request is refused at admission (never queued) when the queue is full, when its batch is
  predicted to complete past the latency SLO (``refuse_past_slo``, for requests that set no
  timeout of their own), or when the work ahead of it cannot start within its timeout;
* a batch that runs out of memory is split in two and both halves retried before anything else;
  a single request that still does not fit fails alone; other model errors fail only that batch;
* ``drain`` stops admission, runs what is queued and in flight, and returns when all is answered.

Best-effort requests (:mod:`batcher.best_effort`) wait in a queue of their own, which online
admission never looks at: they run only when no online request waits to start, in batches cut to
the quantum, paced to the share of device time the slack controller allows, and are refused at
once when there is no such capacity (those waiting when the throttle starts are refused then).
They are answered on the same terms (exactly once, also on drain and after an out-of-memory
split) but counted only in the per-class series, never in the online latency histograms, SLO
misses or the slack that throttles them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import statistics
from collections.abc import Callable, Sequence
from typing import Any, cast

from prometheus_client import CollectorRegistry

from batcher.arrivals import ArrivalTracker
from batcher.batch_sizing import BatchSizer
from batcher.best_effort import (
    BEST_EFFORT,
    PriorityError,
    classify_priority,
    queue_full_retry_after,
)
from batcher.best_effort_lane import BestEffortLane
from batcher.busy_window import BusyWindow
from batcher.config import BatcherConfig
from batcher.device import SharedDevice
from batcher.errors import (
    BatcherError,
    DrainTimedOut,
    InvalidRequest,
    ModelFailed,
    OutOfMemory,
    Rejected,
    RequestTimedOut,
    ShuttingDown,
)
from batcher.execution import BatchExecutor, Outcome, QueueingExecutor, describe
from batcher.memory import MemoryMonitor
from batcher.metrics import BatcherMetrics
from batcher.policy import (
    Backlog,
    DeadlinePolicy,
    Decision,
    DispatchPolicy,
    DispatchState,
    FixedDelayPolicy,
    admission_refusal,
    dispatch_deadline,
    fitting_prefix,
    lookahead_at,
    next_start_for_utilization,
    split_index,
)
from batcher.request_queue import QueuedRequest, RequestQueue
from batcher.service_spread import RequestSizes, service_scv

log = logging.getLogger(__name__)

BUSY_WINDOW_SECONDS = 60.0

# A batch to run next: its requests, the future of its outcome when it was sent already, and
# when the device took it up (or the engine decided to run it).
Following = tuple[list[QueuedRequest], "asyncio.Future[Outcome] | None", float]


class Batcher:
    """Dynamic batching in front of one :class:`~batcher.execution.BatchExecutor`."""

    def __init__(
        self,
        executor: BatchExecutor,
        *,
        max_batch_size: int = 32,
        slo_seconds: float = 0.25,
        max_queue: int = 1024,
        default_timeout_seconds: float = 30.0,
        priority_levels: int = 1,
        default_priority: int = 1,
        utilization_cap: float = 1.0,
        policy: DispatchPolicy | None = None,
        adaptive_cap: bool = True,
        refuse_past_slo: bool = True,
        best_effort_priority: int = 0,
        best_effort_quantum_seconds: float = 0.0,
        best_effort_max_queue: int = 0,
        best_effort_slack_margin: float = 0.1,
        best_effort_window_seconds: float = 10.0,
        memory: MemoryMonitor | None = None,
        metrics: BatcherMetrics | None = None,
        device: SharedDevice | None = None,
    ) -> None:
        self.executor = executor
        self.max_batch_size = max_batch_size
        self.slo_seconds = slo_seconds
        self.max_queue = max_queue
        self.default_timeout = default_timeout_seconds
        self.priority_levels = priority_levels
        self.default_priority = default_priority
        self.utilization_cap = utilization_cap
        self.policy = policy or DeadlinePolicy()
        self.adaptive = adaptive_cap
        self.refuse_past_slo = refuse_past_slo
        self.memory = memory
        self.metrics = metrics or BatcherMetrics(
            CollectorRegistry(), "model", slo_seconds, max_batch_size
        )
        self.name = self.metrics.model
        self.sizing = BatchSizer(
            executor.batch_size_for,
            max_batch_size,
            slo_seconds,
            adaptive=adaptive_cap,
            memory=memory,
            metrics=self.metrics,
        )
        self.cost = self.sizing.cost
        self.cap_state = self.sizing.cap_state
        self.footprint = self.sizing.footprint
        self.request_sizes = RequestSizes()
        self._waiting = RequestQueue()
        self._seq = itertools.count()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._accepting = False
        self._closing = False
        self._closing_why = "the runtime is shutting down"
        self.device = device or SharedDevice()
        if self.name not in self.device.models:
            self.device.join(self.name)
        self._earliest_start = 0.0
        self._last_end = 0.0
        self._filling = False  # the policy held waiting requests back since the last batch
        self._busy = BusyWindow(BUSY_WINDOW_SECONDS)
        self._arrivals = ArrivalTracker()
        self.batches = 0
        self.best_effort_priority = best_effort_priority or priority_levels + 1
        self.lane = BestEffortLane(
            self.sizing,
            self.metrics,
            slo_seconds=slo_seconds,
            quantum_seconds=best_effort_quantum_seconds,
            max_queue=best_effort_max_queue,
            slack_margin=best_effort_slack_margin,
            window_seconds=best_effort_window_seconds,
        )
        self.controller = self.lane.controller
        self.online_latencies = self.lane.online_latencies
        self._in_flight = 0  # requests in the batches sent to the device and not answered
        # One loop timer for every waiting request's timeout, armed at or before the earliest:
        # a timer per request cost a handle and two heap operations each.
        self._expiry_timer: asyncio.TimerHandle | None = None
        self._expiry_at = math.inf
        self.metrics.follow_engine(
            queue_items=lambda: self._waiting.online_items,
            queue_requests=lambda: len(self._waiting.online),
            best_effort_queue_items=lambda: self._waiting.best_effort_items,
            in_flight_requests=lambda: self.in_flight_requests,
            cap=lambda: self.cap,
        )

    # --- lifecycle -------------------------------------------------------------------------

    async def calibrate(
        self, batch_for: Callable[[int], list[Any]], sizes: Sequence[int], repeats: int
    ) -> dict[int, float]:
        """Time the model at ``sizes`` before serving; returns median seconds by executed size.

        Seeds the cost model so the first requests are batched well instead of teaching it:
        ``batch_for(n)`` gives a batch of ``n`` items. Each size runs once untimed (first calls
        allocate and warm caches), then ``repeats`` times. Call before :meth:`start`. A failure
        ends the warm-up with what was measured (the model then learns online); running out of
        memory also lowers the cap's ceiling below that size. On a shared device each batch waits
        behind the other models' online batches.
        """
        medians: dict[int, float] = {}
        for size in sorted(set(sizes)):
            executed = self.executor.batch_size_for(size)
            if executed in medians or size > self.max_batch_size:
                continue
            samples = []
            for attempt in range(repeats + 1):
                # Other models may be serving already: a warm-up batch waits its turn as
                # best-effort work does, after every online batch ready.
                await self.device.take(self.name, best_effort=True, deadline=math.inf)
                try:
                    outcome = await self.executor.execute(batch_for(size))
                except Exception as exc:  # the executor broke: serve anyway, learn online
                    outcome = Outcome(error=f"runtime error: {describe(exc)}")
                finally:
                    self.device.release(self.name)
                if not outcome.ok:
                    if outcome.out_of_memory:
                        self.cap_state.on_oom(size)
                    log.warning(
                        "warm-up stopped: the model failed",
                        extra={"items": size, "error": outcome.error},
                    )
                    self._refresh_sizes()
                    return medians
                if outcome.peak_bytes is not None:
                    self.footprint.observe(executed, outcome.peak_bytes)
                if attempt:
                    self.cost.observe(executed, outcome.seconds)
                    samples.append(outcome.seconds)
            medians[executed] = statistics.median(samples) if samples else 0.0
        self._refresh_sizes()
        self.sizing.refresh_memory_cap()
        return medians

    async def start(self) -> None:
        """Start the dispatch loop; requests are accepted from now on."""
        loop = asyncio.get_running_loop()
        self._refresh_sizes()
        self._last_end = loop.time()
        self._task = asyncio.create_task(self._dispatch_loop(), name="autoglm-batcher-dispatch")
        self._accepting = True
        self.metrics.ready.set(1)
        self.metrics.best_effort_share.set(self.controller.share)

    @property
    def started(self) -> bool:
        return self._task is not None

    @property
    def accepting(self) -> bool:
        """Ready for requests: started, not draining, and the executor up (readiness reads it;
        while a model process is replaced the batches would only fail)."""
        return self._accepting and self.executor.up

    async def drain(
        self, timeout: float | None = None, why: str = "the runtime is shutting down"
    ) -> bool:
        """Stop admission and finish everything queued and in flight; True when all finished.

        After ``timeout`` seconds what is still queued is answered with :class:`DrainTimedOut`
        (an answer, not a drop) and False is returned. ``why`` goes into the refusals of the
        requests that arrive meanwhile.
        """
        self._closing_why = why
        self._accepting = False
        self.metrics.ready.set(0)
        self._closing = True
        self._wakeup.set()
        if self._task is None:
            return True
        finished = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError:
            finished = False
            for request in self._waiting.take_all():
                self._fail(request, DrainTimedOut("shutting down before the request could run"))
            await self._task
        self._arm_expiry(math.inf)  # nothing waits any more
        self.executor.close()
        return finished

    # --- admission ---------------------------------------------------------------------------

    async def submit(
        self,
        payload: Any,
        *,
        size: int = 1,
        priority: int | str = 0,
        timeout: float | None = None,
    ) -> Any:
        """Queue one request of ``size`` items and wait for its result.

        ``priority``: 1 is the highest online level, 0 means the default level (Triton's
        convention); ``"best-effort"`` or an integer from ``best_effort_priority`` up makes it
        best-effort (see :func:`~batcher.best_effort.classify_priority`).
        ``timeout``: seconds the request may wait to start (default: the configured timeout).
        Raises a :class:`BatcherError` subclass when the request is not served.
        """
        try:
            request_class = classify_priority(
                priority, self.priority_levels, self.default_priority, self.best_effort_priority
            )
        except PriorityError as exc:
            self.metrics.answered("invalid", self.slo_seconds)
            raise InvalidRequest(str(exc)) from None
        if request_class.name == BEST_EFFORT:
            return await self._submit_best_effort(payload, size, timeout)
        if not self._accepting:
            self.metrics.rejected("shutting_down", self.slo_seconds)
            raise ShuttingDown(
                f"not accepting requests: {self._closing_why}; send it to another replica"
            )
        level = request_class.level
        wait_limit = self.default_timeout if timeout is None else timeout
        if wait_limit <= 0 or not 1 <= size <= self.max_batch_size:
            self.metrics.answered("invalid", self.slo_seconds)
            raise InvalidRequest(
                f"timeout must be > 0 and a request must hold 1..{self.max_batch_size} items "
                f"(got timeout {wait_limit} s, {size} items); send fewer items per request"
            )
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._arrivals.note(now, size)  # demand, refused or not: it sizes batches under overload
        self.request_sizes.observe(size)  # the spread of service SLO sizing reads
        ahead = (
            self._waiting.online_items
            if self.priority_levels == 1
            else self._waiting.items_at_or_above(level)
        )
        # Models that the shared device serves first take part of it: their share stretches
        # the time this model's backlog needs (1 with the device to itself).
        stretch = self.device.stretch(self.name, now)
        refusal = admission_refusal(
            Backlog(
                queued_items=self._waiting.online_items,
                items_ahead=ahead,
                cap=self.cap,
                busy_for=max(0.0, self.device.busy_until - now),
                arrival_rate=self._arrivals.items_rate(now),
            ),
            size,
            self.max_queue,
            lambda items: stretch * self.sizing.cost_of(items),
            wait_limit,
            expected=lambda items: stretch * self.sizing.expected_cost_of(items),
            slo_seconds=self.slo_seconds if self._judged_by_slo(timeout) else None,
        )
        if refusal is not None:
            self.metrics.rejected(refusal.reason, self.slo_seconds)
            raise Rejected(refusal.message, refusal.reason, refusal.retry_after)
        request = QueuedRequest(
            payload=payload,
            size=size,
            level=level,
            arrival=now,
            deadline=dispatch_deadline(now, self.slo_seconds, wait_limit),
            expiry=now + wait_limit,
            seq=next(self._seq),
            future=loop.create_future(),
        )
        self._enqueue(request)
        try:
            return await request.future
        except asyncio.CancelledError:
            if self._unqueue(request):
                self.metrics.answered("cancelled", self.slo_seconds)
            raise

    async def _submit_best_effort(self, payload: Any, size: int, timeout: float | None) -> Any:
        """Queue a best-effort request if there is idle capacity for it, else refuse at once."""
        if not self._accepting:
            self.metrics.refused_best_effort("shutting_down")
            raise ShuttingDown(
                f"not accepting requests: {self._closing_why}; send it to another replica"
            )
        wait_limit = self.default_timeout if timeout is None else timeout
        if wait_limit <= 0 or not 1 <= size <= self.max_batch_size:
            self.metrics.answered_best_effort("invalid")
            raise InvalidRequest(
                f"timeout must be > 0 and a request must hold 1..{self.max_batch_size} items "
                f"(got timeout {wait_limit} s, {size} items); send fewer items per request"
            )
        loop = asyncio.get_running_loop()
        now = loop.time()
        self._steer(now)
        if self.controller.throttled:
            self.metrics.refused_best_effort("throttled")
            raise self.lane.throttled_refusal(now)
        limit = self.best_effort_batch_limit()
        bound = self.lane.queue_bound()
        waiting = self._waiting.best_effort_items
        if waiting and waiting + size > bound:
            self.metrics.refused_best_effort("queue_full")
            raise Rejected(
                f"best-effort queue full ({waiting} of {bound} items waiting): "
                "no idle capacity now; retry after the Retry-After delay",
                "queue_full",
                queue_full_retry_after(
                    waiting + size - bound,
                    limit,
                    self.sizing.expected_cost_of(limit) or self.quantum,  # nothing measured yet
                    self.controller.share,
                    max(0.0, self.device.busy_until - now),
                ),
            )
        request = QueuedRequest(
            payload=payload,
            size=size,
            level=0,
            arrival=now,
            deadline=now + wait_limit,
            expiry=now + wait_limit,
            seq=next(self._seq),
            future=loop.create_future(),
            best_effort=True,
        )
        self._enqueue(request)
        try:
            return await request.future
        except asyncio.CancelledError:
            if self._unqueue(request):
                self.metrics.answered_best_effort("cancelled")
            raise

    @property
    def quantum(self) -> float:
        """The best-effort quantum in force (seconds): configured or derived, at least t(1)."""
        return self.lane.quantum

    def best_effort_batch_limit(self, budget: float | None = None) -> int:
        """Largest best-effort batch predicted to run within ``budget`` (default: the quantum)."""
        return self.lane.batch_limit(budget)

    def _steer(self, now: float) -> None:
        """A slack-controller step, when due; waiting best-effort work is shed when the
        throttle starts (a drain runs what it accepted)."""
        change = self.lane.step(now, self._waiting.best_effort_items)
        started = change is not None and change.throttle_changed and change.throttled
        if started and not self._closing:
            self._shed_best_effort(now)

    def _shed_best_effort(self, now: float) -> None:
        """Answer the waiting best-effort requests with the throttle's refusal.

        They would only wait out their timeouts (holding their clients) while the throttle
        lasts; refused now, their clients back off until capacity should be back.
        """
        for request in self._pop_best_effort(self._waiting.best_effort_items):
            self.metrics.best_effort_refusals.labels(self.metrics.model, "throttled").inc()
            self._fail(request, self.lane.throttled_refusal(now))

    def _judged_by_slo(self, timeout: float | None) -> bool:
        """Whether admission refuses this request when predicted to finish past the SLO.

        Not when the request set its own timeout (its client says how long it tolerates), and not
        before the cost model has fitted a line (its first guesses are pessimistic upper bounds).
        """
        return self.refuse_past_slo and timeout is None and self.cost.fitted

    # --- queue -------------------------------------------------------------------------------

    @property
    def queued_items(self) -> int:
        return self._waiting.online_items

    @property
    def queued_requests(self) -> int:
        return len(self._waiting.online)

    @property
    def in_flight_requests(self) -> int:
        """Requests in the batch running and in one sent to wait behind it (look-ahead)."""
        return self._in_flight

    @property
    def cap(self) -> int:
        """The batch-size cap in force now, within what the device's free memory holds."""
        return self.sizing.cap

    @property
    def memory_cap(self) -> int:
        return self.sizing.memory_cap

    @property
    def memory_cap_reason(self) -> str:
        return self.sizing.memory_cap_reason

    @property
    def batch_sizes(self) -> tuple[int, ...] | None:
        """Sizes the executor runs as they are (its padding buckets); None: every size."""
        return self.sizing.allowed

    def _refresh_sizes(self) -> None:
        """Re-read the executor's buckets and re-choose the target size (after calibration)."""
        self.sizing.refresh_sizes()
        self._retarget()

    def _retarget(self, now: float = -math.inf) -> None:
        """Re-choose the cap's target for the arrivals now, and export what follows from it."""
        self.sizing.retarget(self._arrivals.items_rate(now))
        self.metrics.service_scv.set(service_scv(self.cost, self.request_sizes))
        self.metrics.best_effort_quantum.set(self.quantum)

    def busy_ratio(self, now: float) -> float:
        """Fraction of the last minute the device spent executing this model's batches."""
        return self._busy.ratio(now)

    def _enqueue(self, request: QueuedRequest) -> None:
        self._waiting.add(request)
        if request.expiry < self._expiry_at:
            self._arm_expiry(request.expiry)
        self._wakeup.set()

    def _unqueue(self, request: QueuedRequest) -> bool:
        """Take a request out of the queue (timeout, cancellation); False if it already left."""
        return self._waiting.remove(request)

    def _pop_online(self, count: int) -> list[QueuedRequest]:
        return self._waiting.pop_online(count)

    def _pop_best_effort(self, limit: int) -> list[QueuedRequest]:
        """The next best-effort batch: the longest queue prefix within ``limit`` items."""
        return self._waiting.pop_best_effort(limit)

    def _arm_expiry(self, when: float) -> None:
        if self._expiry_timer is not None:
            self._expiry_timer.cancel()
            self._expiry_timer = None
        self._expiry_at = when
        if when < math.inf:
            self._expiry_timer = asyncio.get_running_loop().call_at(when, self._expire)

    def _expire(self) -> None:
        """Answer the queued requests that reached their timeout without starting, then arm the
        timer for the next (those that left meanwhile are not waited for)."""
        # the loop runs a timer up to its clock's resolution early: what is due is due
        due = max(asyncio.get_running_loop().time(), self._expiry_at)
        self._expiry_timer = None
        for request in self._waiting.take_expired(due):
            self._fail(
                request,
                RequestTimedOut(
                    f"request did not start within its timeout of "
                    f"{request.expiry - request.arrival:.3f} s; retry later or raise the timeout"
                ),
            )
        self._arm_expiry(self._waiting.earliest_expiry())

    # --- dispatch ----------------------------------------------------------------------------

    async def _dispatch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            now = loop.time()
            self._steer(now)
            if self._waiting.retry:
                split = self._waiting.retry[0]
                if await self._hold_device(split[0].best_effort, min(r.deadline for r in split)):
                    await self._execute(self._waiting.retry.popleft())
                continue
            if not self._waiting.online:
                if self._waiting.best_effort:
                    start_at = self._best_effort_start(now)
                    if start_at > now:
                        await self._sleep_until(loop, min(start_at, self.controller.next_step_at()))
                    elif await self._hold_device(True, math.inf):
                        await self._execute(self._pop_best_effort(self.best_effort_batch_limit()))
                    continue
                if self._closing:
                    self.device.release(self.name)
                    return
                await self._idle(loop)
                continue
            cap = self.cap
            urgent = self._waiting.online[0].deadline
            if self._closing:
                if await self._hold_device(False, urgent):
                    waiting = [r.pending() for r in self._waiting.online[: cap + 1]]
                    count, _, _ = fitting_prefix(waiting, cap)
                    await self._execute(self._pop_online(count))
                continue
            decision = self._decide_online(now, cap)
            if decision.take:
                if await self._hold_device(False, urgent):
                    await self._execute(self._pop_online(decision.take))
                continue
            wake_at = decision.wake_at
            self._filling = True  # the policy holds waiting requests back for a fuller batch
            if self._waiting.best_effort and wake_at is not None:
                # The online batch is filling: a best-effort batch may use the gap if it ends
                # before the online batch is due to start.
                gap = min(self.quantum, wake_at - now)
                if (
                    self._best_effort_start(now) <= now
                    and self.sizing.cost_with_margin(1) <= gap
                    and self.device.try_take(self.name)
                ):
                    await self._execute(self._pop_best_effort(self.best_effort_batch_limit(gap)))
                    continue
                later = [self._best_effort_start(now), self.controller.next_step_at()]
                wake_at = min([wake_at, *(t for t in later if t > now)])
            await self._sleep_until(loop, wake_at)

    def _decide_online(self, now: float, cap: int) -> Decision:
        """The policy's decision on the waiting online requests, as if the device were free."""
        state = DispatchState(
            # every request holds at least one item: no batch reaches past cap + 1 of them
            queue=[r.pending() for r in self._waiting.online[: cap + 1]],
            now=now,
            cap=cap,
            earliest_start=self._earliest_start,
            arrival_rate=self._arrivals.items_rate(now),
        )
        return self.policy.decide(state, self.sizing.cost_of, self.sizing.expected_cost_of)

    async def _hold_device(self, best_effort: bool, deadline: float) -> bool:
        """Whether this model holds the shared device now, ready to run a batch.

        False after waiting for it behind other models' batches: what waits here changed
        meanwhile, so the caller decides again (the device stays held for it until it runs a
        batch or sleeps).
        """
        if self.device.try_take(self.name):
            return True
        await self.device.take(self.name, best_effort=best_effort, deadline=deadline)
        return False

    def _best_effort_start(self, now: float) -> float:
        return self.lane.start_at(now, self._earliest_start, self._closing)

    async def _idle(self, loop: asyncio.AbstractEventLoop) -> None:
        due = self.memory.release_due(self._last_end) if self.memory else None
        if due is not None and due <= loop.time():
            assert self.memory is not None
            if self.memory.release(self._last_end):
                self.metrics.releases.inc()
                self.cap_state.on_memory_released()
            return
        await self._sleep_until(loop, due)

    async def _sleep_until(self, loop: asyncio.AbstractEventLoop, when: float | None) -> None:
        self.device.release(self.name)  # another model may run while this one waits
        self._wakeup.clear()
        if when is None:
            await self._wakeup.wait()
            return
        delay = when - loop.time()
        if delay <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), delay)

    async def _execute(self, batch: list[QueuedRequest]) -> None:
        """Run one batch (all of one class) and answer its requests; then, one after another,
        any batch formed and sent while the one before ran (:meth:`_look_ahead`)."""
        following: Following | None = (batch, None, asyncio.get_running_loop().time())
        while following is not None:
            batch, sent, started = following
            following = await self._run_batch(batch, sent, started)

    async def _run_batch(
        self, batch: list[QueuedRequest], sent: asyncio.Future[Outcome] | None, started: float
    ) -> Following | None:
        """Run ``batch`` (``sent`` already, when a look-ahead sent it) and answer it; the batch
        sent while it ran, if any."""
        loop = asyncio.get_running_loop()
        best_effort = batch[0].best_effort
        items = sum(r.size for r in batch)
        executed = self.executor.batch_size_for(items)
        self._observe_dispatch_gap(batch, started)
        planned = self.cost.estimate(executed)
        if sent is None:  # admission (this model's and the others') predicts with the mean
            self.device.busy_until = started + self.cost.mean(executed)
            self._in_flight += len(batch)
        following = None
        try:
            if sent is None and self._looks_ahead(best_effort):
                sent = cast(QueueingExecutor, self.executor).send([r.payload for r in batch])
            if sent is None:
                outcome = await self.executor.execute([r.payload for r in batch])
            else:
                following = await self._look_ahead(sent, started, executed)
                outcome = await sent
        except Exception as exc:  # the executor itself broke: fail this batch, keep serving
            log.exception("executor failed")
            outcome = Outcome(error=f"runtime error: {describe(exc)}")
        finally:
            self.device.release(self.name)
        ended = loop.time()
        if following is None:
            self.device.busy_until = ended
        else:
            self.device.try_take(self.name)  # the device's only user: it runs the next at once
        self._finish_batch(batch, items, executed, started, ended, planned, outcome)
        if following is None:
            return None
        return (*following, self.device.freed_at or ended)

    def _finish_batch(
        self,
        batch: list[QueuedRequest],
        items: int,
        executed: int,
        started: float,
        ended: float,
        planned: float,
        outcome: Outcome,
    ) -> None:
        """Everything a finished batch changes: the device's clock, the cost model, the cap,
        the metrics, and (on the loop's next turn) its requests' answers."""
        loop = asyncio.get_running_loop()
        best_effort = batch[0].best_effort
        finished = outcome.finished_at
        # the device's clock is the loop's unless the loop keeps virtual time (simulations)
        self.device.freed_at = finished if finished and started <= finished <= ended else ended
        self._in_flight -= len(batch)
        self.batches += 1
        self._account_busy(started, ended, outcome, batch[0].request_class)
        if best_effort:
            self.lane.ran(ended, outcome.seconds)
        if outcome.out_of_memory:
            self._recover_from_oom(batch, items, outcome)
            return
        if outcome.seconds > 0:
            self.cost.observe(executed, outcome.seconds)
            self._retarget(ended)
        if outcome.peak_bytes is not None:
            self.footprint.observe(executed, outcome.peak_bytes)
            self.sizing.refresh_memory_cap()
        self.metrics.batch_ran(batch[0].request_class, items)
        if not best_effort:
            self.metrics.batch_size.observe(items)
            self.metrics.compute_latency.observe(outcome.seconds)
        if not outcome.ok:
            log.warning(
                "batch failed",
                extra={"items": items, "requests": len(batch), "error": outcome.error},
            )
            self._observe_queue_latency(batch, started)
            for request in batch:
                self._fail(request, ModelFailed(outcome.error))
            return
        if not best_effort:  # the slack controller steers the next dispatch with these
            for request in batch:
                if not request.future.done():
                    self.online_latencies.add(ended, ended - request.arrival)
        # The requests are answered on the loop's next turn, after the dispatch loop has sent
        # the next batch: answering is per-request work (futures, metrics) that the device
        # would otherwise sit idle through between two batches.
        loop.call_soon(self._answer, batch, outcome.results, started, ended)
        if self.adaptive and not best_effort:
            backed_off = self.cap_state.on_batch(
                size=items,
                started=started,
                waits=[started - r.arrival for r in batch],
                compute_seconds=ended - started,
                planned_seconds=planned,
                slo_seconds=self.slo_seconds,
                cost_bound=self.sizing.target,
                allowed=self.sizing.allowed,
                floor=self.sizing.floor,
            )
            if backed_off:
                log.info(
                    "batch ran longer than planned and missed the SLO; cap backed off",
                    extra={
                        "items": items,
                        "planned_seconds": round(planned, 6),
                        "seconds": round(ended - started, 6),
                        "cap": self.cap,
                    },
                )

    def _looks_ahead(self, best_effort: bool) -> bool:
        """Whether the next batch may be formed and sent while this one runs: online batches,
        an executor that queues them, and a device that no other model shares and that no
        utilization cap makes idle between batches (both decide at the moment it frees)."""
        return (
            self.executor.queues_batches
            and not best_effort
            and self.utilization_cap >= 1.0
            and len(self.device.models) == 1
        )

    async def _look_ahead(
        self, running: asyncio.Future[Outcome], started: float, executed: int
    ) -> tuple[list[QueuedRequest], asyncio.Future[Outcome]] | None:
        """From shortly before ``running`` is expected to end, dispatch as if the device were
        free, sending the next online batch to wait behind it: the device goes on to it at once
        instead of idling while this loop learns of the end, answers it and decides (the
        turnaround, which grows with everything else this loop serves). None when ``running``
        ended first."""
        loop = asyncio.get_running_loop()
        expected = self.cost.mean(executed)
        if expected <= 0:  # nothing measured yet: no telling when it ends
            return None
        at = lookahead_at(started, expected)
        while not running.done():
            now = loop.time()
            if now < at:
                await asyncio.wait({running}, timeout=at - now)
                continue
            wake_at = None
            if self._waiting.online and not self._waiting.retry:
                decision = self._decide_online(now, self.cap)
                if decision.take:
                    return self._send_next(self._pop_online(decision.take), now)
                wake_at = decision.wake_at
            self._wakeup.clear()  # set again by the next arrival
            arrival: asyncio.Future[Any] = asyncio.ensure_future(self._wakeup.wait())
            timeout = None if wake_at is None else max(0.0, wake_at - loop.time())
            await asyncio.wait(
                (running, arrival), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
            arrival.cancel()
        return None

    def _send_next(
        self, batch: list[QueuedRequest], now: float
    ) -> tuple[list[QueuedRequest], asyncio.Future[Outcome]]:
        executed = self.executor.batch_size_for(sum(r.size for r in batch))
        self.device.busy_until = max(self.device.busy_until, now) + self.cost.mean(executed)
        self._in_flight += len(batch)
        queueing = cast(QueueingExecutor, self.executor)
        return batch, queueing.send([r.payload for r in batch])

    def _observe_dispatch_gap(self, batch: list[QueuedRequest], started: float) -> None:
        """The device's idle before ``batch`` when its first request was waiting already as the
        device freed: kept idle by the serving path (turnaround) or by the dispatch policy
        (filling), not by a lack of work."""
        freed_at, filling = self.device.freed_at, self._filling
        self._filling = False
        if freed_at is not None and min(r.arrival for r in batch) <= freed_at:
            cause = "filling" if filling else "turnaround"
            self.metrics.device_idled(cause, max(0.0, started - freed_at))

    def _account_busy(
        self, started: float, ended: float, outcome: Outcome, request_class: str
    ) -> None:
        self._last_end = ended
        self._busy.add(started, ended)
        self.device.ran(self.name, started, ended)
        self.metrics.busy(request_class, outcome.seconds)
        self.metrics.busy_ratio.set(self.busy_ratio(ended))
        self._earliest_start = next_start_for_utilization(
            ended, outcome.seconds, self.utilization_cap
        )

    def _recover_from_oom(self, batch: list[QueuedRequest], items: int, outcome: Outcome) -> None:
        self.metrics.ooms.inc()
        self.cap_state.on_oom(items)
        if len(batch) == 1:
            log.warning("request does not fit in device memory", extra={"items": items})
            self._fail(batch[0], OutOfMemory(f"{outcome.error} (even alone, {items} items)"))
            return
        half = split_index([r.size for r in batch])
        self.metrics.splits.inc()
        log.warning(
            "batch ran out of memory; splitting and retrying",
            extra={"items": items, "requests": len(batch), "first_half": half, "cap": self.cap},
        )
        self._waiting.retry.appendleft(batch[half:])
        self._waiting.retry.appendleft(batch[:half])

    def _answer(
        self, batch: list[QueuedRequest], results: list[Any], started: float, ended: float
    ) -> None:
        """Answer a batch's requests; counted a batch at a time (all are of one class)."""
        self._observe_queue_latency(batch, started)
        latencies = []
        for request, result in zip(batch, results, strict=True):
            if request.future.done():
                self._count(request, "cancelled")
                continue
            request.future.set_result(result)
            latencies.append(ended - request.arrival)
        if not batch[0].best_effort:
            self.metrics.answered_with_results(latencies, self.slo_seconds)
        else:
            for _ in latencies:
                self.metrics.answered_best_effort("ok")

    def _observe_queue_latency(self, batch: list[QueuedRequest], started: float) -> None:
        if not batch[0].best_effort:
            self.metrics.queue_latency.observe_many([started - r.arrival for r in batch])

    def _fail(self, request: QueuedRequest, error: BatcherError) -> None:
        if request.future.done():
            self._count(request, "cancelled")
            return
        request.future.set_exception(error)
        self._count(request, error.outcome)

    def _count(self, request: QueuedRequest, outcome: str) -> None:
        """Count an answer without a result in its class's series (results are counted a batch
        at a time in :meth:`_answer`)."""
        if request.best_effort:
            self.metrics.answered_best_effort(outcome)
            return
        self.metrics.answered(outcome, self.slo_seconds)


def from_config(
    executor: BatchExecutor,
    config: BatcherConfig,
    *,
    model_device: str,
    policy: DispatchPolicy | None = None,
    memory: MemoryMonitor | None = None,
    metrics: BatcherMetrics | None = None,
    device: SharedDevice | None = None,
) -> Batcher:
    """A :class:`Batcher` set up from a :class:`~batcher.config.BatcherConfig` (on ``device``
    shared with other models' engines, or a device of its own) for a model on ``model_device``
    (``cpu``, ``cuda``...: ``dispatch: auto`` fills batches on a CPU)."""
    fixed = config.policy == "fixed-delay"
    if fixed and policy is None:
        policy = FixedDelayPolicy(
            max_delay=config.max_queue_delay_seconds,
            preferred=config.preferred_batch_size or config.max_batch_size,
        )
    elif policy is None:
        on_cpu = not model_device.startswith("cuda")
        policy = DeadlinePolicy(
            fill=config.dispatch == "fill" or (config.dispatch == "auto" and on_cpu)
        )
    return Batcher(
        executor,
        max_batch_size=config.max_batch_size,
        slo_seconds=config.slo_seconds,
        max_queue=config.max_queue,
        default_timeout_seconds=config.default_timeout_seconds,
        priority_levels=config.priority_levels,
        default_priority=config.default_priority,
        utilization_cap=config.utilization_cap,
        policy=policy,
        adaptive_cap=not fixed,
        refuse_past_slo=config.refuse_past_slo,
        best_effort_priority=config.best_effort_priority,
        best_effort_quantum_seconds=config.best_effort_quantum_seconds,
        best_effort_max_queue=config.best_effort_max_queue,
        best_effort_slack_margin=config.best_effort_slack_margin,
        best_effort_window_seconds=config.best_effort_window_seconds,
        memory=memory,
        metrics=metrics,
        device=device,
    )
