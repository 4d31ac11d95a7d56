"""A discrete-event model of a fleet of GPU replicas serving batched requests from one queue.

Requests wait in a FIFO queue (the load balancer's or the batcher's). A ready replica that is free
takes up to ``max_batch`` waiting requests at once and serves them in ``c + a * sum(work)``
seconds (``t(b) = c + a*b`` for average requests). A replica ordered by the autoscaler is paid
for from that moment but serves only after ``cold_start`` seconds (pull, load weights, warm up).
Removing replicas takes, in this order, ones still starting, idle ones, ones running best-effort
work, then busy ones, which finish their batch first (graceful termination) and are paid for until
then.

Best-effort backfill (off unless ``backfill_quantum`` is given): a ready replica with no online
request waiting may run a slice of best-effort work of at most one quantum, if fewer than
``backfill_cap`` replicas are already doing so and the backlog is not empty. A slice is never
interrupted, but when it ends an online request that waits takes the replica first.

Slices back to back on one replica are replayed as one run whose slice boundaries are computed
rather than each being an event: a run is cut at its next boundary only when an online request
waits for a replica, the cap falls, or the replica is removed. The outcome is the same as
slice-by-slice replay at a small fraction of the events.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from autoscaler.core.slo_sizing import ServiceModel


@dataclass
class _Replica:
    ordered_at: float
    ready_at: float
    busy_until: float = -math.inf
    removing: bool = False
    removed_at: float | None = None
    generation: int = 0  # events carry it; a cut best-effort run makes older ones stale


@dataclass
class _Run:
    """Back-to-back best-effort slices on one replica, from ``start`` up to ``end`` (the work
    reserved from the backlog for it), or to ``stop`` once it is cut."""

    start: float
    end: float
    stop: float | None = None


# The longest best-effort run reserved at once, in quanta: a bound on the events a fleet that
# runs best-effort work for days needs, not a limit on the work (runs follow one another).
_RUN_QUANTA = 1000


class Fleet:
    """Replays arrivals through replicas; ``advance(t)`` runs every event up to time ``t``."""

    def __init__(
        self,
        arrivals: np.ndarray,
        work: np.ndarray,
        service: ServiceModel,
        cold_start: float,
        initial_replicas: int,
        start: float = 0.0,
        backfill_quantum: float | None = None,
        backfill_work: float = 0.0,
    ) -> None:
        self.arrivals = arrivals
        self.work = work
        self.service = service
        self.cold_start = cold_start
        self.started = np.full(len(arrivals), np.nan)
        self.finished = np.full(len(arrivals), np.nan)
        self.replicas: list[_Replica] = []
        self._active: list[int] = []  # ids ordered and not being removed, oldest first
        self._queue: deque[int] = deque()
        self._idle: list[int] = []
        # (time a replica becomes free or ready, id, the replica's generation then)
        self._events: list[tuple[float, int, int]] = []
        self._next_arrival = 0
        self.now = start
        self.busy_seconds = 0.0
        self.backfill_quantum = backfill_quantum
        self.backfill_left = backfill_work if backfill_quantum is not None else 0.0
        self.backfill_cap = 0
        self._backfill_done = 0.0
        self._runs: dict[int, _Run] = {}
        for _ in range(initial_replicas):
            self._add(start, ready_at=start)

    # -- what the autoscaler sees and does ---------------------------------------------------
    @property
    def replica_count(self) -> int:
        """Replicas ordered and not being removed: the scale's spec.replicas."""
        return len(self._active)

    @property
    def ready_count(self) -> int:
        return sum(1 for i in self._active if self.replicas[i].ready_at <= self.now)

    @property
    def queue_length(self) -> int:
        return len(self._queue)

    def scale_to(self, desired: int) -> None:
        active = len(self._active)
        if desired > active:
            for _ in range(desired - active):
                self._add(self.now, ready_at=self.now + self.cold_start)
        elif desired < active:
            self._remove(active - desired)

    @property
    def backfilling_count(self) -> int:
        """Replicas running best-effort slices and not yet told to stop."""
        return sum(1 for run in self._runs.values() if run.stop is None)

    @property
    def backfill_seconds(self) -> float:
        """Replica-seconds of best-effort work done up to now."""
        running = sum(min(self.now, r.stop or r.end) - r.start for r in self._runs.values())
        return self._backfill_done + running

    def set_backfill_cap(self, cap: int) -> None:
        """Let at most ``cap`` replicas run best-effort slices: idle ones start at once, and
        runs beyond the cap stop at their next slice boundary (the soonest first)."""
        self.backfill_cap = cap
        while self._idle and self._may_backfill():
            self._start_run(self._idle.pop(), self.now)
        excess = self.backfilling_count - cap
        if excess > 0:
            for rid in self._soonest_boundaries(excess):
                self._cut(rid)

    def starting_seconds(self, until: float) -> float:
        """Replica-seconds paid for while a replica was still starting (no work can use them)."""
        total = 0.0
        for r in self.replicas:
            end = r.removed_at if r.removed_at is not None else until
            total += max(0.0, min(r.ready_at, end, until) - r.ordered_at)
        return total

    def billed_seconds(self, until: float) -> float:
        """Replica-seconds paid for up to ``until`` (from order to removal)."""
        total = 0.0
        for r in self.replicas:
            end = r.removed_at if r.removed_at is not None else until
            total += max(0.0, min(end, until) - r.ordered_at)
        return total

    # -- the event loop ----------------------------------------------------------------------
    def advance(self, until: float) -> None:
        arrivals = self.arrivals
        n = len(arrivals)
        events = self._events
        while True:
            ta = arrivals[self._next_arrival] if self._next_arrival < n else math.inf
            te = events[0][0] if events else math.inf
            if min(ta, te) > until:
                break
            if te <= ta:
                t, rid, generation = heapq.heappop(events)
                if generation != self.replicas[rid].generation:
                    continue  # the best-effort run this ended was cut
                self.now = t
                self._on_free(rid, t)
            else:
                self.now = ta
                self._queue.append(self._next_arrival)
                self._next_arrival += 1
                if self._idle:
                    self._start_batch(self._idle.pop(), ta)
                else:
                    self._call_backfill_replicas()
        self.now = until

    def _on_free(self, rid: int, t: float) -> None:
        replica = self.replicas[rid]
        run = self._runs.pop(rid, None)
        if run is not None:
            self._backfill_done += t - run.start
            self.backfill_left += run.end - t  # the reserved work not done goes back
        if replica.removed_at is not None:
            return
        if replica.removing:
            replica.removed_at = t
            return
        if self._queue:
            self._start_batch(rid, t)
        elif self._may_backfill():
            self._start_run(rid, t)
        else:
            self._idle.append(rid)

    def _may_backfill(self) -> bool:
        return self.backfill_left > 0 and len(self._runs) < self.backfill_cap

    def _start_run(self, rid: int, t: float) -> None:
        assert self.backfill_quantum is not None
        reserved = min(self.backfill_quantum * _RUN_QUANTA, self.backfill_left)
        self.backfill_left -= reserved
        self._runs[rid] = _Run(start=t, end=t + reserved)
        self._schedule(rid, t + reserved)

    def _next_boundary(self, rid: int) -> float:
        run = self._runs[rid]
        assert self.backfill_quantum is not None
        slices = math.ceil((self.now - run.start) / self.backfill_quantum - 1e-9)
        return min(run.end, run.start + max(slices, 0) * self.backfill_quantum)

    def _cut(self, rid: int) -> None:
        """End replica ``rid``'s best-effort run at its next slice boundary."""
        run = self._runs[rid]
        run.stop = self._next_boundary(rid)
        self.replicas[rid].generation += 1
        self._schedule(rid, run.stop)

    def _soonest_boundaries(self, count: int) -> list[int]:
        running = [rid for rid, run in self._runs.items() if run.stop is None]
        return sorted(running, key=self._next_boundary)[:count]

    def _call_backfill_replicas(self) -> None:
        """Enough best-effort runs stop at their next boundary to serve the waiting requests."""
        stopping = len(self._runs) - self.backfilling_count
        needed = math.ceil(len(self._queue) / self.service.max_batch) - stopping
        if needed > 0:
            for rid in self._soonest_boundaries(needed):
                self._cut(rid)

    def _schedule(self, rid: int, t: float) -> None:
        replica = self.replicas[rid]
        replica.busy_until = t
        heapq.heappush(self._events, (t, rid, replica.generation))

    def _start_batch(self, rid: int, t: float) -> None:
        queue = self._queue
        size = min(self.service.max_batch, len(queue))
        batch = [queue.popleft() for _ in range(size)]
        duration = self.service.batch_seconds(float(self.work[batch].sum()))
        self.started[batch] = t
        self.finished[batch] = t + duration
        self.busy_seconds += duration
        self._schedule(rid, t + duration)

    def _add(self, now: float, ready_at: float) -> None:
        self.replicas.append(_Replica(ordered_at=now, ready_at=ready_at))
        self._active.append(len(self.replicas) - 1)
        heapq.heappush(self._events, (ready_at, len(self.replicas) - 1, 0))

    def _remove(self, count: int) -> None:
        now = self.now
        active = self._active
        starting = [i for i in active if self.replicas[i].ready_at > now]
        idle_set = set(self._idle)
        active_set = set(active)
        idle = [i for i in self._idle if i in active_set]
        busy = [i for i in active if self.replicas[i].ready_at <= now and i not in idle_set]
        backfilling = [i for i in busy if i in self._runs]
        serving = [i for i in busy if i not in self._runs]
        chosen = (sorted(starting, reverse=True) + idle[::-1] + backfilling + serving)[:count]
        gone = set(chosen)
        self._active = [i for i in active if i not in gone]
        for rid in chosen:
            replica = self.replicas[rid]
            run = self._runs.get(rid)
            if run is not None and run.stop is None:
                self._cut(rid)
            if replica.busy_until > now:
                replica.removing = True
            else:
                replica.removed_at = now
                if rid in self._idle:
                    self._idle.remove(rid)
