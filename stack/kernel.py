"""The simulated kernel time of the stack's demo model, ``t(b) = FIXED_SECONDS + PER_ITEM_SECONDS
x b``, and the largest batch worth giving it (kept free of torch, so the stack can size its
workers without importing the model).

A batch that takes longer than the SLO makes every request in it late, so the workers' largest
batch is the largest power of two whose kernel fits inside the SLO. It also shortens each
worker's start: the batcher's warm-up times every power of two up to the largest batch before it
serves, and on this per-item cost the sizes past the SLO are most of that time (a worker that
starts late leaves the fleet short while its GPU is paid, the demo's main loss of SLO and busy
time).
"""

from __future__ import annotations

FIXED_SECONDS = 0.004
PER_ITEM_SECONDS = 0.02
MAX_BATCH = 32  # the batcher's default largest batch: a long SLO gets no more than that


def kernel_seconds(items: int) -> float:
    """Wall time a batch of ``items`` holds a worker."""
    return FIXED_SECONDS + PER_ITEM_SECONDS * items


def largest_batch_within(slo_seconds: float) -> int:
    """The largest power of two up to ``MAX_BATCH`` whose kernel fits inside ``slo_seconds``
    (at least 1: one item cannot be cut)."""
    size = 1
    while size * 2 <= MAX_BATCH and kernel_seconds(size * 2) <= slo_seconds:
        size *= 2
    return size
