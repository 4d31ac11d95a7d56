"""The reference MLP of the serving goals (issue 18), shared by every server the serving bench runs.

``input`` FP32 [-1, 512] -> ``logits`` FP32 [-1, 512] through two hidden layers of 2048: at full
batches a row costs the model little, so what a serving path costs around it shows. Weights are
seeded, so the batcher and MLServer serve the same function.
"""

from __future__ import annotations

import torch

from batcher.model import TensorSpec
from batcher.models.demo import DemoMLP

FEATURES = 512


def reference_mlp() -> DemoMLP:
    """A fresh module (``--model bench.reference_mlp:reference_mlp``)."""
    return DemoMLP(features=FEATURES, hidden=2048, layers=2, classes=FEATURES)


class Identity(torch.nn.Module):
    """The reference MLP's signature with no work in it: served, what a request costs is the
    serving path's own (``--model bench.reference_mlp:identity`` in the serving bench)."""

    def __init__(self) -> None:
        super().__init__()
        self.input_specs = [TensorSpec("input", "FP32", (FEATURES,))]
        self.output_specs = [TensorSpec("logits", "FP32", (FEATURES,))]

    def forward(self, rows: torch.Tensor) -> torch.Tensor:
        return rows.clone()


def identity() -> Identity:
    """A fresh :class:`Identity` (``--model bench.reference_mlp:identity``)."""
    return Identity()
