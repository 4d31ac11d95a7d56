"""What the engine learns from the stream of requests: the recent arrival rate and request size.

Admission predicts how full the batch a new request rides in will be, and the cap gives way to
throughput near saturation: both need items per second arriving now. Every arrival counts,
refused or not, since demand (not what was accepted) sizes batches under overload.
"""

from __future__ import annotations

import math

from batcher.policy import arrival_rate

GAP_WEIGHT = 0.05  # weight of a new inter-arrival gap (and request size) in the running means


class ArrivalTracker:
    """Running means of the gap between arrivals and of the items per request."""

    def __init__(self) -> None:
        self._last: float | None = None
        self._mean_gap = math.inf
        self._gaps_seen = 0
        self._mean_size = 1.0

    def note(self, now: float, size: int) -> None:
        """One request of ``size`` items arrived at ``now``."""
        if self._last is not None:
            gap = now - self._last
            # A plain average until there are 1/GAP_WEIGHT gaps, then the running mean: the first
            # gap alone would set the rate (and so the cap) far off for the next few dozen.
            self._gaps_seen += 1
            weight = max(GAP_WEIGHT, 1.0 / self._gaps_seen)
            if math.isinf(self._mean_gap):
                self._mean_gap = gap
            else:
                self._mean_gap += weight * (gap - self._mean_gap)
            self._mean_size += weight * (size - self._mean_size)
        else:
            self._mean_size = float(size)
        self._last = now

    def items_rate(self, now: float) -> float:
        """Items per second arriving recently (0 before two arrivals); a silence since the last
        arrival longer than the mean gap lowers it."""
        if self._last is None or math.isinf(self._mean_gap):
            return 0.0
        return self._mean_size * arrival_rate(self._mean_gap, now - self._last, GAP_WEIGHT)
