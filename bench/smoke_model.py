"""The model ``bench/batcher.py --smoke`` serves: its full runs' model's signature, costing wall
time and next to no CPU.

``batcher.models.demo:bench_factory`` (32 layers of 2048, 540 MB of weights) makes every server
of the bench spend seconds building and timing it, and every overloaded point of the sweep drain
for seconds more. A smoke run's figures mean nothing, so it serves this instead: the same
``input`` FP32 [-1, 64] -> ``logits`` FP32 [-1, 16], through one small numpy layer, then held
for 9 ms a batch plus 1 ms a row on the batcher's model thread, as a device kernel would hold it
(10 ms a lone row, 41 ms a batch of 32, about what a quarter of the full model took on one CPU
thread). That is slow enough that running rows one at a time misses the SLO at the sweep's top
rate, so the smoke still takes the sweep's and the search's failing branches; the wait is a
sleep, and torch is never imported (the full runs' ``--torch-threads 1`` has nothing to set), so
the smoke's five servers cost the CPU of the serving path alone.
"""

from __future__ import annotations

import itertools
import time

import numpy as np

from batcher.model import TensorSpec

FEATURES, CLASSES = 64, 16
BATCH_SECONDS, ROW_SECONDS = 0.009, 0.001


class SmokeModel:
    """A batch callable: one linear layer, then the rest of the batch's hold as a sleep."""

    def __init__(self) -> None:
        rng = np.random.default_rng(0)
        self.weight = rng.standard_normal((FEATURES, CLASSES), dtype=np.float32) / 8
        self.input_specs = [TensorSpec("input", "FP32", (FEATURES,))]
        self.output_specs = [TensorSpec("logits", "FP32", (CLASSES,))]

    def __call__(self, payloads: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        started = time.perf_counter()
        counts = [len(p["input"]) for p in payloads]
        logits = np.concatenate([p["input"] for p in payloads], axis=0) @ self.weight
        hold = BATCH_SECONDS + ROW_SECONDS * sum(counts)
        time.sleep(max(0.0, hold - (time.perf_counter() - started)))
        bounds = np.cumsum([0, *counts])
        return [logits[a:b] for a, b in itertools.pairwise(bounds)]


def smoke_factory() -> SmokeModel:
    """A fresh model (``--model bench.smoke_model:smoke_factory``)."""
    return SmokeModel()
