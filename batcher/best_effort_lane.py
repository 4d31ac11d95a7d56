"""One model's best-effort lane: how long its batches may run, when the next may start, and the
slack controller that paces them (the rules are :mod:`batcher.best_effort`'s).

The engine queues best-effort requests and runs their batches; this object says how large a
batch may be (the quantum), when the next may start (the share's pacing, the utilization cap),
what a refusal while throttled says, and it steps the controller from the online latencies,
exporting the share and logging when the throttle starts or ends.
"""

from __future__ import annotations

import logging
import math

from batcher.batch_sizing import BatchSizer
from batcher.best_effort import (
    STEPS_PER_WINDOW,
    LatencyWindow,
    ShareChange,
    SlackController,
    effective_quantum,
    next_start_for_share,
    quantum_batch_limit,
    throttled_retry_after,
)
from batcher.errors import Rejected
from batcher.metrics import BatcherMetrics

log = logging.getLogger("batcher.engine")  # its notes are the engine's, as operators know them


class BestEffortLane:
    """The quantum, pacing and throttle of one model's best-effort work."""

    def __init__(
        self,
        sizing: BatchSizer,
        metrics: BatcherMetrics,
        *,
        slo_seconds: float,
        quantum_seconds: float,
        max_queue: int,
        slack_margin: float,
        window_seconds: float,
    ) -> None:
        self.sizing = sizing
        self.metrics = metrics
        self.slo_seconds = slo_seconds
        self.configured_quantum = quantum_seconds
        self.max_queue = max_queue
        self.slack_margin = slack_margin * slo_seconds
        self.online_latencies = LatencyWindow(window_seconds)
        self.controller = SlackController(self.slack_margin, window_seconds / STEPS_PER_WINDOW)
        self.last: tuple[float, float] = (-math.inf, 0.0)  # (end, seconds) of the last batch

    @property
    def quantum(self) -> float:
        """The quantum in force (seconds): configured or derived, at least t(1)."""
        return effective_quantum(
            self.configured_quantum, self.slo_seconds, self.sizing.cost_with_margin(1)
        )

    def batch_limit(self, budget: float | None = None) -> int:
        """Largest batch predicted to run within ``budget`` (default: the quantum).

        With nothing measured yet: one item, the only size whose time is not a guess.
        """
        if not self.sizing.cost.known:
            return 1
        return quantum_batch_limit(
            self.sizing.cost_with_margin,
            self.quantum if budget is None else budget,
            min(self.sizing.max_batch_size, self.sizing.cap_state.ceiling),
            self.sizing.allowed,
        )

    def queue_bound(self) -> int:
        """Items allowed to wait: configured, else two batches of the quantum."""
        return self.max_queue or 2 * self.batch_limit()

    def start_at(self, now: float, earliest_start: float, draining: bool) -> float:
        """Earliest start of the next batch: the share's pacing and the utilization cap
        (``inf`` while throttled); at once while draining, so everything accepted is run."""
        if draining:
            return now
        end, seconds = self.last
        return max(next_start_for_share(end, seconds, self.controller.share), earliest_start)

    def ran(self, ended: float, seconds: float) -> None:
        """A best-effort batch ended at ``ended`` after ``seconds`` on the device."""
        self.last = (ended, seconds)

    def step(self, now: float, queued_items: int) -> ShareChange | None:
        """A controller step, when one is due: the share follows the online slack.

        Returns the change when the share moved (the caller sheds the waiting requests when
        the throttle starts).
        """
        if now < self.controller.next_step_at():
            return None
        p99 = self.online_latencies.p99(now)
        slack = self.slo_seconds if p99 is None else self.slo_seconds - p99
        change = self.controller.step(now, slack)
        if change is None:
            return None
        self.metrics.online_latency_slack.set(slack)
        self.metrics.best_effort_share.set(change.after)
        self.metrics.best_effort_throttled.set(1 if change.throttled else 0)
        if change.throttle_changed:
            fields = {
                "slack_seconds": round(slack, 6),
                "online_p99_seconds": None if p99 is None else round(p99, 6),
                "margin_seconds": round(self.slack_margin, 6),
                "share": round(change.after, 3),
                "best_effort_queued_items": queued_items,
            }
            if change.throttled:
                log.warning(
                    "best-effort throttled: online latency slack under the margin", extra=fields
                )
            else:
                log.info("best-effort resumed: online latency slack is back", extra=fields)
        return change

    def throttled_refusal(self, now: float) -> Rejected:
        """The refusal of a best-effort request while throttled, with its Retry-After."""
        clears = self.online_latencies.clears_at(now, self.slo_seconds - self.slack_margin)
        return Rejected(
            "best-effort work is paused: online latency is near its SLO; retry after the "
            "Retry-After delay",
            "throttled",
            throttled_retry_after(clears, now, self.controller.interval),
        )
