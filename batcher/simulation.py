"""Running the engine in simulated time: a virtual-clock event loop and seeded Poisson load.

Why: comparing batching policies on a real machine measures the machine as much as the policy
(a loaded CPU, a noisy neighbour). Against a :class:`~batcher.models.simulated.SimulatedModel` with
a known t(b), in virtual time, a rate sweep is exact, deterministic for a seed and takes no real
time, so it shows the policy's maths alone. The tests and ``bench/batcher.py`` both use it.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, TypeVar

import numpy as np

from batcher.engine import Batcher
from batcher.errors import BatcherError
from batcher.models.simulated import SimPayload, SimulatedModel
from batcher.warmup import choose_buckets, padding_tolerance, warmup_sizes

T = TypeVar("T")

if TYPE_CHECKING:
    from collections import deque

    class _SchedulingEventLoop(asyncio.SelectorEventLoop):
        """The scheduler state CPython's event loop keeps, which typeshed leaves out as private:
        what :class:`VirtualTimeLoop` reads to know whether it may jump its clock."""

        _ready: deque[asyncio.Handle]
        _scheduled: list[asyncio.TimerHandle]

        def _run_once(self) -> None: ...

else:
    _SchedulingEventLoop = asyncio.SelectorEventLoop


class VirtualTimeLoop(_SchedulingEventLoop):
    """An event loop whose clock jumps to the next timer whenever nothing is ready to run.

    The engine reads time only through its loop, so under this loop a simulated model that
    "takes" 50 ms costs no real time, runs are deterministic for a given seed, and deadlines are
    checked against exact simulated times instead of a loaded machine's wall clock. Only for
    code that does no real I/O and starts no threads (nothing could wake the loop from outside).
    """

    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def _run_once(self) -> None:
        if not self._ready and self._scheduled:
            upcoming = [h.when() for h in self._scheduled if not h.cancelled()]
            if upcoming:
                self._virtual_now = max(self._virtual_now, min(upcoming))
        super()._run_once()


def run_in_virtual_time(main: Callable[[], Awaitable[T]]) -> T:
    """Run an async function to completion on a fresh :class:`VirtualTimeLoop`."""
    loop = VirtualTimeLoop()
    try:
        return loop.run_until_complete(main())
    finally:
        loop.close()


@dataclass(frozen=True)
class LoadPoint:
    """What one open-loop run at one offered rate gave."""

    rate: float
    sent: int
    ok: int
    errors: int
    throughput: float  # answered successfully per second
    p50: float  # seconds; a failed request counts as infinitely late
    p99: float
    mean_batch: float  # items per executed batch (before padding)

    def sustained(self, slo_seconds: float) -> bool:
        """p99 within the SLO and at most 1% of requests failed."""
        return self.p99 <= slo_seconds and self.errors <= 0.01 * self.sent


def summarize(
    rate: float, latencies: list[float], errors: int, elapsed: float, mean_batch: float
) -> LoadPoint:
    """A :class:`LoadPoint` from per-request latencies of the successful requests."""
    padded = sorted(latencies) + [math.inf] * errors
    p50 = float(np.percentile(padded, 50, method="higher")) if padded else math.inf
    p99 = float(np.percentile(padded, 99, method="higher")) if padded else math.inf
    throughput = len(latencies) / elapsed if elapsed > 0 else 0.0
    return LoadPoint(rate, len(padded), len(latencies), errors, throughput, p50, p99, mean_batch)


async def poisson_load(batcher: Batcher, rate: float, count: int, seed: int) -> tuple[list, int]:
    """Send ``count`` one-item requests at seeded Poisson times; (OK latencies, failures)."""
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    latencies: list[float] = []
    failures = 0

    async def one(i: int) -> None:
        nonlocal failures
        sent = loop.time()
        try:
            await batcher.submit(SimPayload(i))
        except BatcherError:
            failures += 1
            return
        latencies.append(loop.time() - sent)

    tasks = []
    for i in range(count):
        await asyncio.sleep(rng.expovariate(rate))
        tasks.append(asyncio.create_task(one(i)))
    await asyncio.gather(*tasks)
    return latencies, failures


def simulate_point(
    make: Callable[[], tuple[Batcher, SimulatedModel]],
    rate: float,
    count: int,
    seed: int,
    warmup_repeats: int = 5,
) -> LoadPoint:
    """One open-loop run on a fresh batcher and device, in virtual time.

    The batcher is warmed up as the server does it (timing the device at start-up and padding to
    the buckets that measurement picks), unless ``warmup_repeats`` is 0.
    """

    async def main() -> LoadPoint:
        batcher, device = make()
        if warmup_repeats:
            measured = await batcher.calibrate(
                lambda items: [SimPayload(-1, size=items)],
                warmup_sizes(batcher.max_batch_size),
                warmup_repeats,
            )
            tolerance = padding_tolerance(batcher.cost.relative_noise, warmup_repeats)
            device.buckets = choose_buckets("auto", False, (), False, measured, tolerance)
        await batcher.start()
        loop = asyncio.get_running_loop()
        start = loop.time()
        batches_before = len(device.executed)
        latencies, failures = await poisson_load(batcher, rate, count, seed)
        elapsed = loop.time() - start
        await batcher.drain()
        served = device.executed[batches_before:]
        mean_batch = sum(len(b) for b in served) / len(served) if served else 0.0
        return summarize(rate, latencies, failures, elapsed, mean_batch)

    return run_in_virtual_time(main)
