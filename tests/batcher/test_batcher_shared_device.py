"""Two models' engines on one shared device, in virtual time (simulated devices, exact times)."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

from prometheus_client import CollectorRegistry

from batcher.device import SharedDevice
from batcher.engine import Batcher
from batcher.errors import Rejected
from batcher.execution import Outcome
from batcher.metrics import BatcherMetrics
from batcher.models.simulated import SimPayload, SimulatedModel
from tests.batcher.test_batcher_engine import Answer, ask


class Recorded:
    """A simulated model that records when each of its batches held the device."""

    up = True
    queues_batches = False

    def __init__(self, model: SimulatedModel, runs: list[tuple[float, float, str]], name: str):
        self.model = model
        self.runs = runs
        self.name = name

    def batch_size_for(self, items: int) -> int:
        return self.model.batch_size_for(items)

    async def execute(self, payloads: list[Any]) -> Outcome:
        loop = asyncio.get_running_loop()
        started = loop.time()
        outcome = await self.model.execute(payloads)
        self.runs.append((started, loop.time(), self.name))
        return outcome

    def close(self) -> None:
        pass


def engine(name: str, executor: Any, device: SharedDevice, slo: float) -> Batcher:
    metrics = BatcherMetrics(CollectorRegistry(), name, slo, 32)
    return Batcher(executor, max_batch_size=32, slo_seconds=slo, metrics=metrics, device=device)


async def poisson(batcher: Batcher, rate: float, seconds: float, seed: int) -> list[Answer]:
    loop = asyncio.get_running_loop()
    rng = random.Random(seed)
    end = loop.time() + seconds
    tasks = []
    i = 0
    while True:
        await asyncio.sleep(rng.expovariate(rate))
        if loop.time() >= end:
            break
        tasks.append(asyncio.create_task(ask(batcher, SimPayload(i))))
        i += 1
    return list(await asyncio.gather(*tasks))


async def burst_on_one(device_order: SharedDevice) -> tuple[list[Answer], list[Answer], list]:
    """Model b at a steady 100/s for 3.5 s; model a at 100/s with a 1,500/s burst from 1 s to
    2.5 s (about twice what the device could do for a alone at its largest batch)."""
    runs: list[tuple[float, float, str]] = []
    a = engine("a", Recorded(SimulatedModel(0.005, 0.001), runs, "a"), device_order, 0.1)
    b = engine("b", Recorded(SimulatedModel(0.004, 0.0005), runs, "b"), device_order, 0.1)
    for batcher in (a, b):
        for size in (1, 2, 4, 8, 16, 32):  # seed the cost models as a warm-up would
            for _ in range(3):
                batcher.cost.observe(size, batcher.executor.model.seconds_for(size))
        await batcher.start()

    async def bursting() -> list[Answer]:
        calm = await poisson(a, 100.0, 1.0, seed=1)
        burst = await poisson(a, 1500.0, 1.5, seed=2)
        return calm + burst + await poisson(a, 100.0, 1.0, seed=3)

    a_answers, b_answers = await asyncio.gather(bursting(), poisson(b, 100.0, 3.5, seed=4))
    await asyncio.gather(a.drain(), b.drain())
    return a_answers, b_answers, runs


def test_a_burst_on_one_model_leaves_the_other_within_its_slo(run_virtual) -> None:
    # About 2,800 requests in virtual time; bench/batcher_models.py runs the longer version.
    a_answers, b_answers, runs = run_virtual(lambda: burst_on_one(SharedDevice()))
    inside = [x for x in b_answers if x.error is None and x.latency <= 0.1]
    assert len(inside) >= 0.99 * len(b_answers)
    # The burst was real: the device could not serve it all, so a shed part of it at admission ...
    refused = [x for x in a_answers if isinstance(x.error, Rejected)]
    assert len(refused) > 0.2 * len(a_answers)
    # ... and every other request of a was answered with its result.
    served = [x for x in a_answers if x.error is None]
    assert len(served) + len(refused) == len(a_answers)
    assert all(x.result == x.id for x in served)
    # One batch at a time on the device, whichever model's.
    ordered = sorted(runs)
    assert all(prev[1] <= nxt[0] + 1e-12 for prev, nxt in itertools.pairwise(ordered))
    assert {name for _, _, name in runs} == {"a", "b"}


def test_a_lone_model_takes_its_own_device_without_waiting(run_virtual) -> None:
    async def main() -> tuple[bool, Batcher]:
        device = SharedDevice()
        batcher = engine("solo", SimulatedModel(0.010, 0.001), device, 0.2)
        await batcher.start()
        answer = await ask(batcher, SimPayload(7))
        await batcher.drain()
        return answer.error is None and answer.latency == 0.011, batcher

    immediate, batcher = run_virtual(main)
    assert immediate  # 10 ms + 1 ms: no wait for a device nobody else uses
    assert batcher.device.models == ("solo",)


def test_the_device_is_granted_by_deadline_when_both_are_within_their_share(run_virtual) -> None:
    async def main() -> list[str]:
        device = SharedDevice()
        for name in ("holder", "late", "early"):
            device.join(name)
        assert device.try_take("holder")
        order: list[str] = []

        async def wait(name: str, deadline: float) -> None:
            await device.take(name, best_effort=False, deadline=deadline)
            order.append(name)
            device.release(name)

        waiters = [asyncio.create_task(wait("late", 2.0)), asyncio.create_task(wait("early", 1.0))]
        await asyncio.sleep(0.01)
        assert order == [] and not device.try_take("late")  # held: nobody else runs
        device.release("holder")
        await asyncio.gather(*waiters)
        return order

    assert run_virtual(main) == ["early", "late"]


def test_a_cancelled_wait_leaves_the_device_to_the_others(run_virtual) -> None:
    async def main() -> list[str]:
        device = SharedDevice()
        for name in ("holder", "gone", "next"):
            device.join(name)
        assert device.try_take("holder")
        order: list[str] = []

        async def wait(name: str, deadline: float) -> None:
            await device.take(name, best_effort=False, deadline=deadline)
            order.append(name)
            device.release(name)

        gone = asyncio.create_task(wait("gone", 1.0))
        waiting = asyncio.create_task(wait("next", 2.0))
        await asyncio.sleep(0.01)
        gone.cancel()
        await asyncio.sleep(0.01)
        device.release("holder")
        await waiting
        assert gone.cancelled()
        assert device.try_take("gone")  # free again once everyone is done
        return order

    assert run_virtual(main) == ["next"]


def test_a_model_that_leaves_frees_the_device(run_virtual) -> None:
    async def main() -> bool:
        device = SharedDevice()
        device.join("a")
        device.join("b")
        assert device.try_take("a")
        device.leave("a")
        return device.try_take("b") and device.models == ("b",)

    assert run_virtual(main)
