"""Between two batches: the device should go from one to the next with as little idle as the
serving path allows, and say how much it idled while work waited."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from batcher.engine import Batcher
from batcher.execution import Outcome
from batcher.metrics import BatcherMetrics
from batcher.models.simulated import SimPayload, SimulatedModel
from batcher.policy import FixedDelayPolicy


class HeldExecutor:
    """Runs batches at once, except the first, which waits for ``release``; records each batch
    sent with how many requests had been answered by then (``answered``)."""

    up = True

    def __init__(self) -> None:
        self.events: list[str] = []
        self.release = asyncio.Event()
        self.answered = lambda: 0

    def batch_size_for(self, items: int) -> int:
        return items

    async def execute(self, payloads: list[object]) -> Outcome:
        self.events.append(f"batch of {len(payloads)} sent, {self.answered()} answered")
        if len(self.events) == 1:
            await self.release.wait()
        return Outcome(results=list(payloads), seconds=0.001)

    def close(self) -> None:
        pass


def metrics(cap: int) -> BatcherMetrics:
    return BatcherMetrics(CollectorRegistry(), "sim", 0.5, cap)


def gap_count(batcher: Batcher, cause: str = "turnaround") -> tuple[float | None, ...]:
    """(seconds, batches) the dispatch gap histogram holds for ``cause``."""
    registry = batcher.metrics.registry
    name = "autoglm_batcher_dispatch_gap_seconds"
    labels = {"model": "sim", "cause": cause}
    return tuple(registry.get_sample_value(name + part, labels) for part in ("_sum", "_count"))


def test_the_next_batch_is_sent_before_the_last_one_is_answered() -> None:
    """Answering a batch (futures, metrics) waits until the next batch is on its way: the device
    does not sit idle through that per-request work."""
    executor = HeldExecutor()

    async def main() -> list[str]:
        batcher = Batcher(executor, max_batch_size=4, slo_seconds=0.5, metrics=metrics(4))
        executor.answered = lambda: int(
            batcher.metrics.registry.get_sample_value(
                "autoglm_batcher_requests_total", {"model": "sim", "outcome": "ok"}
            )
            or 0
        )
        await batcher.start()

        async def ask(i: int) -> None:
            await batcher.submit(i)

        first = [asyncio.create_task(ask(i)) for i in range(4)]
        while not executor.events:  # the first batch (full) is running
            await asyncio.sleep(0.001)
        second = [asyncio.create_task(ask(i)) for i in range(4, 8)]
        await asyncio.sleep(0.01)  # the second batch's requests wait in the queue
        executor.release.set()
        await asyncio.gather(*first, *second)
        await batcher.drain()
        return executor.events

    assert asyncio.run(main()) == ["batch of 4 sent, 0 answered", "batch of 4 sent, 0 answered"]


def test_the_dispatch_gap_counts_the_idle_only_when_work_waited(run_virtual) -> None:
    """A burst of three full batches: two starts found their requests waiting (idle 0 in
    virtual time, where answering takes no time). Requests that come one by one, after the
    device freed, are not a gap of the serving path."""
    model = SimulatedModel(0.010, 0.001)

    async def burst() -> Batcher:
        batcher = Batcher(model, max_batch_size=8, slo_seconds=0.5, metrics=metrics(8))
        await batcher.start()
        await asyncio.gather(*(batcher.submit(SimPayload(i)) for i in range(24)))
        await batcher.drain()
        return batcher

    assert gap_count(run_virtual(burst)) == (0.0, 2.0)

    async def one_by_one() -> Batcher:
        batcher = Batcher(model, max_batch_size=8, slo_seconds=0.5, metrics=metrics(8))
        await batcher.start()
        for i in range(5):
            await batcher.submit(SimPayload(i))
            await asyncio.sleep(0.1)
        await batcher.drain()
        return batcher

    batcher = run_virtual(one_by_one)
    assert batcher.batches == 5 and gap_count(batcher) == (0.0, 0.0)


def test_a_gap_the_policy_chose_to_fill_a_batch_is_told_apart(run_virtual) -> None:
    """Triton-style fixed delay: a batch of 3 waits 50 ms for company while a full one runs;
    the wait after the device freed is the policy's (filling), not the serving path's."""
    model = SimulatedModel(0.010, 0.001)

    async def main() -> Batcher:
        batcher = Batcher(
            model,
            max_batch_size=8,
            slo_seconds=0.5,
            metrics=metrics(8),
            policy=FixedDelayPolicy(max_delay=0.05, preferred=8),
            adaptive_cap=False,
        )
        await batcher.start()
        await asyncio.gather(*(batcher.submit(SimPayload(i)) for i in range(11)))
        await batcher.drain()
        return batcher

    batcher = run_virtual(main)
    seconds, count = gap_count(batcher, "filling")
    assert count == 1 and 0.03 < seconds < 0.05  # 50 ms after arrival, less the 18 ms batch
    assert gap_count(batcher, "turnaround") == (0.0, 0.0)
