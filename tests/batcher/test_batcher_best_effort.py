"""The best-effort class in the engine, against a simulated device in virtual time.

Latencies and busy fractions here are exact simulated times (see conftest), so the assertions are
about the scheduling rules, not this machine's speed.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import Counter

import numpy as np
import pytest

from batcher.engine import Batcher
from batcher.errors import DrainTimedOut, Rejected, RequestTimedOut, ShuttingDown
from batcher.models.simulated import SimPayload, SimulatedModel
from batcher.server import http_status
from tests.batcher.test_batcher_engine import Answer, ask, make, poisson

BE_IDS = 1_000_000


def online(batcher: Batcher, outcome: str) -> float:
    return batcher.metrics.requests.labels("sim", outcome)._value.get()


def by_class(batcher: Batcher, request_class: str, outcome: str) -> float:
    return batcher.metrics.class_requests.labels("sim", request_class, outcome)._value.get()


def refusals(batcher: Batcher, reason: str) -> float:
    return batcher.metrics.best_effort_refusals.labels("sim", reason)._value.get()


def busy(batcher: Batcher, request_class: str) -> float:
    return batcher.metrics.class_busy_seconds.labels("sim", request_class)._value.get()


async def best_effort_job(
    batcher: Batcher, clients: int, stop: asyncio.Event, answers: list[Answer]
) -> list[asyncio.Task]:
    """Closed-loop best-effort clients that never run dry; a refusal waits its Retry-After."""

    async def client(c: int) -> None:
        i = 0
        while not stop.is_set():
            payload = SimPayload(BE_IDS + c * 100_000 + i)
            answer = await ask(batcher, payload, priority="best-effort")
            answers.append(answer)
            i += 1
            if isinstance(answer.error, Rejected):
                await asyncio.sleep(answer.error.retry_after)

    return [asyncio.create_task(client(c)) for c in range(clients)]


def run_mixed(run_virtual, rate: float, with_job: bool, seconds: float = 10.0) -> dict:
    """Online Poisson load for ``seconds``, alone or beside a saturating best-effort job."""
    model = SimulatedModel(0.010, 0.001, jitter=0.1, seed=1)

    async def main() -> dict:
        batcher = make(model, max_batch_size=32, slo_seconds=0.2)
        await batcher.start()
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()
        job: list[Answer] = []
        clients = await best_effort_job(batcher, 16, stop, job) if with_job else []
        start = loop.time()
        answers = await poisson(batcher, rate=rate, count=int(rate * seconds), seed=5)
        elapsed = loop.time() - start
        stop.set()
        await asyncio.gather(*clients)
        await batcher.drain()
        latencies = [a.latency for a in answers if a.error is None]
        return {
            "p99": float(np.percentile(latencies, 99, method="higher")),
            "online_errors": [a for a in answers if a.error is not None],
            "online_ok": len(latencies),
            "busy": batcher.metrics.busy_seconds._value.get() / elapsed,
            "quantum": batcher.quantum,
            "job": job,
            "batcher": batcher,
        }

    return run_virtual(main)


@pytest.mark.parametrize("rate", [60.0, 200.0])
def test_online_p99_beside_a_saturating_job_stays_within_one_quantum(run_virtual, rate) -> None:
    alone = run_mixed(run_virtual, rate, with_job=False)
    mixed = run_mixed(run_virtual, rate, with_job=True)
    assert mixed["p99"] <= alone["p99"] + mixed["quantum"]
    assert alone["busy"] < 0.8  # idle capacity to fill...
    assert mixed["busy"] >= 0.95  # ...and the job fills it
    assert not alone["online_errors"] and not mixed["online_errors"]
    served = [a for a in mixed["job"] if a.error is None]
    assert served and all(a.result == a.id for a in served)
    batcher = mixed["batcher"]
    # best-effort requests stay out of the online series
    assert online(batcher, "ok") == mixed["online_ok"]
    latency_sum = batcher.metrics.registry.get_sample_value(
        "autoglm_batcher_request_latency_seconds_sum", {"model": batcher.metrics.model}
    )
    assert latency_sum is not None and latency_sum > 0
    assert by_class(batcher, "best_effort", "ok") == len(served)
    assert busy(batcher, "best_effort") > 0
    assert busy(batcher, "online") + busy(batcher, "best_effort") == pytest.approx(
        batcher.metrics.busy_seconds._value.get()
    )


def test_an_online_request_waits_at_most_one_quantum_for_best_effort_work(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001)

    async def main() -> list[Answer]:
        batcher = make(model, max_batch_size=32, slo_seconds=0.2)
        await batcher.start()
        await ask(batcher, SimPayload(0))
        await ask(batcher, SimPayload(1, size=2))
        stop = asyncio.Event()
        clients = await best_effort_job(batcher, 40, stop, [])  # more than a quantum's batch
        answers = []
        rng = random.Random(4)
        for i in range(30):  # lone online requests at random moments inside best-effort batches
            await asyncio.sleep(rng.uniform(0.05, 0.15))
            answers.append(await ask(batcher, SimPayload(10 + i)))
        stop.set()
        await asyncio.gather(*clients)
        await batcher.drain()
        return answers

    answers = run_virtual(main)
    assert all(a.error is None for a in answers)
    one_item = model.seconds_for(1)
    # the rest of the best-effort batch in flight (within the 20 ms quantum), then its own
    assert max(a.latency for a in answers) <= 0.02 + one_item + 1e-9
    assert max(a.latency for a in answers) > one_item  # it did meet best-effort work


def test_best_effort_is_served_on_an_idle_device_in_quantum_sized_batches(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001)

    async def main() -> tuple[list[Answer], Batcher, int]:
        batcher = make(model, max_batch_size=32, slo_seconds=0.205)
        await batcher.start()
        await ask(batcher, SimPayload(0))  # one online request: the cost model knows t(1)
        await ask(batcher, SimPayload(1, size=2))  # and t(2): a line
        limit = batcher.best_effort_batch_limit()
        stop = asyncio.Event()
        answers: list[Answer] = []
        clients = await best_effort_job(batcher, 8, stop, answers)
        await asyncio.sleep(2.0)
        stop.set()
        await asyncio.gather(*clients)
        await batcher.drain()
        return answers, batcher, limit

    answers, batcher, limit = run_virtual(main)
    # quantum 20.5 ms (a tenth of the SLO) and t(b) = 10 ms + 1 ms b: ten items
    assert batcher.quantum == pytest.approx(0.0205)
    assert limit == 10
    served = [a for a in answers if a.error is None]
    assert len(served) > 100
    assert all(a.result == a.id for a in served)
    assert max(model.executed_sizes[2:]) <= limit
    assert online(batcher, "ok") == 2
    assert batcher.metrics.slo_misses._value.get() == 0
    assert by_class(batcher, "best_effort", "ok") == len(served)
    assert batcher.metrics.best_effort_quantum._value.get() == pytest.approx(0.0205)


def test_share_falls_to_zero_when_the_slack_is_gone_and_grows_back(run_virtual, caplog) -> None:
    model = SimulatedModel(0.010, 0.001)
    caplog.set_level(logging.INFO, logger="batcher.engine")

    async def main() -> dict:
        batcher = make(model, max_batch_size=32, slo_seconds=0.2, best_effort_window_seconds=2.0)
        await batcher.start()
        seen: dict = {}
        stop = asyncio.Event()
        job: list[Answer] = []
        clients = await best_effort_job(batcher, 4, stop, job)
        await poisson(batcher, rate=20.0, count=40, seed=1)
        seen["share_before"] = batcher.controller.share
        model.slowdown = 25.0  # t(1) = 0.275 s: every online request now misses the SLO
        await poisson(batcher, rate=5.0, count=10, seed=2, first_id=100)
        seen["throttled"] = batcher.metrics.best_effort_throttled._value.get()
        seen["share_during"] = batcher.metrics.best_effort_share._value.get()
        seen["slack_during"] = batcher.metrics.online_latency_slack._value.get()
        seen["refused"] = await ask(batcher, SimPayload(-1), priority="best-effort")
        served_before = sum(1 for a in job if a.error is None)
        model.slowdown = 1.0
        await poisson(batcher, rate=20.0, count=100, seed=3, first_id=200)  # 5 s of fast online
        seen["share_after"] = batcher.controller.share
        seen["throttled_after"] = batcher.metrics.best_effort_throttled._value.get()
        stop.set()
        await asyncio.gather(*clients)
        seen["served_after"] = sum(1 for a in job if a.error is None) - served_before
        seen["job"] = job
        seen["batcher"] = batcher
        await batcher.drain()
        return seen

    seen = run_virtual(main)
    batcher = seen["batcher"]
    assert seen["share_before"] == 1.0
    assert seen["throttled"] == 1 and seen["share_during"] == 0.0
    assert seen["slack_during"] < 0
    refused = seen["refused"].error
    assert isinstance(refused, Rejected) and http_status(refused) == 429
    assert refused.reason == "throttled" and refused.retry_after > 0
    assert seen["refused"].latency == 0  # at once, never queued
    assert refusals(batcher, "throttled") >= 1
    assert seen["throttled_after"] == 0 and seen["share_after"] > 0.5
    # requests waiting when the throttle started were refused then, not left to time out
    job = seen["job"]
    shed = [a for a in job if isinstance(a.error, Rejected) and a.latency > 0]
    assert shed and all(a.error.reason == "throttled" for a in shed)
    assert not any(isinstance(a.error, RequestTimedOut) for a in job)
    assert seen["served_after"] > 0
    messages = [r.getMessage() for r in caplog.records]
    throttled = messages.index("best-effort throttled: online latency slack under the margin")
    assert "best-effort resumed: online latency slack is back" in messages[throttled:]


def test_a_full_best_effort_queue_refuses_at_once_with_retry_after(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001)

    async def main() -> tuple[list[Answer], Batcher]:
        batcher = make(model, max_batch_size=32, slo_seconds=0.2, best_effort_max_queue=8)
        await batcher.start()
        tasks = [
            asyncio.create_task(ask(batcher, SimPayload(i), priority="best-effort"))
            for i in range(50)
        ]
        answers = list(await asyncio.gather(*tasks))
        await batcher.drain()
        return answers, batcher

    answers, batcher = run_virtual(main)
    refused = [a for a in answers if a.error is not None]
    assert len(refused) == 42
    assert all(isinstance(a.error, Rejected) and a.error.reason == "queue_full" for a in refused)
    assert all(a.error.retry_after > 0 and a.latency == 0 for a in refused)
    assert sorted(a.result for a in answers if a.error is None) == list(range(8))
    assert refusals(batcher, "queue_full") == 42
    assert by_class(batcher, "best_effort", "rejected") == 42
    assert online(batcher, "rejected") == 0  # nothing of it in the online series


def test_best_effort_never_causes_an_online_rejection_under_overload(run_virtual) -> None:
    # Over the device's peak (about 760 items/s) the online queue never empties: the job gets
    # nothing, and online admission refuses exactly what it refuses without the job.
    alone = run_mixed(run_virtual, 1000.0, with_job=False, seconds=3.0)
    mixed = run_mixed(run_virtual, 1000.0, with_job=True, seconds=3.0)
    reasons = Counter(a.error.reason for a in alone["online_errors"])
    assert reasons["past_deadline"] > 0
    assert Counter(a.error.reason for a in mixed["online_errors"]) == reasons


def test_drain_answers_queued_best_effort_work_once_then_refuses(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001)

    async def main() -> tuple[list[Answer], Answer, Batcher]:
        batcher = make(model, max_batch_size=32, slo_seconds=0.2, best_effort_max_queue=64)
        await batcher.start()
        tasks = [
            asyncio.create_task(ask(batcher, SimPayload(i), priority="best-effort"))
            for i in range(40)
        ]
        tasks += [asyncio.create_task(ask(batcher, SimPayload(100 + i))) for i in range(10)]
        await asyncio.sleep(0.001)
        drained = asyncio.create_task(batcher.drain())
        await asyncio.sleep(0)
        late = await ask(batcher, SimPayload(-1), priority="best-effort")
        answers = list(await asyncio.gather(*tasks))
        assert await drained
        return answers, late, batcher

    answers, late, batcher = run_virtual(main)
    assert all(a.error is None and a.result == a.id for a in answers)
    executed = [i for batch in model.executed for i in batch]
    assert sorted(executed) == sorted(a.id for a in answers)  # each exactly once
    assert isinstance(late.error, ShuttingDown) and http_status(late.error) == 503
    assert refusals(batcher, "shutting_down") == 1


def test_drain_timeout_answers_the_best_effort_work_left(run_virtual) -> None:
    model = SimulatedModel(0.100, 0.0)

    async def main() -> list[Answer]:
        batcher = make(
            model,
            max_batch_size=4,
            slo_seconds=1.0,
            best_effort_max_queue=100,
            best_effort_quantum_seconds=0.1,
        )
        await batcher.start()
        tasks = [
            asyncio.create_task(ask(batcher, SimPayload(i), priority="best-effort"))
            for i in range(20)
        ]
        await asyncio.sleep(0.001)
        assert not await batcher.drain(timeout=0.25)
        return list(await asyncio.gather(*tasks))

    answers = run_virtual(main)
    done = [a for a in answers if a.error is None]
    timed_out = [a for a in answers if isinstance(a.error, DrainTimedOut)]
    assert done and timed_out and len(done) + len(timed_out) == 20
    executed = [i for batch in model.executed for i in batch]
    assert sorted(executed) == sorted(a.id for a in done)


def test_a_best_effort_batch_that_runs_out_of_memory_is_split_and_everyone_answered(
    run_virtual,
) -> None:
    model = SimulatedModel(0.010, 0.001, oom_above=4)

    async def main() -> tuple[list[Answer], Batcher]:
        batcher = make(
            model,
            max_batch_size=32,
            slo_seconds=0.2,
            best_effort_quantum_seconds=1.0,  # a quantum that allows the whole batch
            best_effort_max_queue=32,
        )
        await batcher.start()
        await ask(batcher, SimPayload(-1))
        await ask(batcher, SimPayload(-2, size=2))
        tasks = [
            asyncio.create_task(ask(batcher, SimPayload(i), priority="best-effort"))
            for i in range(20)
        ]
        answers = list(await asyncio.gather(*tasks))
        await batcher.drain()
        return answers, batcher

    answers, batcher = run_virtual(main)
    assert all(a.error is None and a.result == a.id for a in answers)
    # the device records failed batches too: those over its memory limit did not run
    runs = zip(model.executed, model.executed_sizes, strict=True)
    ran = Counter(i for batch, size in runs if size <= 4 for i in batch)
    assert all(ran[a.id] == 1 for a in answers)
    assert batcher.metrics.ooms._value.get() >= 1
    assert by_class(batcher, "best_effort", "ok") == 20


def test_a_best_effort_timeout_is_counted_in_its_class_only(run_virtual) -> None:
    model = SimulatedModel(0.100, 0.0)

    async def main() -> tuple[Answer, Answer, Batcher]:
        batcher = make(model, max_batch_size=4, slo_seconds=1.0)
        await batcher.start()
        running = asyncio.create_task(ask(batcher, SimPayload(0)))
        await asyncio.sleep(0.01)
        waited = await ask(batcher, SimPayload(1), priority="best-effort", timeout=0.05)
        served = await running
        await batcher.drain()
        return served, waited, batcher

    served, waited, batcher = run_virtual(main)
    assert served.error is None
    assert isinstance(waited.error, RequestTimedOut) and http_status(waited.error) == 504
    assert by_class(batcher, "best_effort", "timeout") == 1
    assert online(batcher, "timeout") == 0
    assert batcher.metrics.slo_misses._value.get() == 0
    assert batcher.online_latencies.p99(1.0) == pytest.approx(0.1)  # the online answer only
