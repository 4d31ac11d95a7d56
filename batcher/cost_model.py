"""How long a batch of ``b`` items takes, learned while serving: a per-size table over a line.

The runtime needs three answers: when to start a batch so that its oldest request still meets its
deadline, how large a batch may be before it alone eats the latency budget, and which size gives
the most items per second. Real devices are not always a line: on CPUs the BLAS picks slow kernels
for some small row counts (8 rows can cost more than 16), and on GPUs tile quantisation makes
steps. So the model keeps a table of measured sizes (an exponentially weighted mean each, so it
follows drift: thermal limits, a co-tenant arriving) and uses a fitted line t(b) = c + a·b only as
the prior for sizes it has not measured. The start-up warm-up (:mod:`batcher.warmup`) fills the
table before the first request, so the first minutes are not spent learning.

Answers that guard a deadline must err on the slow side, so :meth:`CostModel.estimate` adds a
margin of a few relative standard deviations of the noise, measured as the spread of repeated
observations of the same size around that size's own mean (a line through a non-monotone table
would count its own misfit as noise and inflate every estimate).

A size not executed for ``FORGET_AFTER`` batches is stale: the line is fitted on recent sizes only,
and a stale entry counts as the lower of its old mean and the line. After the device speeds up, a
stale slow entry would otherwise never be chosen again and so never corrected; after it slows
down, the optimistic stale entry gets chosen, runs, and is corrected. Stale entries are still
worth keeping: a line fitted on the small sizes of a quiet period extrapolates badly to the large
ones. The line's shape is kept when fewer than two recent sizes remain, scaled through the one
measured; with no shape yet, the guess for larger batches is proportional scaling, an upper bound
for any sublinear cost.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

MEAN_WEIGHT = 0.2  # weight of a new observation in a size's running mean
NOISE_WEIGHT = 0.05  # weight of a new squared relative deviation in the running noise variance
MAX_FIT_WEIGHT = 20  # a size's weight in the line fit saturates at this many observations
MARGIN_STDDEVS = 3.0
FORGET_AFTER = 30  # batches


@dataclass
class _SizeStats:
    mean: float
    count: int
    last_seen: int


class CostModel:
    """Per-size execution times with a fitted line as the prior, updated after every batch."""

    def __init__(self, margin_stddevs: float = MARGIN_STDDEVS) -> None:
        self._sizes: dict[int, _SizeStats] = {}
        self._noise_variance = 0.0
        self._margin = margin_stddevs
        self._fixed = 0.0
        self._per_item = 0.0
        self._shape: tuple[float, float] | None = None  # last (c, a) fitted from >= 2 sizes
        self._proportional: tuple[int, float] | None = None  # (size, mean) while nothing else
        self._observations = 0

    @property
    def known(self) -> bool:
        """Whether at least one batch was observed; before that estimates are 0."""
        return bool(self._sizes)

    @property
    def fitted(self) -> bool:
        """Whether a line was ever fitted (two sizes or more observed).

        Before it, a size never seen is guessed proportional to the one seen: an upper bound for
        a sublinear model, fine for sizing batches but too pessimistic to refuse anyone with.
        """
        return self._shape is not None

    @property
    def fixed_seconds(self) -> float:
        """The prior's c: the cost of a batch regardless of its size."""
        return self._fixed

    @property
    def per_item_seconds(self) -> float:
        """The prior's a: the cost each extra item adds."""
        return self._per_item

    @property
    def relative_noise(self) -> float:
        """Recent spread of repeated observations of one size, as a fraction of its mean."""
        return math.sqrt(self._noise_variance)

    def measured(self) -> dict[int, float]:
        """The table: the current guess for every size measured so far, by size."""
        return {b: self.mean(b) for b in sorted(self._sizes)}

    def observe(self, size: int, seconds: float) -> None:
        """Learn from one executed batch of ``size`` items that took ``seconds``."""
        if size < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        self._observations += 1
        stats = self._sizes.get(size)
        if stats is None:
            self._sizes[size] = _SizeStats(mean=seconds, count=1, last_seen=self._observations)
        else:
            if stats.mean > 0:
                deviation = (seconds - stats.mean) / stats.mean
                self._noise_variance += NOISE_WEIGHT * (deviation**2 - self._noise_variance)
            if not self._fresh(stats):  # its old mean may predate a change of speed
                stats.mean, stats.count = seconds, 0
            stats.mean += MEAN_WEIGHT * (seconds - stats.mean)
            stats.count += 1
            stats.last_seen = self._observations
        self._refit()

    def mean(self, size: int) -> float:
        """Best guess of the time for ``size`` items (0 before any observation).

        A size measured recently: its mean. Never measured: the prior. Measured long ago: the
        lower of its old mean and the prior, so a stale entry can only be optimistic, gets
        chosen, runs and is corrected (a stale pessimistic one would never run again).
        """
        if not self._sizes:
            return 0.0
        stats = self._sizes.get(size)
        if stats is not None and self._fresh(stats):
            return stats.mean
        prior = self._prior(size)
        return prior if stats is None else min(stats.mean, prior)

    def estimate(self, size: int, stddevs: float | None = None) -> float:
        """Conservative time for ``size`` items: the best guess plus ``stddevs`` of noise.

        ``stddevs`` defaults to the model's margin (for deadlines).
        """
        margin = self._margin if stddevs is None else stddevs
        return self.mean(size) * (1.0 + margin * self.relative_noise)

    def largest_within(
        self, budget_seconds: float, limit: int, stddevs: float | None = None
    ) -> int:
        """Largest size up to ``limit`` whose estimate fits ``budget_seconds`` (at least 1).

        A binary search: it assumes time grows with size, true of the prior and of any table
        that padding has made monotone. Returns ``limit`` when nothing is known yet.
        """
        if not self._sizes:
            return limit
        low, high = 1, limit
        while low < high:
            mid = (low + high + 1) // 2
            if self.estimate(mid, stddevs) <= budget_seconds:
                low = mid
            else:
                high = mid - 1
        return low

    def best_size(
        self,
        budget_seconds: float,
        limit: int,
        allowed: Sequence[int] | None = None,
        stddevs: float | None = None,
    ) -> int:
        """The size up to ``limit`` with the most items per second whose estimate fits the budget.

        ``allowed`` restricts the choice to the padding buckets (other sizes are padded up to one
        of them anyway), judged one by one: the table may say a larger bucket is cheaper. None
        allows every size; the most efficient is then the largest that fits, since time grows
        more slowly than size. Before anything is known: ``limit``. When nothing fits: the
        smallest candidate, so the runtime still serves.
        """
        if allowed is None:
            return self.largest_within(budget_seconds, limit, stddevs)
        candidates = sorted({b for b in allowed if b <= limit}) or [min(limit, *allowed)]
        if not self._sizes:
            return candidates[-1]
        best, best_rate = candidates[0], -1.0
        for size in candidates:
            if self.estimate(size, stddevs) > budget_seconds:
                continue
            seconds = self.mean(size)
            rate = math.inf if seconds <= 0 else size / seconds
            if rate > best_rate:
                best, best_rate = size, rate
        return best

    def smallest_serving(
        self, items_per_second: float, limit: int, allowed: Sequence[int] | None = None
    ) -> int:
        """The smallest size up to ``limit`` whose expected time serves ``items_per_second``.

        ``allowed`` restricts the choice to the padding buckets. ``limit`` when no size is fast
        enough or nothing is known yet.
        """
        if not self._sizes:
            return limit
        candidates = sorted({b for b in allowed if b <= limit}) if allowed else range(1, limit + 1)
        for size in candidates:
            seconds = self.mean(size)
            if seconds <= 0 or size / seconds >= items_per_second:
                return size
        return limit

    def _fresh(self, stats: _SizeStats) -> bool:
        return self._observations - stats.last_seen <= FORGET_AFTER

    def _prior(self, size: int) -> float:
        if self._proportional is not None:
            seen, seconds = self._proportional
            return seconds * max(1.0, size / seen)
        return self._fixed + self._per_item * size

    def _refit(self) -> None:
        fresh = {b: s for b, s in self._sizes.items() if self._fresh(s)}
        self._proportional = None
        if len(fresh) == 1:
            ((size, stats),) = fresh.items()
            if self._shape is None:
                self._fixed, self._per_item = stats.mean, 0.0
                self._proportional = (size, stats.mean)
                return
            fixed, per_item = self._shape
            at_size = fixed + per_item * size
            scale = stats.mean / at_size if at_size > 0 else 1.0
            self._fixed, self._per_item = fixed * scale, per_item * scale
            return
        weights = {b: float(min(s.count, MAX_FIT_WEIGHT)) for b, s in fresh.items()}
        total = sum(weights.values())
        mean_b = sum(w * b for b, w in weights.items()) / total
        mean_t = sum(w * fresh[b].mean for b, w in weights.items()) / total
        spread = sum(w * (b - mean_b) ** 2 for b, w in weights.items())
        covariance = sum(w * (b - mean_b) * (fresh[b].mean - mean_t) for b, w in weights.items())
        slope = max(0.0, covariance / spread)
        self._per_item = slope
        self._fixed = max(0.0, mean_t - slope * mean_b)
        self._shape = (self._fixed, self._per_item)
