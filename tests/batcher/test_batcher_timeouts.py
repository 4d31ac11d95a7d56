"""Requests that cannot start within their timeout, in virtual time: each is answered at its own
expiry, in any order of arrival, while those that start in time are served, with the engine's one
expiry timer standing in for a timer per request."""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry

from batcher.engine import Batcher
from batcher.errors import RequestTimedOut
from batcher.metrics import BatcherMetrics
from batcher.models.simulated import SimPayload, SimulatedModel


async def timed(batcher: Batcher, payload: SimPayload, **kwargs) -> tuple[float, object]:
    """(seconds until answered, the result or the error)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        result: object = await batcher.submit(payload, **kwargs)
    except Exception as exc:
        result = exc
    return loop.time() - start, result


def test_each_waiting_request_times_out_at_its_own_expiry(run_virtual) -> None:
    registry = CollectorRegistry()
    batcher = Batcher(
        SimulatedModel(1.0, 0.0),  # t(1) unknown at first: nothing is refused at admission
        max_batch_size=1,
        slo_seconds=10.0,
        metrics=BatcherMetrics(registry, "sim", 10.0, 1),
    )

    async def main() -> dict[str, tuple[float, object]]:
        await batcher.start()
        running = asyncio.create_task(timed(batcher, SimPayload(0)))
        await asyncio.sleep(0.01)  # the device is busy until t = 1.0
        names = {"late": 0.3, "soonest": 0.1, "middle": 0.2, "in time": 2.0, "cancelled": 0.5}
        tasks = {
            name: asyncio.create_task(timed(batcher, SimPayload(i + 1), timeout=timeout))
            for i, (name, timeout) in enumerate(names.items())
        }
        await asyncio.sleep(0.05)
        tasks["cancelled"].cancel()
        answers = {"running": await running}
        for name, task in tasks.items():
            if name != "cancelled":
                answers[name] = await task
        await batcher.drain(5.0)
        return answers

    answers = run_virtual(main)
    for name, timeout in (("soonest", 0.1), ("middle", 0.2), ("late", 0.3)):
        seconds, error = answers[name]
        assert isinstance(error, RequestTimedOut), name
        assert seconds == pytest.approx(timeout)
        assert f"timeout of {timeout:.3f} s" in str(error)
    assert answers["running"][1] == 0
    assert answers["in time"][1] == 4  # started when the device freed, before its 2 s expiry
    sample = registry.get_sample_value
    assert sample("autoglm_batcher_requests_total", {"model": "sim", "outcome": "timeout"}) == 3
    assert sample("autoglm_batcher_requests_total", {"model": "sim", "outcome": "cancelled"}) == 1
    assert sample("autoglm_batcher_requests_total", {"model": "sim", "outcome": "ok"}) == 2
