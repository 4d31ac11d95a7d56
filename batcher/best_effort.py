"""The best-effort request class: which requests it holds, how large its batches may be, and how
much of the device it may use. Pure decisions; every function takes the time as an argument.

Why a class at all: a serving fleet sized for its online peak idles most of the day, and work that
can wait (nightly embeddings, evaluations, re-scoring) can fill that idle time, as long as it never
makes an online request late. Three rules keep it so, after Heracles (Lo et al., ISCA'15), which
co-locates best-effort tasks beside latency-critical services under a controller on their latency
slack:

* **Online first.** A best-effort batch starts only when no online request is waiting to start
  (or in a gap the online dispatcher leaves while its batch fills, when the best-effort batch
  fits in it), and a device cannot be preempted mid-batch, so each best-effort batch is cut to a
  time *quantum*: its size is the largest whose predicted run time, from the batcher's own cost
  model t(b) = c + a·b, fits the quantum (:func:`quantum_batch_limit`). An online request that
  arrives meanwhile waits at most about one quantum. The default quantum is
  ``DEFAULT_QUANTUM_SLO_FRACTION`` of the online SLO; it is never below the time of one item.
* **A share of device time, on the latency slack.** :class:`SlackController` holds a share in
  [0, 1] that bounds the fraction of device time best-effort batches may use (after a batch of
  ``d`` seconds the next may start ``d·(1/share − 1)`` later). Every control step it compares the
  online slack (SLO minus the p99 of the online latencies of the last window,
  :class:`LatencyWindow`) with a margin: under the margin the share is halved (and snaps to zero
  below ``SHARE_FLOOR``; a negative slack, the SLO already broken, zeroes it at once); over it the
  share grows back by ``SHARE_STEP``. Additive increase, multiplicative decrease: the share backs
  off fast when online latency suffers and probes back slowly.
* **Refuse rather than queue.** With no idle capacity (the share is zero, or the best-effort queue
  holds its bound) a best-effort request is refused at once with a ``Retry-After`` derived from
  when capacity should return (:func:`throttled_retry_after`, :func:`queue_full_retry_after`),
  so a job runner backs off instead of piling work into the batcher.

Request class on the wire (KServe v2 ``parameters.priority``, as Triton takes it): the strings
``"online"`` and ``"best-effort"``, or an integer as ``tritonclient`` sends ``priority=N``:
0 (the default level) and 1..priority_levels are online levels, ``best_effort_priority`` and above
are best-effort (:func:`classify_priority`).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

ONLINE = "online"
BEST_EFFORT = "best_effort"
PRIORITY_NAMES = {"online": ONLINE, "best-effort": BEST_EFFORT}

DEFAULT_QUANTUM_SLO_FRACTION = 0.1  # default quantum: this fraction of the online SLO
SHARE_STEP = 0.1  # additive increase of the share per control step with slack above the margin
SHARE_BACKOFF = 0.5  # multiplicative decrease per control step under the margin
SHARE_FLOOR = 0.05  # a share backed off below this is zero: best-effort is throttled
STEPS_PER_WINDOW = 10  # control steps per latency window
WINDOW_MAX_SAMPLES = 20_000  # the latency window keeps at most this many recent samples
LATENCY_QUANTILE = 99.0

Cost = Callable[[int], float]


class PriorityError(ValueError):
    """A ``priority`` parameter that names no class (HTTP 400)."""


@dataclass(frozen=True)
class RequestClass:
    """The class of one request and, when online, its priority level (1 is the highest)."""

    name: str
    level: int


def classify_priority(
    priority: int | str, priority_levels: int, default_level: int, best_effort_priority: int
) -> RequestClass:
    """The class a request's ``priority`` parameter asks for.

    ``"online"`` and 0 are the default online level; 1..``priority_levels`` are online levels;
    ``"best-effort"`` and any integer from ``best_effort_priority`` up are best-effort (so the
    same integers work from tritonclient, whose ``priority=`` is an unsigned integer).
    """
    if isinstance(priority, str):
        name = PRIORITY_NAMES.get(priority)
        if name is None:
            raise PriorityError(
                f'priority {priority!r} is not a request class; use "online" or '
                f'"best-effort" (or an integer: 0..{priority_levels} online, '
                f">= {best_effort_priority} best-effort)"
            )
        return RequestClass(name, default_level if name == ONLINE else 0)
    if priority >= best_effort_priority:
        return RequestClass(BEST_EFFORT, 0)
    if priority == 0:
        return RequestClass(ONLINE, default_level)
    if 1 <= priority <= priority_levels:
        return RequestClass(ONLINE, priority)
    raise PriorityError(
        f"priority {priority} is neither an online level (0..{priority_levels}: 1 is the highest, "
        f'0 the default) nor best-effort (>= {best_effort_priority}, or "best-effort")'
    )


def effective_quantum(configured: float, slo_seconds: float, one_item_seconds: float) -> float:
    """The quantum in force: the configured one (0: a fraction of the SLO), never below the time
    of a single item, which no cut can shorten."""
    quantum = configured if configured > 0 else DEFAULT_QUANTUM_SLO_FRACTION * slo_seconds
    return max(quantum, one_item_seconds)


def quantum_batch_limit(
    cost: Cost, budget_seconds: float, maximum: int, allowed: Sequence[int] | None = None
) -> int:
    """The largest batch (in items, up to ``maximum``) whose ``cost`` fits ``budget_seconds``.

    ``allowed`` restricts the sizes to the padding buckets (``None``: every size). At least the
    smallest candidate: one item cannot be cut. Binary search: the cost is taken to grow with
    the size, as the cost model's line does and padding makes its table do.
    """
    if allowed:
        candidates = sorted({b for b in allowed if b <= maximum}) or [min(allowed)]
    else:
        candidates = list(range(1, maximum + 1))
    low, high = 0, len(candidates) - 1
    while low < high:
        mid = (low + high + 1) // 2
        if cost(candidates[mid]) <= budget_seconds:
            low = mid
        else:
            high = mid - 1
    return candidates[low]


class LatencyWindow:
    """Online request latencies of the last ``seconds``, for the slack controller's p99."""

    def __init__(self, seconds: float, max_samples: int = WINDOW_MAX_SAMPLES) -> None:
        self.seconds = seconds
        self._samples: deque[tuple[float, float]] = deque(maxlen=max_samples)

    def add(self, now: float, latency: float) -> None:
        """Record one online request answered at ``now`` after ``latency`` seconds."""
        self._samples.append((now, latency))

    def _forget(self, now: float) -> None:
        while self._samples and self._samples[0][0] < now - self.seconds:
            self._samples.popleft()

    def p99(self, now: float) -> float | None:
        """The 99th percentile of the window's latencies; None when the window is empty."""
        self._forget(now)
        if not self._samples:
            return None
        values = np.fromiter((latency for _, latency in self._samples), dtype=float)
        return float(np.percentile(values, LATENCY_QUANTILE, method="higher"))

    def clears_at(self, now: float, threshold: float) -> float:
        """When the last latency above ``threshold`` leaves the window (``now`` if none is in).

        An upper bound on when the window's p99 falls to the threshold, with no new slow
        requests: what a throttled best-effort client should wait.
        """
        self._forget(now)
        last = max((t for t, latency in self._samples if latency > threshold), default=None)
        return now if last is None else last + self.seconds


@dataclass(frozen=True)
class ShareChange:
    """One control step's outcome: the share before and after, and the slack it acted on."""

    before: float
    after: float
    slack: float

    @property
    def throttled(self) -> bool:
        return self.after <= 0.0

    @property
    def throttle_changed(self) -> bool:
        """Whether this step started or ended the throttle (the share reached or left zero)."""
        return (self.before <= 0.0) != (self.after <= 0.0)


class SlackController:
    """The share of device time best-effort may use, driven by the online latency slack.

    Steps happen at most every ``interval`` seconds of the caller's clock (``now`` is always an
    argument), so a test drives it step by step with made-up times and slacks.
    """

    def __init__(
        self, margin_seconds: float, interval_seconds: float, initial_share: float = 1.0
    ) -> None:
        self.margin = margin_seconds
        self.interval = interval_seconds
        self.share = min(1.0, max(0.0, initial_share))
        self._next_step = -math.inf

    @property
    def throttled(self) -> bool:
        return self.share <= 0.0

    def next_step_at(self) -> float:
        """When the next control step is due."""
        return self._next_step

    def step(self, now: float, slack: float) -> ShareChange | None:
        """One control step on ``slack`` (SLO minus recent online p99) if one is due at ``now``."""
        if now < self._next_step:
            return None
        self._next_step = now + self.interval
        before = self.share
        if slack <= 0:
            self.share = 0.0
        elif slack < self.margin:
            shrunk = self.share * SHARE_BACKOFF
            self.share = 0.0 if shrunk < SHARE_FLOOR else shrunk
        else:
            self.share = min(1.0, self.share + SHARE_STEP)
        return ShareChange(before, self.share, slack)


def next_start_for_share(end: float, duration: float, share: float) -> float:
    """Earliest start of the next best-effort batch after one of ``duration`` ended at ``end``,
    so best-effort batches use at most ``share`` of the device's time (never, at share 0)."""
    if share <= 0:
        return math.inf
    if share >= 1:
        return end
    return end + duration * (1.0 / share - 1.0)


def throttled_retry_after(clears_at: float, now: float, interval_seconds: float) -> float:
    """Seconds a throttled best-effort client should wait: until the slow online latencies have
    left the window, plus the control step that then reopens the share."""
    return max(0.0, clears_at - now) + interval_seconds


def queue_full_retry_after(
    excess_items: int, batch_limit: int, batch_seconds: float, share: float, busy_for: float
) -> float:
    """Seconds until the best-effort queue has room for ``excess_items`` more: the batches that
    free them, each followed by the idle time the share imposes, after what runs now."""
    batches = math.ceil(max(excess_items, 1) / max(batch_limit, 1))
    spacing = batch_seconds / share if share > 0 else batch_seconds
    return busy_for + batches * spacing
