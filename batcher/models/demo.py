"""A small bundled torch model, so the runtime and the local stack run with nothing else.

``factory`` gives a tiny MLP classifier (16 features -> 4 logits), quick to load and to call.
``bench_factory`` gives a deep one whose batch cost is clearly sublinear on a CPU: at small batch
sizes each layer is bound by reading its weights from memory, so extra rows are almost free until
the matrix multiply becomes compute-bound. Weights are seeded, so every process serves the same
function. Checkpoints are read with ``torch.load(weights_only=True)``: a state dict of tensors,
never pickled code.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from batcher.model import TensorSpec


class DemoMLP(nn.Module):
    """Features -> ``layers`` ReLU layers of width ``hidden`` -> class logits."""

    def __init__(
        self,
        features: int = 16,
        hidden: int = 256,
        layers: int = 2,
        classes: int = 4,
        seed: int = 0,
    ) -> None:
        super().__init__()
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            blocks: list[nn.Module] = [nn.Linear(features, hidden), nn.ReLU()]
            for _ in range(layers - 1):
                blocks += [nn.Linear(hidden, hidden), nn.ReLU()]
            blocks.append(nn.Linear(hidden, classes))
            self.net = nn.Sequential(*blocks)
        self.input_specs = [TensorSpec("input", "FP32", (features,))]
        self.output_specs = [TensorSpec("logits", "FP32", (classes,))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def load_checkpoint(model: nn.Module, path: str | Path) -> nn.Module:
    """Load a state dict saved by ``torch.save(model.state_dict(), path)``; no code unpickled."""
    state = torch.load(path, map_location="cpu", weights_only=True)
    model.load_state_dict(state)
    return model


def factory(checkpoint: str | None = None) -> DemoMLP:
    """The demo model served by default: ``input`` FP32 [-1, 16] -> ``logits`` FP32 [-1, 4]."""
    model = DemoMLP()
    if checkpoint:
        load_checkpoint(model, checkpoint)
    return model


def bench_factory() -> DemoMLP:
    """The benchmark's model: ``input`` FP32 [-1, 64] -> ``logits`` FP32 [-1, 16].

    32 layers of 2048 (540 MB of weights): on one CPU thread a batch of 1 costs tens of
    milliseconds, so a loopback HTTP load generator on the same machine is not the bottleneck.
    """
    return DemoMLP(features=64, hidden=2048, layers=32, classes=16)
