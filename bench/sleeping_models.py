"""Stand-in devices for ``bench/batcher_models.py``: batch callables that take a known time.

A batch of ``b`` rows sleeps ``fixed + per_row * b`` seconds, without holding the CPU or the GIL,
as a GPU kernel would: so on a small shared machine the device, not the CPU that the HTTP server
and the load generator need, is what the burst saturates, and the HTTP section measures how the
device is shared between the models rather than how fast this machine runs a torch MLP. The
costs are those of the benchmark's simulated section.
"""

from __future__ import annotations

import time

import numpy as np

from batcher.model import TensorSpec

FEATURES = 16


class SleepingModel:
    """``input`` FP32 [-1, 16] -> ``logits`` FP32 [-1, 4] (zeros), after the batch's time."""

    input_specs = (TensorSpec("input", "FP32", (FEATURES,)),)
    output_specs = (TensorSpec("logits", "FP32", (4,)),)

    def __init__(self, fixed_seconds: float, per_row_seconds: float) -> None:
        self.fixed_seconds = fixed_seconds
        self.per_row_seconds = per_row_seconds

    def __call__(self, batch: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        rows = sum(len(p["input"]) for p in batch)
        time.sleep(self.fixed_seconds + self.per_row_seconds * rows)
        return [{"logits": np.zeros((len(p["input"]), 4), np.float32)} for p in batch]


def bursty() -> SleepingModel:
    """t(b) = 20 ms + 2 ms·b."""
    return SleepingModel(0.020, 0.002)


def steady() -> SleepingModel:
    """t(b) = 5 ms + 1 ms·b."""
    return SleepingModel(0.005, 0.001)
