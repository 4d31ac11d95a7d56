"""Start-up warm-up: sizes timed, buckets chosen, the cost model seeded; faults degrade."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from batcher.config import BatcherConfig
from batcher.engine import Batcher
from batcher.memory import bucket_size
from batcher.metrics import BatcherMetrics
from batcher.model import TensorSpec, wrap_model
from batcher.models.simulated import SimPayload, SimulatedModel
from batcher.warmup import (
    CLEARLY_CHEAPER,
    cheapest_buckets,
    choose_buckets,
    example_batch,
    padding_tolerance,
    sizes_run_as_they_are,
    warm_up,
    warmup_sizes,
)

CPU_LIKE = {1: 0.05, 2: 0.06, 4: 0.15, 8: 0.18, 16: 0.08, 32: 0.115}


def make(device: object, **kwargs: object) -> Batcher:
    kwargs.setdefault("max_batch_size", 32)
    kwargs.setdefault("slo_seconds", 0.6)
    metrics = BatcherMetrics(CollectorRegistry(), "w", 0.6, kwargs["max_batch_size"])
    return Batcher(device, metrics=metrics, **kwargs)


def sim_batch(items: int) -> list[SimPayload]:
    return [SimPayload(-1, size=items)]


def test_sizes_are_powers_of_two_and_the_maximum() -> None:
    assert warmup_sizes(32) == [1, 2, 4, 8, 16, 32]
    assert warmup_sizes(24) == [1, 2, 4, 8, 16, 24]
    assert warmup_sizes(1) == [1]


def test_buckets_drop_sizes_that_a_larger_one_beats() -> None:
    assert cheapest_buckets(CPU_LIKE) == (1, 2, 16, 32)
    linear = {b: 0.03 + 0.0025 * b for b in (1, 2, 4, 8, 16, 32)}
    assert cheapest_buckets(linear) == (1, 2, 4, 8, 16, 32)
    # 2% cheaper is within the default tolerance: noise, not a reason to pad.
    assert cheapest_buckets({1: 0.050, 2: 0.049}) == (1, 2)
    assert cheapest_buckets({1: 0.050, 2: 0.049}, tolerance=0.01) == (2,)


def test_tolerance_grows_with_the_noise_the_warm_up_saw() -> None:
    assert padding_tolerance(0.0, 5) == CLEARLY_CHEAPER
    assert padding_tolerance(0.3, 4) == pytest.approx(0.3)


def test_padding_choice() -> None:
    linear = {b: 0.03 + 0.0025 * b for b in (1, 2, 4, 8)}
    assert choose_buckets("off", True, (1, 2), True, CPU_LIKE) is None
    assert choose_buckets("auto", False, (3, 6, 32), True, CPU_LIKE) == (3, 6, 32)
    # A CPU pads only near a size a larger one beat: 3..15 rows up to 16 (4 and 8 were
    # dropped); the sizes between two kept ones run as they are (time grows with the rows).
    cpu = choose_buckets("auto", False, (1, 2, 4, 8), False, CPU_LIKE)
    assert cpu == (1, 2, *range(16, 33))
    assert [bucket_size(b, cpu) for b in (2, 3, 4, 9, 15, 16, 17, 31)] == [
        2,
        16,
        16,
        16,
        16,
        16,
        17,
        31,
    ]
    assert choose_buckets("auto", False, (1, 2, 4, 8), False, linear) is None  # monotone CPU
    assert choose_buckets("auto", True, (1, 2, 4, 8), False, linear) == (1, 2, 4, 8)  # CUDA
    assert choose_buckets("on", False, (1, 4, 8), False, {}) == (1, 4, 8)  # nothing measured
    assert choose_buckets("on", False, (1, 2, 4, 8), False, CPU_LIKE) == (1, 2, 16, 32)  # asked


def test_sizes_between_buckets_run_as_they_are_unless_a_dropped_size_lies_below() -> None:
    measured = {1: 0.01, 2: 0.03, 4: 0.02, 8: 0.04, 16: 0.07}
    # 2 is dropped (4 is cheaper): 2 and 3 rows pad to 4, the rest run as they are
    assert sizes_run_as_they_are(measured, (1, 4, 8, 16)) == (1, *range(4, 17))
    # a dropped size taints the sizes below it back to the kept one: 9..15 and 17..31 pad
    measured = {1: 0.01, 8: 0.02, 16: 0.05, 32: 0.04, 64: 0.06}
    assert sizes_run_as_they_are(measured, (1, 8, 32, 64)) == (*range(1, 9), *range(32, 65))
    # the largest measured size is a bucket of its own
    assert sizes_run_as_they_are({1: 0.01, 24: 0.02}, (1, 24)) == tuple(range(1, 25))


def test_example_batch_follows_the_signature() -> None:
    specs = [TensorSpec("x", "FP16", (3, -1)), TensorSpec("k", "INT64", ())]
    (payload,) = example_batch(specs, 5)
    assert payload["x"].shape == (5, 3, 1) and payload["x"].dtype == np.float16
    assert payload["k"].shape == (5,) and payload["k"].dtype == np.int64


def test_calibration_seeds_the_cost_table_before_the_first_request(run_virtual) -> None:
    device = SimulatedModel(0.0, 0.0, costs=CPU_LIKE)

    async def main() -> tuple[dict[int, float], Batcher]:
        batcher = make(device)
        measured = await batcher.calibrate(sim_batch, warmup_sizes(32), repeats=3)
        device.buckets = cheapest_buckets(measured)
        await batcher.start()
        await batcher.drain()
        return measured, batcher

    measured, batcher = run_virtual(main)
    assert measured == pytest.approx(CPU_LIKE)
    assert batcher.cost.measured() == pytest.approx(CPU_LIKE)
    assert len(device.executed) == 6 * 4  # one untimed run and three timed per size
    assert batcher.batch_sizes == (1, 2, 16, 32)
    assert batcher.cap == 32  # 32 rows serve the most per second and fit the budget


def test_out_of_memory_in_the_warm_up_stops_it_and_lowers_the_ceiling(run_virtual) -> None:
    device = SimulatedModel(0.01, 0.001, oom_above=8)

    async def main() -> tuple[dict[int, float], Batcher]:
        batcher = make(device)
        measured = await batcher.calibrate(sim_batch, warmup_sizes(32), repeats=2)
        return measured, batcher

    measured, batcher = run_virtual(main)
    assert sorted(measured) == [1, 2, 4, 8]
    assert batcher.cap <= 12  # below the 16 that failed


class Rows(torch.nn.Module):
    input_specs = (TensorSpec("x", "FP32", (4,)),)
    output_specs = (TensorSpec("y", "FP32", (4,)),)

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[int] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows.append(len(x))
        return x * 2


async def test_warm_up_times_a_torch_module_and_honours_explicit_buckets() -> None:
    from batcher.execution import ThreadExecutor

    module = Rows()
    served = wrap_model(module)
    config = BatcherConfig(max_batch_size=8, warmup_repeats=2, pad_buckets=[3, 8])
    batcher = make(ThreadExecutor(served.run, served.batch_size_for), max_batch_size=8)
    measured, buckets = await warm_up(batcher, served, config)
    batcher.executor.close()
    assert sorted(measured) == [3, 8]  # 1 and 2 ran padded to 3, 4 padded to 8
    assert buckets == (3, 8)
    assert set(module.rows) == {3, 8}
    assert served.batch_size_for(5) == 8


async def test_warm_up_with_padding_off_never_pads() -> None:
    from batcher.execution import ThreadExecutor

    served = wrap_model(Rows())
    config = BatcherConfig(max_batch_size=4, warmup_repeats=1, padding="off")
    batcher = make(ThreadExecutor(served.run, served.batch_size_for), max_batch_size=4)
    measured, buckets = await warm_up(batcher, served, config)
    batcher.executor.close()
    assert sorted(measured) == [1, 2, 4] and buckets is None
    assert served.batch_size_for(3) == 3


async def test_a_model_that_rejects_synthetic_input_is_served_anyway() -> None:
    from batcher.execution import ThreadExecutor

    def picky(batch: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        if not batch[0]["input__0"].any():
            raise ValueError("all-zero input")
        return [p["input__0"] for p in batch]

    served = wrap_model(picky)
    batcher = make(ThreadExecutor(served.run, served.batch_size_for), max_batch_size=4)
    measured, buckets = await warm_up(batcher, served, BatcherConfig(max_batch_size=4))
    await batcher.start()
    answer = await batcher.submit({"input__0": np.ones((1, 2), np.float32)})
    await batcher.drain()
    assert measured == {} and buckets is None
    assert answer["output__0"].tolist() == [[1.0, 1.0]]


def test_example_batch_gives_text_inputs_empty_strings_not_integer_zeros():
    """A text model warmed up on integer zeros would fail at start-up and serve uncalibrated."""

    (payload,) = example_batch([TensorSpec("text", "BYTES", ()), TensorSpec("x", "FP32", (-1,))], 3)
    assert payload["text"].dtype == object and payload["text"].tolist() == [b"", b"", b""]
    assert payload["x"].shape == (3, 1) and payload["x"].dtype == np.float32
