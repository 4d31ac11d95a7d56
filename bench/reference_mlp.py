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


def row_cpu_microseconds(
    sizes: list[int], seconds_per_size: float = 1.0, device: str = "cpu"
) -> dict[int, float]:
    """Microseconds a row costs the reference MLP alone at each batch size, on one torch
    thread (as the serving bench runs it): what a request costs a server whose serving path is
    free, so the bench can say how much of its CPU per request is the model's. On CPU the
    thread's CPU time; on CUDA the wall time of a whole call as a server makes it (rows copied
    to the device, the answer copied back), the GPU's time being what the call waits for."""
    import time

    torch.set_num_threads(1)
    module = reference_mlp().eval().to(device)
    cuda = device.startswith("cuda")
    clock = time.perf_counter if cuda else time.thread_time

    def call(rows: torch.Tensor) -> None:
        module(rows.to(device)).cpu()

    costs = {}
    with torch.inference_mode():
        for size in sizes:
            rows = torch.randn(size, FEATURES)
            call(rows)  # first call allocates
            calls, start = 0, clock()
            while clock() - start < seconds_per_size or calls < 3:
                call(rows)
                calls += 1
            costs[size] = (clock() - start) / calls / size * 1e6
    return costs


if __name__ == "__main__":
    import argparse
    import json

    parser = argparse.ArgumentParser(description="CPU per row of the reference MLP alone, as JSON")
    parser.add_argument("sizes", type=int, nargs="+", help="batch sizes")
    parser.add_argument("--seconds", type=float, default=1.0, help="timed per size")
    parser.add_argument("--device", default="cpu", help="cpu, or cuda: wall time per call")
    args = parser.parse_args()
    print(json.dumps(row_cpu_microseconds(args.sizes, args.seconds, args.device)))
