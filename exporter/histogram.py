"""A cumulative histogram as an immutable value.

The collector observes every collection into one and hands it over inside each Snapshot, so the
renderer reads a finished value instead of sharing a mutable one with the collection thread.
A gauge of the last collection shows one collection per scrape; the histogram keeps all of them,
so a slow collection between two scrapes still shows in the quantiles.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate, pairwise


@dataclass(frozen=True)
class Histogram:
    """Observations counted per bucket; ``counts`` has one more entry than ``bounds``, for the
    observations above every bound (the ``+Inf`` bucket's own share)."""

    bounds: tuple[float, ...]  # upper bounds (``le``), ascending, +Inf implied
    counts: tuple[int, ...]
    sum: float = 0.0
    count: int = 0

    @classmethod
    def empty(cls, bounds: Sequence[float]) -> Histogram:
        """No observations yet: every bucket exists at 0, so ``rate()`` over it starts at 0."""
        ordered = tuple(float(b) for b in bounds)
        if not ordered or any(a >= b for a, b in pairwise(ordered)):
            raise ValueError("histogram bounds must be given and strictly ascending")
        return cls(ordered, (0,) * (len(ordered) + 1))

    def observe(self, value: float) -> Histogram:
        """This histogram with ``value`` added; ``value`` lands in the first bucket it fits under
        (``value <= le``), as Prometheus counts."""
        index = bisect_left(self.bounds, value)
        counts = list(self.counts)
        counts[index] += 1
        return Histogram(self.bounds, tuple(counts), self.sum + value, self.count + 1)

    def cumulative(self) -> list[tuple[float, int]]:
        """``(le, observations <= le)`` for every bound and then ``+Inf``, as exposition needs."""
        return list(zip((*self.bounds, float("inf")), accumulate(self.counts), strict=True))
