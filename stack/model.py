"""The model the local stack's batcher workers serve: the demo MLP plus a simulated kernel time.

On a laptop without a GPU the demo MLP answers a batch in tens of microseconds, so no load a
loopback load generator can send would keep a worker busy, and nothing would ever need scaling.
Each batch therefore also holds the worker for ``kernel_seconds(items)`` (:mod:`stack.kernel`) of
wall time, as a GPU kernel would (the cost model ``t(b) = c + a·b`` the batcher fits online). The
cost is mostly per item, so a worker's busy time grows with the requests it serves (as a large
model's does) and a few dozen requests a second are enough to fill a GPU: the load generator and
the job runner stay cheap on a laptop's CPU, and one best-effort item fits the batcher's default
quantum (a tenth of the 0.25 s SLO). The wait is a sleep in the batcher's executor thread: it
costs no CPU, so several workers share two cores without stealing time from each other, and the
batcher's measured busy time -- which the simulated GPUs and the autoscaler read -- is the time
each batch really held the worker.
"""

from __future__ import annotations

import itertools
import time

import numpy as np
import torch

from batcher.model import TensorSpec
from batcher.models.demo import DemoMLP
from stack.kernel import kernel_seconds


class SimulatedKernelModel:
    """A batch callable: runs the MLP on the batch, then waits out the simulated kernel time."""

    def __init__(self) -> None:
        self.module = DemoMLP()
        self.input_specs = [TensorSpec("input", "FP32", (16,))]
        self.output_specs = [TensorSpec("logits", "FP32", (4,))]

    def __call__(self, payloads: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        started = time.perf_counter()
        counts = [len(p["input"]) for p in payloads]
        batch = torch.from_numpy(np.concatenate([p["input"] for p in payloads], axis=0))
        with torch.inference_mode():
            logits = self.module(batch).numpy()
        kernel = kernel_seconds(sum(counts))
        time.sleep(max(0.0, kernel - (time.perf_counter() - started)))
        bounds = np.cumsum([0, *counts])
        return [logits[a:b] for a, b in itertools.pairwise(bounds)]


def factory(checkpoint: str | None = None) -> SimulatedKernelModel:
    """``input`` FP32 [-1, 16] -> ``logits`` FP32 [-1, 4], with a simulated kernel time."""
    model = SimulatedKernelModel()
    if checkpoint:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True)
        model.module.load_state_dict(state)
    return model
