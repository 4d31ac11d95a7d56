"""A simulated device with a known batch cost, for tests and for trying policies without torch.

Execution takes exactly ``fixed + per_item * items`` seconds of the event loop's clock (so under a
virtual-time loop it takes no real time), can be told to run out of memory above a size, and fails
batches holding a payload marked ``fail``. Results echo each payload's ``id`` so a test can check
that every request got its own answer exactly once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from batcher.execution import Outcome, run_guarded


@dataclass(frozen=True)
class SimPayload:
    """One simulated request: its identity, its item count, and whether it breaks the model."""

    id: int
    size: int = 1
    fail: bool = False


class SimulatedModel:
    """A :class:`~batcher.execution.BatchExecutor` whose cost is t(b) = fixed + per_item·b."""

    def __init__(
        self,
        fixed_seconds: float,
        per_item_seconds: float,
        oom_above: int | None = None,
    ) -> None:
        self.fixed_seconds = fixed_seconds
        self.per_item_seconds = per_item_seconds
        self.oom_above = oom_above
        self.slowdown = 1.0
        self.executed: list[list[int]] = []  # ids per executed batch, in order

    def seconds_for(self, items: int) -> float:
        return (self.fixed_seconds + self.per_item_seconds * items) * self.slowdown

    def batch_size_for(self, items: int) -> int:
        return items

    async def execute(self, payloads: list[Any]) -> Outcome:
        items = sum(p.size for p in payloads)
        seconds = self.seconds_for(items)
        await asyncio.sleep(seconds)
        self.executed.append([p.id for p in payloads])
        outcome = run_guarded(self._compute, payloads, None)
        return dataclasses.replace(outcome, seconds=seconds)

    def _compute(self, payloads: list[SimPayload]) -> list[int]:
        items = sum(p.size for p in payloads)
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
