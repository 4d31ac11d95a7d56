"""The engine's gauges are read at scrape time, and the counters found through cached label
children are the series they always were: what a scrape shows mid-batch and after, in virtual
time against a simulated device."""

from __future__ import annotations

import asyncio

from prometheus_client import CollectorRegistry

from batcher.engine import Batcher
from batcher.metrics import BatcherMetrics
from batcher.models.simulated import SimPayload, SimulatedModel


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float | None:
    return registry.get_sample_value(f"autoglm_batcher_{name}", {"model": "sim", **labels})


def test_a_scrape_sees_the_queue_and_the_running_batch_as_they_are_now(run_virtual) -> None:
    registry = CollectorRegistry()
    batcher = Batcher(
        SimulatedModel(0.05, 0.0),
        max_batch_size=8,
        slo_seconds=1.0,
        metrics=BatcherMetrics(registry, "sim", 1.0, 8),
    )
    seen: dict[str, float | None] = {}

    async def main() -> None:
        await batcher.start()
        first = asyncio.create_task(batcher.submit(SimPayload(0)))
        await asyncio.sleep(0.01)  # the first request runs alone (light load)
        rest = [
            asyncio.create_task(batcher.submit(SimPayload(i, size=2), size=2)) for i in range(1, 4)
        ]
        await asyncio.sleep(0.01)  # they wait while the first batch runs
        for name in ("in_flight_requests", "queue_items", "queue_requests", "batch_cap_items"):
            seen[name] = sample(registry, name)
        seen["cap"] = batcher.cap
        await asyncio.gather(first, *rest)
        for name in ("in_flight_requests", "queue_items", "queue_requests"):
            seen[f"{name} after"] = sample(registry, name)
        await batcher.drain(1.0)

    run_virtual(main)
    assert seen["in_flight_requests"] == 1
    assert seen["queue_requests"] == 3
    assert seen["queue_items"] == 6
    assert seen["batch_cap_items"] == seen["cap"]
    assert seen["in_flight_requests after"] == 0
    assert seen["queue_items after"] == 0
    assert seen["queue_requests after"] == 0
    assert sample(registry, "requests_total", outcome="ok") == 4
    assert sample(registry, "class_requests_total", **{"class": "online", "outcome": "ok"}) == 4
    assert sample(registry, "class_batch_size_count", **{"class": "online"}) == 2
    assert sample(registry, "class_busy_seconds_total", **{"class": "online"}) == 0.1


def test_refusals_count_under_their_reason_and_as_rejected(run_virtual) -> None:
    registry = CollectorRegistry()
    batcher = Batcher(
        SimulatedModel(0.05, 0.0),
        max_batch_size=1,
        max_queue=1,
        slo_seconds=1.0,
        metrics=BatcherMetrics(registry, "sim", 1.0, 1),
    )

    async def main() -> list[object]:
        await batcher.start()
        tasks = [asyncio.create_task(batcher.submit(SimPayload(i))) for i in range(4)]
        answers = await asyncio.gather(*tasks, return_exceptions=True)
        await batcher.drain(1.0)
        return answers

    answers = run_virtual(main)
    refused = sum(isinstance(a, Exception) for a in answers)
    assert refused >= 1
    assert sample(registry, "rejections_total", reason="queue_full") == refused
    assert sample(registry, "requests_total", outcome="rejected") == refused
    assert sample(registry, "requests_total", outcome="ok") == 4 - refused
