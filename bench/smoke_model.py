"""The model ``bench/batcher.py --smoke`` serves: its full runs' model's signature, cheaper.

``batcher.models.demo:bench_factory`` (32 layers of 2048, 540 MB of weights) makes every server
of the bench spend seconds building and timing it, and every overloaded point of the sweep drain
for seconds more. A smoke run's figures mean nothing, so it serves this instead: the same
``input`` FP32 [-1, 64] -> ``logits`` FP32 [-1, 16] through a quarter of the layers, built in a
fraction of a second and about 10 ms a lone row, 40 ms a batch of 32 on one thread: slow enough
that running rows one at a time misses the SLO at the sweep's top rate, so the smoke still takes
the sweep's and the search's failing branches.
"""

from __future__ import annotations

from batcher.models.demo import DemoMLP


def smoke_factory() -> DemoMLP:
    """A fresh module (``--model bench.smoke_model:smoke_factory``)."""
    return DemoMLP(features=64, hidden=2048, layers=8, classes=16)
