"""The memory-aware batch cap: the footprint learned from batches, the cap, and the engine.

The rules are pure (no device); the engine runs in virtual time against a simulated device whose
batches report a known peak (fixed + per row) and a monitor that reports a chosen headroom.
"""

from __future__ import annotations

import asyncio
import dataclasses

import pytest
from prometheus_client import CollectorRegistry

from batcher.batch_sizing import BatchSizer
from batcher.engine import Batcher
from batcher.memory import BatchFootprint, MemoryMonitor, memory_cap
from batcher.metrics import BatcherMetrics
from batcher.models.simulated import SimPayload, SimulatedModel

FIXED, PER_ROW = 1_000.0, 100.0


def test_the_footprint_recovers_fixed_and_per_row_bytes_from_several_sizes() -> None:
    footprint = BatchFootprint()
    assert footprint.line() is None
    for rows in (1, 4, 16, 4):
        footprint.observe(rows, FIXED + PER_ROW * rows)
    fixed, per_row = footprint.line()
    assert fixed == pytest.approx(FIXED) and per_row == pytest.approx(PER_ROW)


def test_the_footprint_never_promises_a_measured_size_less_than_it_took() -> None:
    footprint = BatchFootprint()
    peaks = {1: 1_300.0, 2: 1_150.0, 8: 2_000.0, 16: 2_700.0}  # noisy, not on one line
    for rows, peak in peaks.items():
        footprint.observe(rows, peak)
    fixed, per_row = footprint.line()
    assert all(fixed + per_row * rows >= peak - 1e-6 for rows, peak in peaks.items())


def test_one_size_alone_says_nothing_about_other_sizes() -> None:
    footprint = BatchFootprint()
    footprint.observe(4, 2_000.0)
    footprint.observe(4, 2_100.0)
    assert footprint.line() is None
    footprint.observe(8, 2_500.0)
    assert footprint.line() == pytest.approx((1_700.0, 100.0))  # through the highest at 4


def test_the_footprint_keeps_a_bounded_number_of_sizes_and_the_extremes() -> None:
    footprint = BatchFootprint(sizes_kept=4)
    for rows in range(1, 11):
        footprint.observe(rows, FIXED + PER_ROW * rows)
    _, per_row = footprint.line()
    assert len(footprint._peaks) == 4 and {1, 10} <= set(footprint._peaks)
    assert per_row == pytest.approx(PER_ROW)


@pytest.mark.parametrize(
    ("headroom", "line", "expected"),
    [
        (None, (FIXED, PER_ROW), (32, "unlearned")),
        (5_000.0, None, (32, "unlearned")),
        (10_000.0, (FIXED, PER_ROW), (32, "fits")),
        (2_050.0, (FIXED, PER_ROW), (10, "memory")),
        (500.0, (FIXED, PER_ROW), (1, "memory")),  # not even one row: the OOM path reports it
        (500.0, (FIXED, 0.0), (1, "memory")),
        (5_000.0, (FIXED, 0.0), (32, "fits")),
    ],
)
def test_the_cap_is_the_largest_batch_the_headroom_holds(headroom, line, expected) -> None:
    assert memory_cap(headroom, line, 32) == expected


class MemoryReportingModel(SimulatedModel):
    """A simulated device whose batches report a peak of FIXED + PER_ROW bytes per row."""

    async def execute(self, payloads):
        outcome = await super().execute(payloads)
        rows = self.executed_sizes[-1]
        return dataclasses.replace(outcome, peak_bytes=FIXED + PER_ROW * rows)


class FixedHeadroom(MemoryMonitor):
    """A monitor whose device always has ``headroom`` bytes to give."""

    def __init__(self, headroom: float) -> None:
        super().__init__("cpu", 0.0)
        self.headroom = headroom

    def headroom_bytes(self) -> float | None:
        return self.headroom


def test_the_engine_never_starts_a_batch_past_the_memory_cap_once_learned(run_virtual) -> None:
    model = MemoryReportingModel(0.010, 0.001)
    registry = CollectorRegistry()
    metrics = BatcherMetrics(registry, "sim", 1.0, 32)
    # 2,050 bytes of headroom hold FIXED + 10 rows: batches above 10 would run out of memory
    batcher = Batcher(
        model, max_batch_size=32, slo_seconds=1.0, memory=FixedHeadroom(2_050.0), metrics=metrics
    )
    assert (batcher.memory_cap, batcher.memory_cap_reason) == (32, "unlearned")

    async def main() -> None:
        await batcher.start()
        await batcher.submit(SimPayload(0), size=1)  # alone: the first size measured
        await asyncio.gather(*(batcher.submit(SimPayload(i), size=1) for i in range(1, 33)))
        # two sizes measured (1 and 32): the line is known, and the next burst is capped by it
        await asyncio.gather(*(batcher.submit(SimPayload(i), size=1) for i in range(33, 97)))
        await batcher.drain()

    run_virtual(main)
    assert (batcher.memory_cap, batcher.memory_cap_reason) == (10, "memory")
    assert model.executed_sizes[:2] == [1, 32]
    assert max(model.executed_sizes[2:]) == 10  # the burst ran in batches the memory holds
    assert sum(model.executed_sizes) == 97
    assert registry.get_sample_value("autoglm_batcher_memory_cap_items", {"model": "sim"}) == 10
    reason = registry.get_sample_value(
        "autoglm_batcher_memory_cap_reason", {"model": "sim", "reason": "memory"}
    )
    assert reason == 1


def test_without_device_memory_the_cap_stays_unlearned_and_batches_fill(run_virtual) -> None:
    model = SimulatedModel(0.010, 0.001)  # CPU: no peak reported
    batcher = Batcher(model, max_batch_size=32, slo_seconds=1.0, memory=MemoryMonitor("cpu", 0))

    async def main() -> None:
        await batcher.start()
        await asyncio.gather(*(batcher.submit(SimPayload(i), size=1) for i in range(64)))
        await batcher.drain()

    run_virtual(main)
    assert (batcher.memory_cap, batcher.memory_cap_reason) == (32, "unlearned")
    assert max(model.executed_sizes) > 10


def test_the_warm_up_learns_the_footprint_before_serving(run_virtual) -> None:
    model = MemoryReportingModel(0.010, 0.001)
    batcher = Batcher(model, max_batch_size=32, slo_seconds=1.0, memory=FixedHeadroom(2_050.0))

    async def main() -> None:
        await batcher.calibrate(lambda n: [SimPayload(i) for i in range(n)], [1, 2, 4, 8], 1)

    run_virtual(main)
    assert batcher.footprint.line() == pytest.approx((FIXED, PER_ROW))
    assert (batcher.memory_cap, batcher.memory_cap_reason) == (10, "memory")


@pytest.mark.parametrize(
    ("memory_rows", "allowed", "expected"),
    [
        (40, None, 40),  # every size runs as it is: the memory cap itself
        (40, (1, 2, 4, 8, 16, 32, 64), 32),  # the largest bucket the memory holds
        (32, (1, 2, 4, 8, 16, 32, 64), 32),
        (64, (1, 2, 4, 8, 16, 32, 64), 64),  # the memory holds the whole cap
        (3, (8, 16, 32, 64), 3),  # no bucket fits: the memory cap, for the OOM path to judge
    ],
)
def test_the_memory_cap_keeps_to_the_sizes_the_executor_runs(
    memory_rows: int, allowed: tuple[int, ...] | None, expected: int
) -> None:
    metrics = BatcherMetrics(CollectorRegistry(), "sim", 1.0, 64)
    sizer = BatchSizer(lambda n: n, 64, 1.0, adaptive=False, memory=None, metrics=metrics)
    sizer.allowed = allowed
    # headroom for FIXED and memory_rows rows of PER_ROW, as the memory cap reads it
    sizer.memory_cap, sizer.memory_cap_reason = memory_cap(
        FIXED + memory_rows * PER_ROW + PER_ROW / 2, (FIXED, PER_ROW), 64
    )
    assert sizer.cap == expected
