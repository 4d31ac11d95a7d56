"""How much one online request's service time varies: the spread SLO sizing needs beside the mean.

The controller's SLO sizing (:mod:`autoscaler.core.slo_sizing`) models service by the batch cost
line ``t(b) = c + a*b``. Told nothing about the spread, it takes every request to cost the mean,
and a fleet sized so leaves its largest requests outside the SLO. Two things spread a request's
time, and the batcher sees both:

* requests hold different numbers of items: served alone, one of ``k`` items takes ``t(k)``;
* repeated batches of one size jitter (the cost model's relative noise: a co-tenant, clocks).

For independent sizes and a multiplicative jitter ``e`` (mean 0, variance ``noise**2``) the time
``t(k) * (1 + e)`` has the squared coefficient of variation

    scv = (1 + Var t(k) / E[t(k)]**2) * (1 + noise**2) - 1

which is what :func:`service_scv` returns and the batcher exports as
``autoglm_batcher_service_time_scv``. The sizes are running moments (a plain mean for the first
``1/SIZE_WEIGHT`` requests, then exponentially weighted), so the figure follows a changing mix.
"""

from __future__ import annotations

from batcher.cost_model import CostModel

SIZE_WEIGHT = 0.01  # weight of a new request in the running moments of its size


class RequestSizes:
    """Running mean and variance of the items per online request."""

    def __init__(self) -> None:
        self._mean = 0.0
        self._mean_square = 0.0
        self._seen = 0

    def observe(self, items: int) -> None:
        """Count one online request of ``items`` items."""
        self._seen += 1
        weight = max(SIZE_WEIGHT, 1.0 / self._seen)
        self._mean += weight * (items - self._mean)
        self._mean_square += weight * (items * items - self._mean_square)

    @property
    def mean(self) -> float:
        """Mean items per request (0 before the first)."""
        return self._mean

    @property
    def variance(self) -> float:
        """Variance of the items per request (0 before the second)."""
        return max(0.0, self._mean_square - self._mean * self._mean)


def service_scv(cost: CostModel, sizes: RequestSizes) -> float:
    """Squared coefficient of variation of one request's service time under ``cost``.

    0 until something is known: with no fitted cost the sizes' part is unknown and left out,
    and the jitter alone counts.
    """
    mean_seconds = cost.fixed_seconds + cost.per_item_seconds * sizes.mean
    size_part = 0.0
    if mean_seconds > 0:
        size_part = cost.per_item_seconds**2 * sizes.variance / mean_seconds**2
    return (1.0 + size_part) * (1.0 + cost.relative_noise**2) - 1.0
