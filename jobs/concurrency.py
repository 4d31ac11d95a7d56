"""How many requests a job keeps in flight: additive increase, multiplicative decrease (AIMD).

A best-effort job must take whatever capacity the online traffic leaves and give it back at
once when asked. The batcher asks by refusing (429, or 503 while it drains) with a Retry-After;
TCP's congestion rule fits that signal: grow the limit by one after each window of ``limit``
successes, halve it on a refusal. Refusals of requests sent before the last decrease belong to
the same congestion event and do not halve again (each send carries the ``epoch`` it was made
in), so one burst of refusals costs one halving, not ``limit`` of them.

Refusals with no answer between them (a batcher throttling best-effort work while online latency
is tight, or draining) drive the limit down to the minimum, yet say nothing about how much work
fits once the throttle lifts. So, as TCP's slow start does after a timeout, the limit climbs by
one per answer (doubling each window) back to a threshold of half the limit at which the last
refusal after an answer arrived, then grows by one per window again. Only a refusal that follows
an answer lowers that threshold: capacity measured smaller, not merely closed for a while.

The limit only grows on evidence that it is too small: a success counts only when ``limit``
requests were on the wire at some moment while it was (:class:`InFlight`; RFC 7661's
"cwnd-limited" test). A job held back by something else -- its ``--max-rate``, a short input --
keeps fewer in flight than it may; its answers say nothing about whether more would fit, so
they do not raise the limit (without this rule a rate-capped job's limit climbed to the maximum
on answers that came one at a time, and the first burst after a cap was lifted met it).

Pure state, no clock and no I/O: callers pass in what happened and read ``limit``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field


@dataclass
class AIMDLimit:
    """The concurrency limit of one job; ``limit`` is always within ``[minimum, maximum]``."""

    minimum: int = 1
    maximum: int = 64
    initial: int = 4
    decrease_factor: float = 0.5
    limit: int = field(init=False)
    epoch: int = field(init=False, default=0)
    slow_start_threshold: int = field(init=False)
    _window_successes: int = field(init=False, default=0)
    _answered_since_decrease: bool = field(init=False, default=True)

    def __post_init__(self) -> None:
        if not 1 <= self.minimum <= self.maximum:
            raise ValueError("need 1 <= minimum <= maximum")
        if not 0 < self.decrease_factor < 1:
            raise ValueError("decrease_factor must be in (0, 1)")
        self.limit = min(max(self.initial, self.minimum), self.maximum)
        self.slow_start_threshold = self.limit

    def on_success(self, saturated: bool) -> bool:
        """A request was answered; returns True when this success grew the limit.

        ``saturated``: whether the limit was full (``limit`` requests on the wire) at some
        moment while this one was (:meth:`InFlight.answered`). Only such a success counts
        towards growth, in slow start and in a window alike."""
        self._answered_since_decrease = True
        if not saturated or self.limit >= self.maximum:
            return False
        if self.limit < self.slow_start_threshold:
            self.limit += 1
            return True
        self._window_successes += 1
        if self._window_successes < self.limit:
            return False
        self._window_successes = 0
        self.limit += 1
        return True

    def on_refusal(self, sent_epoch: int) -> bool:
        """A request sent in ``sent_epoch`` was refused; returns True when the limit shrank."""
        if sent_epoch < self.epoch:
            return False
        self.epoch += 1
        self._window_successes = 0
        self.limit = max(self.minimum, math.floor(self.limit * self.decrease_factor))
        if self._answered_since_decrease:
            self.slow_start_threshold = self.limit
        self._answered_since_decrease = False
        return True


@dataclass
class InFlight:
    """Requests sent and not yet answered, and whether each one saw the limit full.

    A request counts from :meth:`send` (just before it goes out) to :meth:`answered` (its
    answer, refusal or failure came back, or it was cancelled); one waiting for its send slot
    under ``--max-rate`` or waiting out a Retry-After is not in flight. Each send that leaves
    ``limit`` or more in flight is a *fill*; a request saw the limit full when a fill happened
    while it was in flight (its own send included). Counting fills rather than comparing at
    the answer matters because answers come in bursts (the batcher answers a batch at once):
    only the first of a batch would find the limit full at its answer.
    """

    count: int = 0
    _fills: int = field(default=0, repr=False)

    def send(self, limit: int) -> int:
        """One request goes out under ``limit``; returns its ticket for :meth:`answered`."""
        ticket = self._fills
        self.count += 1
        if self.count >= limit:
            self._fills += 1
        return ticket

    def answered(self, ticket: int) -> bool:
        """The request sent with ``ticket`` came back; returns whether the limit was full at
        some moment while it was in flight (pass it to :meth:`AIMDLimit.on_success`)."""
        if self.count <= 0:
            raise RuntimeError("answered more requests than were sent")
        self.count -= 1
        return self._fills > ticket


def retry_delay(
    attempt: int,
    retry_after: float | None,
    base: float = 0.5,
    cap: float = 30.0,
    rng: random.Random | None = None,
) -> float:
    """Seconds to wait before sending a refused or failed request again.

    The server's Retry-After wins when it gave one (capped, so a wild value cannot park a job);
    otherwise exponential back-off from ``base`` with full jitter, so many pods of one Indexed Job
    refused together do not come back together.
    """
    if retry_after is not None and retry_after >= 0:
        return min(retry_after, cap)
    ceiling = min(cap, base * 2 ** max(attempt - 1, 0))
    return (rng or random).uniform(ceiling / 2, ceiling)


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a Retry-After header in its delay-seconds form; None when absent or not one.

    The HTTP-date form is not used by the batcher and is treated as absent.
    """
    if value is None:
        return None
    try:
        seconds = float(value.strip())
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None
