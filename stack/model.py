"""The model the local stack's batcher workers serve: a small MLP plus a simulated kernel time.

On a laptop without a GPU a small MLP answers a batch in tens of microseconds, so no load a
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

The MLP has the bundled demo model's shape (:class:`batcher.models.demo.DemoMLP`: 16 features,
two ReLU layers of 256, 4 logits) and runs in numpy, so a worker never imports torch: each new
worker starts in about a third of the CPU time and memory (docs/local-stack.md). A demo model
checkpoint still loads, through torch, which then is imported for reading it only.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

import numpy as np

from batcher.model import TensorSpec
from stack.kernel import kernel_seconds

FEATURES = 16
HIDDEN = 256
CLASSES = 4
SEED = 0

Layer = tuple[np.ndarray, np.ndarray]  # (weight [out, in], bias [out]), float32


def seeded_layers(seed: int = SEED) -> list[Layer]:
    """Weights drawn as ``torch.nn.Linear`` draws its defaults (uniform within 1/sqrt(fan_in)),
    from a seeded generator, so every worker serves the same function."""
    rng = np.random.default_rng(seed)
    layers = []
    for fan_in, fan_out in itertools.pairwise((FEATURES, HIDDEN, HIDDEN, CLASSES)):
        bound = 1.0 / np.sqrt(fan_in)
        weight = rng.uniform(-bound, bound, (fan_out, fan_in)).astype(np.float32)
        bias = rng.uniform(-bound, bound, fan_out).astype(np.float32)
        layers.append((weight, bias))
    return layers


def checkpoint_layers(path: str) -> list[Layer]:
    """The layers of a demo model checkpoint (``torch.save(DemoMLP().state_dict(), path)``),
    read as tensors only (``weights_only``: no code is unpickled); ValueError naming what is
    wrong when it is not one."""
    import torch

    state = torch.load(path, map_location="cpu", weights_only=True)
    # a state dict keeps the order the layers were registered in: the order they run in
    names = [key.removesuffix(".weight") for key in state if key.endswith(".weight")]
    layers = [
        (state[f"{n}.weight"].numpy(), state[f"{n}.bias"].numpy())
        for n in names
        if f"{n}.bias" in state
    ]
    widths = [tuple(weight.shape) for weight, _ in layers]
    if not (
        layers
        and len(layers) == len(names)  # every weight has its bias
        and all(len(w) == 2 for w in widths)
        and widths[0][1] == FEATURES
        and widths[-1][0] == CLASSES
        and all(a[0] == b[1] for a, b in itertools.pairwise(widths))  # each feeds the next
    ):
        raise ValueError(
            f"not a demo model checkpoint ({FEATURES} features -> {CLASSES} logits); "
            f"its linear layers are {widths}"
        )
    return [(weight.astype(np.float32), bias.astype(np.float32)) for weight, bias in layers]


class SimulatedKernelModel:
    """A batch callable: runs the MLP on the batch, then waits out the simulated kernel time
    (``kernel(rows)`` seconds, :func:`stack.kernel.kernel_seconds` unless given)."""

    def __init__(
        self, layers: list[Layer], kernel: Callable[[int], float] = kernel_seconds
    ) -> None:
        self.layers = layers
        self.kernel = kernel
        features, classes = layers[0][0].shape[1], layers[-1][0].shape[0]
        self.input_specs = [TensorSpec("input", "FP32", (features,))]
        self.output_specs = [TensorSpec("logits", "FP32", (classes,))]

    def logits(self, batch: np.ndarray) -> np.ndarray:
        """The MLP's forward pass: ReLU after every layer but the last."""
        x = batch
        for index, (weight, bias) in enumerate(self.layers):
            x = x @ weight.T + bias
            if index < len(self.layers) - 1:
                np.maximum(x, 0.0, out=x)
        return x

    def __call__(self, payloads: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        started = time.perf_counter()
        counts = [len(p["input"]) for p in payloads]
        logits = self.logits(np.concatenate([p["input"] for p in payloads], axis=0))
        kernel = self.kernel(sum(counts))
        time.sleep(max(0.0, kernel - (time.perf_counter() - started)))
        bounds = np.cumsum([0, *counts])
        return [logits[a:b] for a, b in itertools.pairwise(bounds)]


def factory(checkpoint: str | None = None) -> SimulatedKernelModel:
    """``input`` FP32 [-1, 16] -> ``logits`` FP32 [-1, 4], with a simulated kernel time."""
    return SimulatedKernelModel(checkpoint_layers(checkpoint) if checkpoint else seeded_layers())
