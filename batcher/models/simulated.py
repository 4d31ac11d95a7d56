"""A simulated device with a known batch cost, for tests and for trying policies without torch.

Execution takes exactly ``fixed + per_item * items`` seconds of the event loop's clock (so under a
virtual-time loop it takes no real time), or the time a per-size table gives (to mimic devices
whose cost is not monotone in the batch size, as CPU BLAS kernels are), optionally times seeded
random jitter. It pads to ``buckets`` when given, can be told to run out of memory above a size,
and fails batches holding a payload marked ``fail``. Results echo each payload's ``id`` so a test
can check that every request got its own answer exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from batcher.execution import Outcome, run_guarded
from batcher.memory import bucket_size


@dataclass(frozen=True)
class SimPayload:
    """One simulated request: its identity, its item count, and whether it breaks the model."""

    id: int
    size: int = 1
    fail: bool = False


class SimulatedModel:
    """A :class:`~batcher.execution.BatchExecutor` whose cost is t(b) = fixed + per_item·b.

    ``costs`` (seconds by executed size) overrides the line for the sizes it names; ``jitter``
    multiplies each batch's time by a seeded log-normal factor of that spread.
    """

    def __init__(
        self,
        fixed_seconds: float,
        per_item_seconds: float,
        oom_above: int | None = None,
        *,
        costs: Mapping[int, float] | None = None,
        jitter: float = 0.0,
        seed: int = 0,
    ) -> None:
        self.fixed_seconds = fixed_seconds
        self.per_item_seconds = per_item_seconds
        self.oom_above = oom_above
        self.costs = dict(costs or {})
        self.jitter = jitter
        self.slowdown = 1.0
        self.buckets: Sequence[int] | None = None
        self.executed: list[list[int]] = []  # ids per executed batch, in order
        self.executed_sizes: list[int] = []  # rows per executed batch, after padding
        self._rng = random.Random(seed)

    def seconds_for(self, items: int) -> float:
        """Noise-free time of a batch of ``items`` rows."""
        base = self.costs.get(items, self.fixed_seconds + self.per_item_seconds * items)
        return base * self.slowdown

    up = True
    queues_batches = False  # a batch sleeps its time out: two at once would overlap

    def batch_size_for(self, items: int) -> int:
        return bucket_size(items, self.buckets) if self.buckets else items

    async def execute(self, payloads: list[Any]) -> Outcome:
        items = self.batch_size_for(sum(p.size for p in payloads))
        seconds = self.seconds_for(items)
        if self.jitter:
            seconds *= self._rng.lognormvariate(0.0, self.jitter)
        await asyncio.sleep(seconds)
        self.executed.append([p.id for p in payloads])
        self.executed_sizes.append(items)
        outcome = run_guarded(self._compute, payloads, None)
        return dataclasses.replace(outcome, seconds=seconds)

    def _compute(self, payloads: list[SimPayload]) -> list[int]:
        items = self.batch_size_for(sum(p.size for p in payloads))
        if self.oom_above is not None and items > self.oom_above:
            raise torch.cuda.OutOfMemoryError(
                f"CUDA out of memory. Tried to allocate {items} items (simulated limit "
                f"{self.oom_above})"
            )
        broken = [p.id for p in payloads if p.fail]
        if broken:
            raise ValueError(f"simulated model error on request {broken[0]}")
        return [p.id for p in payloads]

    def close(self) -> None:
        """Nothing to release."""
