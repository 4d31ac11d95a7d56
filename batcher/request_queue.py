"""The requests waiting for a batch: the online queue in dispatch order and the best-effort line.

Online requests are kept sorted by ``(priority level, dispatch deadline, arrival order)``, the
order the dispatch policy reads them in, so a batch is always a prefix; best-effort requests wait
first-come first-served in a line of their own that online admission never looks at. Batches
split after running out of memory wait in ``retry``, ahead of everything else. Removal by
identity (a cancelled client) is a binary search, not a scan. Timeouts are found by
:meth:`RequestQueue.take_expired`, a scan the engine runs only when its one expiry timer fires
(at the earliest expiry among the waiting), instead of a loop timer per request.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from batcher.best_effort import BEST_EFFORT, ONLINE
from batcher.policy import Pending, fitting_prefix


@dataclass(eq=False)
class QueuedRequest:
    """One accepted request until it is answered."""

    payload: Any
    size: int
    level: int
    arrival: float
    deadline: float
    expiry: float
    seq: int
    future: asyncio.Future = field(repr=False)
    best_effort: bool = False
    _pending: Pending = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # Built once: every dispatch decision reads the queue's head through pending(), and
        # building one per request per decision was a visible share of the serving path.
        self._pending = Pending(size=self.size, arrival=self.arrival, deadline=self.deadline)

    @property
    def request_class(self) -> str:
        return BEST_EFFORT if self.best_effort else ONLINE

    @property
    def key(self) -> tuple[int, float, int]:
        return (self.level, self.deadline, self.seq)

    def pending(self) -> Pending:
        return self._pending


class RequestQueue:
    """Waiting requests of one model: online (sorted), best-effort (a line), split retries."""

    def __init__(self) -> None:
        self.online: list[QueuedRequest] = []
        self._keys: list[tuple[int, float, int]] = []
        self.online_items = 0
        self.best_effort: deque[QueuedRequest] = deque()
        self.best_effort_items = 0
        self.retry: deque[list[QueuedRequest]] = deque()

    def __bool__(self) -> bool:
        return bool(self.online or self.best_effort or self.retry)

    def items_at_or_above(self, level: int) -> int:
        """Online items dispatched before a new request of priority ``level``."""
        return sum(r.size for r in self.online if r.level <= level)

    def add(self, request: QueuedRequest) -> None:
        if request.best_effort:
            self.best_effort.append(request)
            self.best_effort_items += request.size
            return
        index = bisect.bisect(self._keys, request.key)
        self._keys.insert(index, request.key)
        self.online.insert(index, request)
        self.online_items += request.size

    def remove(self, request: QueuedRequest) -> bool:
        """Take a waiting request out (a cancelled client); False if it already left."""
        if request.best_effort:
            if request not in self.best_effort:
                return False
            self.best_effort.remove(request)
            self.best_effort_items -= request.size
            return True
        index = bisect.bisect_left(self._keys, request.key)
        if index < len(self.online) and self.online[index] is request:
            del self.online[index], self._keys[index]
            self.online_items -= request.size
            return True
        return False

    def pop_online(self, count: int) -> list[QueuedRequest]:
        """The first ``count`` online requests, in dispatch order."""
        batch = self.online[:count]
        del self.online[:count], self._keys[:count]
        self.online_items -= sum(r.size for r in batch)
        return batch

    def pop_best_effort(self, limit: int) -> list[QueuedRequest]:
        """The next best-effort batch: the longest prefix of the line within ``limit`` items."""
        head = list(itertools.islice(self.best_effort, limit + 1))
        count, items, _ = fitting_prefix([r.pending() for r in head], limit)
        batch = [self.best_effort.popleft() for _ in range(count)]
        self.best_effort_items -= items
        return batch

    def earliest_expiry(self) -> float:
        """The soonest time a waiting request (online or best-effort) reaches its timeout;
        infinity when none waits."""
        return min(
            min((r.expiry for r in self.online), default=math.inf),
            min((r.expiry for r in self.best_effort), default=math.inf),
        )

    def take_expired(self, now: float) -> list[QueuedRequest]:
        """Take out and return the waiting requests whose timeout is at or before ``now``."""
        expired = [r for r in self.online if r.expiry <= now]
        expired += [r for r in self.best_effort if r.expiry <= now]
        if not expired:
            return []
        kept = [(k, r) for k, r in zip(self._keys, self.online, strict=True) if r.expiry > now]
        self._keys = [k for k, _ in kept]
        self.online = [r for _, r in kept]
        self.online_items = sum(r.size for r in self.online)
        self.best_effort = deque(r for r in self.best_effort if r.expiry > now)
        self.best_effort_items = sum(r.size for r in self.best_effort)
        return expired

    def take_all(self) -> list[QueuedRequest]:
        """Everything waiting, of every kind (a drain that ran out of time answers them)."""
        waiting = self.pop_online(len(self.online))
        while self.retry:
            waiting.extend(self.retry.popleft())
        waiting.extend(self.pop_best_effort(self.best_effort_items))
        return waiting
