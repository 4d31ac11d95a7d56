"""The reference MLP of the serving goals (issue 18), shared by every server the serving bench runs.

``input`` FP32 [-1, 512] -> ``logits`` FP32 [-1, 512] through two hidden layers of 2048: small
enough that one CPU core runs about twenty thousand rows a second at batch 128, so what a serving
path costs around it shows. Weights are seeded, so the batcher and MLServer serve the same function.
"""

from __future__ import annotations

from batcher.models.demo import DemoMLP

FEATURES = 512


def reference_mlp() -> DemoMLP:
    """A fresh module (``--model bench.reference_mlp:reference_mlp``)."""
    return DemoMLP(features=FEATURES, hidden=2048, layers=2, classes=FEATURES)
