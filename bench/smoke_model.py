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

import numpy as np

from stack.model import SimulatedKernelModel

FEATURES, CLASSES = 64, 16
BATCH_SECONDS, ROW_SECONDS = 0.009, 0.001


def hold_seconds(rows: int) -> float:
    """How long a batch of ``rows`` holds the model thread."""
    return BATCH_SECONDS + ROW_SECONDS * rows


def smoke_factory() -> SimulatedKernelModel:
    """A fresh model (``--model bench.smoke_model:smoke_factory``): one linear layer, then the
    rest of the batch's hold as a sleep (the local stack's model, with this bench's widths and
    hold)."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((CLASSES, FEATURES), dtype=np.float32) / 8
    return SimulatedKernelModel([(weight, np.zeros(CLASSES, np.float32))], hold_seconds)
