"""The spread of one request's service time: its moments, its formula and the exported gauge."""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest
from prometheus_client import CollectorRegistry

from batcher.cost_model import CostModel
from batcher.engine import Batcher
from batcher.metrics import BatcherMetrics
from batcher.models.simulated import SimPayload, SimulatedModel
from batcher.service_spread import RequestSizes, service_scv


def fitted_cost(fixed: float, per_item: float) -> CostModel:
    """A cost model that has seen exact batch times at two sizes (no jitter)."""
    cost = CostModel()
    for _ in range(3):
        for size in (1, 8):
            cost.observe(size, fixed + per_item * size)
    return cost


def test_sizes_keep_a_plain_mean_and_variance_at_first() -> None:
    sizes = RequestSizes()
    assert (sizes.mean, sizes.variance) == (0.0, 0.0)
    for items in (1, 1, 4, 2):
        sizes.observe(items)
    assert sizes.mean == pytest.approx(2.0)
    assert sizes.variance == pytest.approx(np.var([1, 1, 4, 2]))


def test_a_mix_of_sizes_spreads_service_as_the_cost_line_says() -> None:
    cost = fitted_cost(0.02, 0.01)
    sizes = RequestSizes()
    mix = [1, 1, 1, 8] * 10
    for items in mix:
        sizes.observe(items)
    seconds = 0.02 + 0.01 * np.array(mix)
    assert cost.relative_noise == 0
    assert service_scv(cost, sizes) == pytest.approx(np.var(seconds) / np.mean(seconds) ** 2)


def test_equal_sizes_on_a_steady_device_have_no_spread() -> None:
    sizes = RequestSizes()
    for _ in range(20):
        sizes.observe(3)
    assert service_scv(fitted_cost(0.02, 0.01), sizes) == pytest.approx(0.0, abs=1e-12)
    assert service_scv(CostModel(), RequestSizes()) == 0.0  # nothing known yet


def test_jitter_of_batch_times_adds_its_square() -> None:
    cost = fitted_cost(0.02, 0.01)
    for k in range(40):  # repeated size-8 batches 10% either side of their mean
        cost.observe(8, 0.1 * (1.1 if k % 2 else 0.9))
    sizes = RequestSizes()
    sizes.observe(8)
    noise = cost.relative_noise
    assert noise > 0.05
    assert service_scv(cost, sizes) == pytest.approx(noise**2)


def test_the_batcher_exports_the_spread_of_its_online_requests(run_virtual) -> None:
    """Online requests of 1 and 8 items on a device with t(b) = 10 ms + 2 ms/item: the gauge
    SLO sizing reads is the spread of 12 ms and 26 ms requests, not 0."""
    registry = CollectorRegistry()

    async def main() -> None:
        metrics = BatcherMetrics(registry, "sim", 0.5, 32)
        batcher = Batcher(
            SimulatedModel(0.010, 0.002), max_batch_size=32, slo_seconds=0.5, metrics=metrics
        )
        await batcher.start()
        rng = random.Random(5)
        tasks = []
        for i in range(400):
            await asyncio.sleep(rng.expovariate(40.0))
            size = 8 if i % 4 == 0 else 1
            payload = SimPayload(i, size=size)
            tasks.append(asyncio.create_task(batcher.submit(payload, size=size)))
        await asyncio.gather(*tasks)
        await batcher.drain()

    run_virtual(main)
    exported = registry.get_sample_value("autoglm_batcher_service_time_scv", {"model": "sim"})
    seconds = 0.010 + 0.002 * np.array([8, 1, 1, 1])
    assert exported == pytest.approx(np.var(seconds) / np.mean(seconds) ** 2, rel=0.35)
