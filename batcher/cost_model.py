"""Online estimate of how long a batch of ``b`` items takes: t(b) = c + a·b, learned while serving.

Why a line: on accelerators (and on CPUs for memory-bound layers) a batch costs a fixed part
(weights read, kernel launches, Python) plus a part per item, so the time grows much more slowly
than ``b``. The runtime needs two answers from it: when to start a batch so that the oldest request
still meets its deadline, and how large a batch can be before it alone eats the latency budget.
Both must err on the slow side, so :meth:`CostModel.estimate` adds a margin of a few standard
deviations of recent residuals to the fitted line.

Each batch size keeps an exponentially weighted mean (so the fit follows drift: thermal limits, a
co-tenant arriving), and the line is a weighted least-squares fit through those means. A size not
seen for ``FORGET_AFTER`` batches is forgotten: after the device slows down or speeds up, stale
means of sizes no longer executed would otherwise tilt the line and hold the cap where it was.
With a single size known, the conservative guess for larger batches is proportional scaling, an
upper bound for any sublinear cost; it lets the cap grow step by step and learn the line again.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

MEAN_WEIGHT = 0.2  # weight of a new observation in a size's running mean
RESIDUAL_WEIGHT = 0.1  # weight of a new squared residual in the running variance
MAX_FIT_WEIGHT = 20  # a size's weight in the fit saturates at this many observations
MARGIN_STDDEVS = 3.0
FORGET_AFTER = 100  # batches


@dataclass
class _SizeStats:
    mean: float
    count: int
    last_seen: int


class CostModel:
    """Fit of batch execution time against batch size, updated after every batch."""

    def __init__(self, margin_stddevs: float = MARGIN_STDDEVS) -> None:
        self._sizes: dict[int, _SizeStats] = {}
        self._variance = 0.0
        self._margin = margin_stddevs
        self._fixed = 0.0
        self._per_item = 0.0
        self._observations = 0

    @property
    def known(self) -> bool:
        """Whether at least one batch was observed; before that estimates are 0."""
        return bool(self._sizes)

    @property
    def fixed_seconds(self) -> float:
        """The fitted c: the cost of a batch regardless of its size."""
        return self._fixed

    @property
    def per_item_seconds(self) -> float:
        """The fitted a: the cost each extra item adds."""
        return self._per_item

    @property
    def stddev_seconds(self) -> float:
        """Recent spread of observed times around the fit."""
        return math.sqrt(self._variance)

    def observe(self, size: int, seconds: float) -> None:
        """Learn from one executed batch of ``size`` items that took ``seconds``."""
        if size < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        if self._sizes:
            residual = seconds - self.mean(size)
            self._variance += RESIDUAL_WEIGHT * (residual * residual - self._variance)
        self._observations += 1
        stats = self._sizes.get(size)
        if stats is None:
            self._sizes[size] = _SizeStats(mean=seconds, count=1, last_seen=self._observations)
        else:
            stats.mean += MEAN_WEIGHT * (seconds - stats.mean)
            stats.count += 1
            stats.last_seen = self._observations
        for stale in [
            b for b, s in self._sizes.items() if self._observations - s.last_seen > FORGET_AFTER
        ]:
            del self._sizes[stale]
        self._refit()

    def mean(self, size: int) -> float:
        """Best guess of the time for ``size`` items (0 before any observation)."""
        if not self._sizes:
            return 0.0
        if len(self._sizes) == 1:
            ((seen, stats),) = self._sizes.items()
            return stats.mean * max(1.0, size / seen)
        return self._fixed + self._per_item * size

    def estimate(self, size: int) -> float:
        """Conservative time for ``size`` items: the fit plus a margin for noise."""
        if not self._sizes:
            return 0.0
        guess = self.mean(size) + self._margin * self.stddev_seconds
        stats = self._sizes.get(size)
        if stats is not None:
            guess = max(guess, stats.mean)
        return guess

    def largest_within(self, budget_seconds: float, limit: int) -> int:
        """Largest size up to ``limit`` whose conservative estimate fits ``budget_seconds``.

        Returns ``limit`` when nothing is known yet and at least 1 even when nothing fits.
        """
        if not self._sizes:
            return limit
        low, high = 1, limit
        if self.estimate(high) <= budget_seconds:
            return high
        while low < high:
            mid = (low + high + 1) // 2
            if self.estimate(mid) <= budget_seconds:
                low = mid
            else:
                high = mid - 1
        return low

    def _refit(self) -> None:
        if len(self._sizes) < 2:
            ((_, stats),) = self._sizes.items()
            self._fixed, self._per_item = stats.mean, 0.0
            return
        weights = {b: float(min(s.count, MAX_FIT_WEIGHT)) for b, s in self._sizes.items()}
        total = sum(weights.values())
        mean_b = sum(w * b for b, w in weights.items()) / total
        mean_t = sum(w * self._sizes[b].mean for b, w in weights.items()) / total
        spread = sum(w * (b - mean_b) ** 2 for b, w in weights.items())
        covariance = sum(
            w * (b - mean_b) * (self._sizes[b].mean - mean_t) for b, w in weights.items()
        )
        slope = max(0.0, covariance / spread)
        self._per_item = slope
        self._fixed = max(0.0, mean_t - slope * mean_b)
