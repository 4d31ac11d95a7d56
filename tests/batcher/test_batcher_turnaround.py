"""Between two batches: the device should go from one to the next with as little idle as the
serving path allows, and say how much it idled while work waited."""

from __future__ import annotations

import asyncio
import threading

from prometheus_client import CollectorRegistry

from batcher.device import SharedDevice
from batcher.engine import Batcher
from batcher.execution import Outcome, ThreadExecutor
from batcher.metrics import BatcherMetrics
from batcher.models.simulated import SimPayload, SimulatedModel
from batcher.policy import FixedDelayPolicy


class HeldExecutor:
    """Runs batches at once, except the first, which waits for ``release``; records each batch
    sent with how many requests had been answered by then (``answered``)."""

    up = True
    queues_batches = False

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


def metrics(cap: int, model: str = "sim") -> BatcherMetrics:
    return BatcherMetrics(CollectorRegistry(), model, 0.5, cap)


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


class GatedThreadExecutor(ThreadExecutor):
    """A worker thread whose batches each wait for the test to open their gate; records when
    batches are sent and run."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.gates: list[threading.Event] = [threading.Event() for _ in range(8)]
        self.ran = 0
        super().__init__(self._run)

    def send(self, payloads: list[object]) -> asyncio.Future[Outcome]:
        self.events.append(f"sent {payloads[0]}..{payloads[-1]}")
        return super().send(payloads)

    def _run(self, payloads: list[object]) -> list[object]:
        gate = self.gates[self.ran]
        self.ran += 1
        gate.wait(10.0)  # bounded: a failing test must not hang the worker
        return payloads


def test_the_next_batch_is_sent_while_the_running_one_still_runs() -> None:
    """With an executor that queues batches, the next batch waits on the device before the
    running one ends: the device goes on to it without waiting for the loop to decide."""
    executor = GatedThreadExecutor()
    for gate in executor.gates[:3]:
        gate.set()  # three batches that fit the cost model

    async def main() -> list[str]:
        batcher = Batcher(executor, max_batch_size=4, slo_seconds=1.0, metrics=metrics(4))
        await batcher.start()
        for first in (0, 4, 8):
            await asyncio.gather(*(batcher.submit(i) for i in range(first, first + 4)))
        held = [asyncio.ensure_future(batcher.submit(i)) for i in range(12, 16)]
        while len(executor.events) < 4:  # batch 12..15 is running, held at its gate
            await asyncio.sleep(0.001)
        queued = [asyncio.ensure_future(batcher.submit(i)) for i in range(16, 20)]
        for _ in range(5000):  # its look-ahead comes within the batch's expected time
            if len(executor.events) == 5:
                break
            await asyncio.sleep(0.001)
        events = list(executor.events)
        executor.gates[3].set()
        executor.gates[4].set()
        answers = await asyncio.gather(*held, *queued)
        assert answers == list(range(12, 20))
        await batcher.drain()
        return events

    events = asyncio.run(main())
    assert events[3:] == ["sent 12..15", "sent 16..19"]  # 16..19 sent while 12..15 was held


def test_only_a_device_of_its_own_with_a_queueing_executor_looks_ahead() -> None:
    async def main() -> dict[str, bool]:
        plain = Batcher(ThreadExecutor(lambda p: p), metrics=metrics(32))
        capped = Batcher(ThreadExecutor(lambda p: p), utilization_cap=0.5, metrics=metrics(32))
        shared_device = SharedDevice()
        shared = Batcher(ThreadExecutor(lambda p: p), device=shared_device, metrics=metrics(32))
        Batcher(ThreadExecutor(lambda p: p), device=shared_device, metrics=metrics(32, "other"))
        simulated = Batcher(SimulatedModel(0.01, 0.001), metrics=metrics(32))
        return {
            "online": plain._looks_ahead(best_effort=False),
            "best-effort": plain._looks_ahead(best_effort=True),
            "utilization cap": capped._looks_ahead(best_effort=False),
            "shared device": shared._looks_ahead(best_effort=False),
            "one batch at a time": simulated._looks_ahead(best_effort=False),
        }

    assert asyncio.run(main()) == {
        "online": True,
        "best-effort": False,
        "utilization cap": False,
        "shared device": False,
        "one batch at a time": False,
    }
