"""How large one model's next batch may be, and how long a batch takes to run.

Four things bound a batch, kept together because each reads the others: the cost model (the
time of a batch of each size, fitted from the batches that ran), the target the cap aims at (the
most efficient size within the SLO's batch budget, giving way to throughput near saturation), the
adaptive cap on top of it (:class:`~batcher.policy.AdaptiveCap`), and the memory cap (the largest
batch the device's free memory holds by the footprint learned, :mod:`batcher.memory`). Sizes are
as the executor runs them: padded to its buckets when it pads.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from batcher.cost_model import CostModel
from batcher.memory import BatchFootprint, MemoryMonitor, memory_cap
from batcher.metrics import BatcherMetrics
from batcher.policy import (
    BATCH_BUDGET_FRACTION,
    CAP_LOAD_HEADROOM,
    CAP_MARGIN_STDDEVS,
    AdaptiveCap,
    largest_within,
)


class BatchSizer:
    """The cost model and the caps of one model's batches."""

    def __init__(
        self,
        size_for: Callable[[int], int],
        max_batch_size: int,
        slo_seconds: float,
        *,
        adaptive: bool,
        memory: MemoryMonitor | None,
        metrics: BatcherMetrics,
    ) -> None:
        self.size_for = size_for
        self.max_batch_size = max_batch_size
        self.slo_seconds = slo_seconds
        self.adaptive = adaptive
        self.memory = memory
        self.metrics = metrics
        self.cost = CostModel()
        self.cap_state = AdaptiveCap(max_batch_size)
        self.footprint = BatchFootprint()
        self.memory_cap, self.memory_cap_reason = max_batch_size, "unlearned"
        metrics.memory_capped(self.memory_cap, self.memory_cap_reason)
        self.allowed: tuple[int, ...] | None = None  # the executor's sizes; None: every size
        self.target = max_batch_size
        self.floor = 1  # no SLO back-off below this: the smallest size keeping up with arrivals

    @property
    def cap(self) -> int:
        """The batch-size cap in force now, within what the device's free memory holds."""
        limit = (
            self.cap_state.effective(self.target, self.allowed)
            if self.adaptive
            else self.max_batch_size
        )
        if self.memory_cap >= limit:
            return limit
        fitting = largest_within(self.memory_cap, self.allowed)
        return self.memory_cap if fitting is None else fitting

    def cost_of(self, items: int) -> float:
        """Conservative time of a batch of ``items`` as it would run (padded)."""
        return self.cost.estimate(self.size_for(items))

    def expected_cost_of(self, items: int) -> float:
        """Expected time (no noise margin) of a batch of ``items`` as it would run (padded)."""
        return self.cost.mean(self.size_for(items))

    def cost_with_margin(self, items: int) -> float:
        """Time of a batch of ``items`` with the cap's noise margin (how quanta are judged)."""
        return self.cost.estimate(self.size_for(items), CAP_MARGIN_STDDEVS)

    def refresh_memory_cap(self) -> None:
        """Recompute the memory cap from the learned footprint and the device's headroom now
        (once per batch: the headroom is a driver call, too dear for every request)."""
        headroom = self.memory.headroom_bytes() if self.memory is not None else None
        cap, reason = memory_cap(headroom, self.footprint.line(), self.max_batch_size)
        if (cap, reason) != (self.memory_cap, self.memory_cap_reason):
            self.memory_cap, self.memory_cap_reason = cap, reason
            self.metrics.memory_capped(cap, reason)

    def refresh_sizes(self) -> None:
        """Re-read the executor's buckets (after calibration chose them); retarget after."""
        sizes = range(1, self.max_batch_size + 1)
        allowed = tuple(n for n in sizes if self.size_for(n) == n)
        self.allowed = None if len(allowed) == self.max_batch_size else allowed

    def retarget(self, items_rate: float) -> None:
        """Choose the cap's target: the most efficient size within the SLO's batch budget.

        Near saturation (that size would keep the device over 1/CAP_LOAD_HEADROOM busy serving
        the ``items_rate`` arriving) the budget gives way to throughput: smaller batches would
        only grow the backlog and make everyone late, and a burst is drained fastest in the
        largest batches. Also sets the floor of the cap's back-offs: the smallest size serving
        the arrivals with that headroom (never above the target).
        """
        budget = BATCH_BUDGET_FRACTION * self.slo_seconds
        target = self.cost.best_size(
            budget, self.max_batch_size, self.allowed, stddevs=CAP_MARGIN_STDDEVS
        )
        seconds = self.expected_cost_of(target)
        needed = CAP_LOAD_HEADROOM * items_rate
        if seconds > 0 and target / seconds < needed:
            target = self.cost.best_size(math.inf, self.max_batch_size, self.allowed, stddevs=0)
        self.target = target
        self.floor = min(
            target, self.cost.smallest_serving(needed, self.max_batch_size, self.allowed)
        )
        self.metrics.cost_fixed.set(self.cost.fixed_seconds)
        self.metrics.cost_per_item.set(self.cost.per_item_seconds)
