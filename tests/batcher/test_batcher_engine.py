"""The engine against a simulated device with a known t(b), in virtual time.

Arrivals are seeded Poisson processes; the loop's clock is virtual (see conftest), so latencies
below are exact simulated times, not measurements of this machine.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from dataclasses import dataclass

import pytest
from prometheus_client import CollectorRegistry

from batcher.engine import Batcher
from batcher.errors import (
    DrainTimedOut,
    InvalidRequest,
    ModelFailed,
    OutOfMemory,
    Rejected,
    RequestTimedOut,
    ShuttingDown,
)
from batcher.metrics import BatcherMetrics
from batcher.models.simulated import SimPayload, SimulatedModel
from batcher.policy import FixedDelayPolicy


@dataclass
class Answer:
    id: int
    arrival: float
    finished: float
    result: object = None
    error: Exception | None = None

    @property
    def latency(self) -> float:
        return self.finished - self.arrival


def make(model: SimulatedModel, **kwargs) -> Batcher:
    kwargs.setdefault("max_batch_size", 32)
    kwargs.setdefault("slo_seconds", 0.2)
    metrics = BatcherMetrics(
        CollectorRegistry(), "sim", kwargs["slo_seconds"], kwargs["max_batch_size"]
    )
    return Batcher(model, metrics=metrics, **kwargs)


async def ask(batcher: Batcher, payload: SimPayload, **kwargs) -> Answer:
    loop = asyncio.get_running_loop()
    arrival = loop.time()
    try:
        result = await batcher.submit(payload, size=payload.size, **kwargs)
    except Exception as exc:
        return Answer(payload.id, arrival, loop.time(), error=exc)
    return Answer(payload.id, arrival, loop.time(), result=result)


async def poisson(
    batcher: Batcher, rate: float, count: int, seed: int, first_id: int = 0, **kwargs
) -> list[Answer]:
    rng = random.Random(seed)
    tasks = []
    for i in range(count):
        await asyncio.sleep(rng.expovariate(rate))
        tasks.append(asyncio.create_task(ask(batcher, SimPayload(first_id + i), **kwargs)))
    return list(await asyncio.gather(*tasks))


def rejections(batcher: Batcher) -> dict[str, float]:
    return {
        reason: batcher.metrics.rejections.labels("sim", reason)._value.get()
        for reason in ("queue_full", "past_deadline", "shutting_down")
    }


def outcomes(batcher: Batcher) -> dict[str, float]:
    return {
        outcome: batcher.metrics.requests.labels("sim", outcome)._value.get()
        for outcome in ("ok", "model_error", "out_of_memory", "timeout", "rejected", "shutdown")
    }


def test_deadlines_met_and_batches_grow_under_poisson_load(run_virtual) -> None:
    # t(b) = 10 ms + 1 ms/item: one at a time serves 90/s, batches of 32 serve 760/s.
    model = SimulatedModel(0.010, 0.001)

    async def main() -> tuple[list[Answer], Batcher]:
        batcher = make(model, max_batch_size=32, slo_seconds=0.2)
        await batcher.start()
        answers = await poisson(batcher, rate=400.0, count=2000, seed=7)
        await batcher.drain()
        return answers, batcher

    answers, batcher = run_virtual(main)
    assert all(a.error is None for a in answers)
    assert [a.result for a in answers] == [a.id for a in answers]
    assert max(a.latency for a in answers) <= 0.2
    assert 2000 / batcher.batches > 4  # 400/s is far above what unbatched service could do
    assert outcomes(batcher)["ok"] == 2000
    assert batcher.metrics.slo_misses._value.get() == 0


def test_light_load_is_served_without_waiting_for_a_batch(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001)

    async def main() -> list[Answer]:
        batcher = make(model, slo_seconds=1.0)
        await batcher.start()
        answers = await poisson(batcher, rate=0.5, count=20, seed=3)
        await batcher.drain()
        return answers

    answers = run_virtual(main)
    # One request every two seconds: nobody to batch with, so each runs at once (10 ms + 1 ms).
    assert max(a.latency for a in answers) == pytest.approx(0.011)


def test_overload_is_refused_at_once_and_accepted_requests_keep_their_deadline(
    run_virtual,
) -> None:
    model = SimulatedModel(0.010, 0.001)

    async def main() -> tuple[list[Answer], Batcher]:
        batcher = make(model, max_batch_size=32, slo_seconds=0.2, max_queue=64)
        await batcher.start()
        answers = await poisson(batcher, rate=3000.0, count=3000, seed=11)
        await batcher.drain()
        return answers, batcher

    answers, batcher = run_virtual(main)
    refused = [a for a in answers if isinstance(a.error, Rejected)]
    served = [a for a in answers if a.error is None]
    assert refused and served
    assert len(refused) + len(served) == len(answers)
    assert all(a.latency == 0 for a in refused)
    assert all("queue" in str(a.error) for a in refused)
    assert [a.result for a in served] == [a.id for a in served]
    counts = outcomes(batcher)
    assert counts["rejected"] == len(refused)
    assert counts["ok"] == len(served)
    assert rejections(batcher)["queue_full"] == len(refused)


def linear_device() -> SimulatedModel:
    return SimulatedModel(0.030, 0.0025)  # peak 32 rows / 110 ms = 290.9/s


async def load_linear(rate: float, refuse_past_slo: bool, **kwargs) -> tuple[list[Answer], Batcher]:
    """3000 seeded Poisson requests on the linear device, SLO 0.6 s: the answers, the batcher."""
    batcher = make(linear_device(), slo_seconds=0.6, refuse_past_slo=refuse_past_slo)
    await batcher.start()
    answers = await poisson(batcher, rate=rate, count=3000, seed=5, **kwargs)
    await batcher.drain()
    return answers, batcher


def p99(latencies: list[float]) -> float:
    return sorted(latencies)[int(0.99 * len(latencies)) - 1]


def test_over_the_peak_slo_admission_refuses_the_doomed_and_the_rest_meet_the_slo(
    run_virtual,
) -> None:
    # 1.1x the peak: whatever the batching, a backlog grows and every request behind it is late.
    answers, batcher = run_virtual(lambda: load_linear(1.1 * 290.9, refuse_past_slo=True))
    served = [a for a in answers if a.error is None]
    refused = [a for a in answers if a.error is not None]
    assert len(served) + len(refused) == 3000  # every request answered, none lost
    assert [a.result for a in served] == [a.id for a in served]  # each its own answer, once
    assert all(isinstance(a.error, Rejected) and a.latency == 0 for a in refused)
    assert all(a.error.reason == "past_deadline" for a in refused)
    assert all("latency SLO" in str(a.error) for a in refused)
    # About the excess over the peak is refused (9% at steady state), and no more than that.
    assert 0.03 * 3000 < len(refused) < 0.1 * 3000
    assert max(a.latency for a in served) <= 0.6  # exact: the device's times are known
    assert outcomes(batcher)["rejected"] == len(refused) == rejections(batcher)["past_deadline"]
    assert outcomes(batcher)["ok"] == len(served)

    unrefused, _ = run_virtual(lambda: load_linear(1.1 * 290.9, refuse_past_slo=False))
    assert all(a.error is None for a in unrefused)
    assert p99([a.latency for a in unrefused]) > 2 * 0.6  # served, but far past the SLO


def test_at_light_load_slo_admission_refuses_nothing(run_virtual) -> None:
    answers, batcher = run_virtual(lambda: load_linear(0.5 * 290.9, refuse_past_slo=True))
    assert all(a.error is None for a in answers)
    assert sum(rejections(batcher).values()) == 0


def test_a_request_with_its_own_long_timeout_is_not_refused_by_the_slo(run_virtual) -> None:
    # The same overload, every request with a 10 s timeout of its own (a batch client): it
    # tolerates late answers, so the SLO rule leaves it alone and all are served.
    answers, batcher = run_virtual(
        lambda: load_linear(1.1 * 290.9, refuse_past_slo=True, timeout=10.0)
    )
    assert all(a.error is None for a in answers)
    assert max(a.latency for a in answers) > 0.6
    assert sum(rejections(batcher).values()) == 0


def test_cap_backs_off_when_the_model_slows_and_grows_back(run_virtual) -> None:
    # t(b) = 5 ms + 2 ms/item, SLO 100 ms: a batch may take 40 ms, so about 17 items.
    model = SimulatedModel(0.005, 0.002)
    caps: dict[str, int] = {}

    async def main() -> None:
        batcher = make(model, max_batch_size=64, slo_seconds=0.1, max_queue=4096)
        await batcher.start()
        await poisson(batcher, rate=300.0, count=1500, seed=1)
        caps["fast"] = batcher.cap
        model.slowdown = 3.0
        await poisson(batcher, rate=60.0, count=600, seed=2, first_id=10_000)
        caps["slow"] = batcher.cap
        model.slowdown = 1.0
        await poisson(batcher, rate=300.0, count=1500, seed=3, first_id=20_000)
        caps["fast_again"] = batcher.cap
        await batcher.drain()

    run_virtual(main)
    assert caps["slow"] < caps["fast"]
    assert caps["fast_again"] > caps["slow"]
    assert caps["fast"] <= 64


def test_higher_priority_is_dispatched_first(run_virtual) -> None:
    model = SimulatedModel(0.050, 0.001)

    async def main() -> list[Answer]:
        batcher = make(model, max_batch_size=5, slo_seconds=2.0, priority_levels=2)
        await batcher.start()
        blocker = asyncio.create_task(ask(batcher, SimPayload(0)))
        await asyncio.sleep(0.001)  # the blocker is running; everything else queues behind it
        tasks = [
            asyncio.create_task(ask(batcher, SimPayload(i), priority=1 if i % 2 else 2))
            for i in range(1, 21)
        ]
        answers = [await blocker, *await asyncio.gather(*tasks)]
        await batcher.drain()
        return answers

    answers = run_virtual(main)
    assert all(a.error is None for a in answers)
    order = [i for batch in model.executed for i in batch]
    high = [i for i in order if i % 2 == 1]
    low = [i for i in order if i != 0 and i % 2 == 0]
    assert max(order.index(i) for i in high) < min(order.index(i) for i in low)


def test_request_that_cannot_start_in_time_times_out_or_is_refused(run_virtual) -> None:
    model = SimulatedModel(0.5, 0.0)

    async def main() -> tuple[Answer, Answer, Answer]:
        batcher = make(model, slo_seconds=5.0)
        await batcher.start()
        first = asyncio.create_task(ask(batcher, SimPayload(0)))
        await asyncio.sleep(0.01)
        # Nothing is known about the model yet, so this one is accepted and then expires.
        unknown = await ask(batcher, SimPayload(1), timeout=0.1)
        await first
        # Now t(1) = 0.5 s is known: a 0.1 s timeout behind a running batch is refused at once.
        running = asyncio.create_task(ask(batcher, SimPayload(2)))
        await asyncio.sleep(0.01)
        refused = await ask(batcher, SimPayload(3), timeout=0.1)
        await running
        await batcher.drain()
        return unknown, refused, await running

    unknown, refused, served = run_virtual(main)
    assert isinstance(unknown.error, RequestTimedOut)
    assert unknown.latency == pytest.approx(0.1)
    assert isinstance(refused.error, Rejected)
    assert refused.latency == 0
    assert served.result == 2


def test_out_of_memory_splits_retries_and_answers_everyone_once(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001, oom_above=8)

    async def main() -> tuple[list[Answer], Batcher]:
        batcher = make(model, max_batch_size=32, slo_seconds=1.0)
        await batcher.start()
        blocker = asyncio.create_task(ask(batcher, SimPayload(0)))
        await asyncio.sleep(0.001)
        payloads = [SimPayload(i, size=10 if i == 13 else 1) for i in range(1, 31)]
        tasks = [asyncio.create_task(ask(batcher, p)) for p in payloads]
        answers = [await blocker, *await asyncio.gather(*tasks)]
        await batcher.drain()
        return answers, batcher

    answers, batcher = run_virtual(main)
    too_big = [a for a in answers if a.id == 13]
    others = [a for a in answers if a.id != 13]
    assert isinstance(too_big[0].error, OutOfMemory)
    assert all(a.error is None and a.result == a.id for a in others)
    assert batcher.metrics.ooms._value.get() >= 1
    assert batcher.metrics.splits._value.get() >= 1
    assert batcher.cap <= 8
    counts = outcomes(batcher)
    assert counts["ok"] == len(others) and counts["out_of_memory"] == 1
    assert sum(counts.values()) == len(answers)


def test_model_error_fails_only_its_batch(run_virtual) -> None:
    model = SimulatedModel(0.050, 0.001)

    async def main() -> list[Answer]:
        batcher = make(model, max_batch_size=4, slo_seconds=2.0)
        await batcher.start()
        blocker = asyncio.create_task(ask(batcher, SimPayload(0)))
        await asyncio.sleep(0.001)
        payloads = [SimPayload(i, fail=(i == 2)) for i in range(1, 9)]
        tasks = [asyncio.create_task(ask(batcher, p)) for p in payloads]
        answers = [await blocker, *await asyncio.gather(*tasks)]
        await batcher.drain()
        return answers

    answers = run_virtual(main)
    failed = {a.id for a in answers if a.error is not None}
    assert failed == {1, 2, 3, 4}  # the batch holding request 2, and nothing else
    assert all(isinstance(a.error, ModelFailed) for a in answers if a.id in failed)
    assert all("simulated model error on request 2" in str(a.error) for a in answers if a.error)
    assert all(a.result == a.id for a in answers if a.id not in failed)


def test_drain_finishes_queued_and_running_work_then_refuses(run_virtual) -> None:
    model = SimulatedModel(0.020, 0.002)

    async def main() -> tuple[list[Answer], bool, Exception | None, dict[str, float]]:
        batcher = make(model, max_batch_size=8, slo_seconds=1.0)
        await batcher.start()
        tasks = [asyncio.create_task(ask(batcher, SimPayload(i))) for i in range(50)]
        await asyncio.sleep(0.005)  # one batch running, the rest queued
        drained = await batcher.drain()
        answers = list(await asyncio.gather(*tasks))
        late = await ask(batcher, SimPayload(99))
        return answers, drained, late.error, rejections(batcher)

    answers, drained, late_error, refused = run_virtual(main)
    assert drained
    assert [a.result for a in answers] == list(range(50))
    assert isinstance(late_error, ShuttingDown)
    assert refused == {"queue_full": 0, "past_deadline": 0, "shutting_down": 1}


def test_drain_timeout_answers_what_is_left(run_virtual) -> None:
    model = SimulatedModel(0.100, 0.0)

    async def main() -> tuple[list[Answer], bool]:
        batcher = make(model, max_batch_size=2, slo_seconds=10.0)
        await batcher.start()
        tasks = [asyncio.create_task(ask(batcher, SimPayload(i))) for i in range(20)]
        await asyncio.sleep(0.001)
        drained = await batcher.drain(timeout=0.25)
        return list(await asyncio.gather(*tasks)), drained

    answers, drained = run_virtual(main)
    assert not drained
    kinds = Counter(type(a.error).__name__ if a.error else "ok" for a in answers)
    assert set(kinds) == {"ok", DrainTimedOut.__name__}
    assert kinds["ok"] >= 4 and sum(kinds.values()) == 20


def test_utilization_cap_leaves_the_device_idle_for_co_tenants(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001)
    spans: dict[str, float] = {}

    async def main() -> None:
        batcher = make(model, max_batch_size=32, slo_seconds=1.0, utilization_cap=0.5)
        await batcher.start()
        loop = asyncio.get_running_loop()
        start = loop.time()
        await poisson(batcher, rate=1000.0, count=2000, seed=5)
        spans["elapsed"] = loop.time() - start
        spans["busy"] = batcher.metrics.busy_seconds._value.get()
        await batcher.drain()

    run_virtual(main)
    assert spans["busy"] <= 0.5 * spans["elapsed"] + 0.05  # + one batch at the edge


def test_fixed_delay_baseline_waits_its_delay_regardless_of_slo(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001)

    async def main() -> list[Answer]:
        batcher = make(
            model,
            slo_seconds=1.0,
            policy=FixedDelayPolicy(max_delay=0.05, preferred=32),
            adaptive_cap=False,
        )
        await batcher.start()
        answers = await poisson(batcher, rate=0.5, count=5, seed=3)
        await batcher.drain()
        return answers

    answers = run_virtual(main)
    assert all(a.latency == pytest.approx(0.05 + 0.011) for a in answers)


def test_bad_priority_and_oversized_requests_are_invalid(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001)

    async def main() -> list[Answer]:
        # 3 is neither an online level (1..2) nor best-effort (from 4 up)
        batcher = make(model, max_batch_size=4, priority_levels=2, best_effort_priority=4)
        await batcher.start()
        answers = [
            await ask(batcher, SimPayload(1), priority=3),
            await ask(batcher, SimPayload(2, size=5)),
            await ask(batcher, SimPayload(3), timeout=0.0),
        ]
        await batcher.drain()
        return answers

    answers = run_virtual(main)
    assert all(isinstance(a.error, InvalidRequest) for a in answers)
    assert "priority 3" in str(answers[0].error)
    assert "1..4 items" in str(answers[1].error)


class FlakyExecutor(SimulatedModel):
    """A device whose executor breaks once (not the model: the machinery around it)."""

    def __init__(self) -> None:
        super().__init__(0.010, 0.001)
        self.broken = True

    async def execute(self, payloads):
        if self.broken:
            self.broken = False
            raise OSError("executor lost its worker")
        return await super().execute(payloads)


def test_a_broken_executor_fails_that_batch_and_the_engine_keeps_serving(run_virtual) -> None:
    model = FlakyExecutor()

    async def main() -> tuple[Answer, Answer]:
        batcher = make(model)
        await batcher.start()
        first = await ask(batcher, SimPayload(1))
        second = await ask(batcher, SimPayload(2))
        await batcher.drain()
        return first, second

    first, second = run_virtual(main)
    assert isinstance(first.error, ModelFailed) and "executor lost its worker" in str(first.error)
    assert second.result == 2
