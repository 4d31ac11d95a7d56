"""A model large enough to matter on a GPU, for ``bench/batcher_gpu.py``.

Why: the CPU benchmark's MLP is half a gigabyte and its activations are kilobytes; on an H200 it
would neither show what batching buys nor stress the caching allocator. Here each request's 64
features are expanded into a sequence of ``tokens`` positions that pass through ``layers``
residual feed-forward blocks (width -> 4 x width -> width, the feed-forward half of a transformer
layer), then are averaged into 16 logits: the same signature as the CPU benchmark's model, so the
same load generator drives both. With the default shape (width 4096, 48 layers, 32 tokens) the
weights are 6.4e9 parameters, 12.9 GB in bf16. On an H200 a batch then costs about the time to
read the weights (some 3 ms) plus about 1 ms per request, so batching pays about threefold while
the peak stays near 1000 requests/s, within what one HTTP server process and one load generator
parse. A batch of b requests allocates b x 32 x 16384 values per layer, tens of megabytes per
request that change with every batch size: the pattern that fragments a caching allocator.

The shape comes from ``AUTOGLM_GPU_BENCH_SHAPE`` ("width,layers,tokens"), the device the weights
are created on from ``AUTOGLM_GPU_BENCH_DEVICE`` (default ``cpu``): building several gigabytes on
the host first and copying them over would dominate start-up. Weights are seeded random (timings
and memory do not depend on their values); nothing is loaded from disk.
"""

from __future__ import annotations

import os

import torch
from torch import nn

from batcher.model import TensorSpec

SHAPE_VARIABLE = "AUTOGLM_GPU_BENCH_SHAPE"
DEVICE_VARIABLE = "AUTOGLM_GPU_BENCH_DEVICE"
DEFAULT_SHAPE = (4096, 48, 32)
FEATURES = 64
CLASSES = 16
EXPANSION = 4


class FeedForwardBlock(nn.Module):
    """Pre-norm residual block: x + W2 gelu(W1 norm(x))."""

    def __init__(self, width: int, dtype: torch.dtype) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width, dtype=dtype)
        self.up = nn.Linear(width, EXPANSION * width, dtype=dtype)
        self.down = nn.Linear(EXPANSION * width, width, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(nn.functional.gelu(self.up(self.norm(x))))


class TokenFeedForward(nn.Module):
    """Features -> a sequence of ``tokens`` positions -> feed-forward blocks -> mean -> logits."""

    def __init__(
        self, width: int, layers: int, tokens: int, dtype: torch.dtype, seed: int = 0
    ) -> None:
        super().__init__()
        # Created in their final dtype: a float32 copy converted afterwards would leave twice
        # the weights' size cached in the allocator, and in every memory statistic.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Linear(FEATURES, width, dtype=dtype)
            self.positions = nn.Parameter(torch.randn(tokens, width, dtype=dtype) * 0.02)
            self.blocks = nn.Sequential(*(FeedForwardBlock(width, dtype) for _ in range(layers)))
            self.head = nn.Linear(width, CLASSES, dtype=dtype)
        self.input_specs = [TensorSpec("input", "FP32", (FEATURES,))]
        self.output_specs = [TensorSpec("logits", "FP32", (CLASSES,))]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = self.head.weight.dtype
        hidden = self.embed(x.to(dtype))[:, None, :] + self.positions[None]
        return self.head(self.blocks(hidden).mean(dim=1)).float()


def parse_shape(text: str | None) -> tuple[int, int, int]:
    """(width, layers, tokens) from "width,layers,tokens"; the default when unset."""
    if not text:
        return DEFAULT_SHAPE
    width, layers, tokens = (int(part) for part in text.split(","))
    return width, layers, tokens


def factory() -> TokenFeedForward:
    """The GPU benchmark's model: ``input`` FP32 [-1, 64] -> ``logits`` FP32 [-1, 16].

    bf16 weights on CUDA (what a served model of this size uses), float32 on a CPU.
    """
    width, layers, tokens = parse_shape(os.environ.get(SHAPE_VARIABLE))
    device = torch.device(os.environ.get(DEVICE_VARIABLE, "cpu"))
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    with torch.device(device):
        model = TokenFeedForward(width, layers, tokens, dtype)
    return model.eval()
