"""Start-up warm-up: time the model at a few batch sizes, then choose the padding buckets.

Why: a cost model that starts empty spends the first minutes of traffic learning, with batches
sized on guesses; and which sizes are worth padding to is a property of the device, not something
to configure by hand (on CPUs the BLAS picks slow kernels for some small row counts, so 8 rows
can cost more than 16; on GPUs tile quantisation makes steps). The warm-up runs synthetic batches
of the powers of two up to the largest batch, on the model's own thread, before the server
listens; the times seed the engine's cost model and decide the buckets.

Padding rule: a measured size is a bucket unless a larger measured size is clearly cheaper: by
more than ``CLEARLY_CHEAPER``, and by more than two standard errors of the medians given the noise
the warm-up saw, so noise alone does not move a bucket. On CUDA (a few recurring shapes keep the
caching allocator from fragmenting) and with ``--padding on`` a batch is padded up to the next
bucket. ``--padding auto`` on a CPU pads only where the cost is not monotone, and only the batches
near a dropped size: from the kept size below it up to the next kept one (the BLAS's slow row
counts start somewhere between two measured sizes, and a larger bucket was clearly cheaper than
the dropped one). Every other size runs as it is: between two kept sizes the time grows with the
rows, and padding a batch of 38 rows to 64 would cost a third more CPU for nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from batcher.config import BatcherConfig
from batcher.engine import Batcher
from batcher.model import Payload, ServedModel, TensorSpec, zeros
from batcher.oip import DATATYPES

log = logging.getLogger(__name__)

CLEARLY_CHEAPER = 0.05


def warmup_sizes(max_batch_size: int) -> list[int]:
    """The sizes timed at start-up: powers of two up to the largest batch, and the largest."""
    sizes = {1 << k for k in range(max_batch_size.bit_length()) if 1 << k <= max_batch_size}
    return sorted(sizes | {max_batch_size})


def padding_tolerance(relative_noise: float, repeats: int) -> float:
    """How much cheaper a larger size must measure to replace a smaller one (a fraction)."""
    return max(CLEARLY_CHEAPER, 2.0 * relative_noise / math.sqrt(max(repeats, 1)))


def cheapest_buckets(
    seconds_by_size: Mapping[int, float], tolerance: float = CLEARLY_CHEAPER
) -> tuple[int, ...]:
    """Measured sizes worth padding to: none larger is cheaper by more than ``tolerance``."""
    sizes = sorted(seconds_by_size)
    return tuple(
        b
        for i, b in enumerate(sizes)
        if all(seconds_by_size[c] >= (1 - tolerance) * seconds_by_size[b] for c in sizes[i + 1 :])
    )


def choose_buckets(
    padding: str,
    cuda: bool,
    configured: Sequence[int],
    explicit: bool,
    seconds_by_size: Mapping[int, float],
    tolerance: float = CLEARLY_CHEAPER,
) -> tuple[int, ...] | None:
    """Padding buckets to use, or None for no padding.

    ``configured`` are the buckets from the configuration (``explicit`` when the operator named
    them, else powers of two); ``seconds_by_size`` what the warm-up measured (may be empty),
    ``tolerance`` as for :func:`cheapest_buckets`.
    """
    if padding == "off":
        return None
    if explicit:
        return tuple(configured)
    measured = cheapest_buckets(seconds_by_size, tolerance) if seconds_by_size else ()
    if padding == "on" or cuda:
        return measured or tuple(configured)
    if measured and len(measured) < len(seconds_by_size):
        return sizes_run_as_they_are(seconds_by_size, measured)
    return None


def sizes_run_as_they_are(
    seconds_by_size: Mapping[int, float], kept: Sequence[int]
) -> tuple[int, ...]:
    """The buckets of ``--padding auto`` on a CPU (see the module doc): every kept measured size,
    and every size between two kept measured sizes next to each other; the others pad up to the
    next bucket."""
    measured = sorted(seconds_by_size)
    kept_sizes = set(kept)
    sizes: list[int] = []
    for start, end in zip(measured, [*measured[1:], 0], strict=True):  # 0: nothing beyond
        if start in kept_sizes:
            sizes.extend(range(start, end) if end in kept_sizes else [start])
    return tuple(sizes)


def example_batch(inputs: Sequence[TensorSpec], items: int) -> list[Payload]:
    """One synthetic request of ``items`` rows of zeros (a dimension of any size becomes 1)."""
    return [
        {
            spec.name: zeros(
                (items, *(d if d > 0 else 1 for d in spec.shape)), DATATYPES[spec.datatype]
            )
            for spec in inputs
        }
    ]


async def warm_up(
    batcher: Batcher, model: ServedModel, config: BatcherConfig
) -> tuple[dict[int, float], tuple[int, ...] | None]:
    """Time ``model`` through ``batcher`` (before it starts) and set its padding buckets.

    Returns the median seconds by size and the buckets chosen. A model that fails on synthetic
    input is served anyway: the cost model then learns from real traffic.
    """
    explicit = bool(config.pad_buckets)
    model.use_buckets(config.buckets if explicit and config.padding != "off" else None)
    measured: dict[int, float] = {}
    if config.warmup_repeats:
        measured = await batcher.calibrate(
            lambda items: example_batch(model.inputs, items),
            warmup_sizes(config.max_batch_size),
            config.warmup_repeats,
        )
    buckets = (
        choose_buckets(
            config.padding,
            model.device.startswith("cuda"),
            config.buckets,
            explicit,
            measured,
            padding_tolerance(batcher.cost.relative_noise, config.warmup_repeats),
        )
        if model.pads
        else None
    )
    model.use_buckets(buckets)
    log.info(
        "warm-up timed the model",
        extra={
            "seconds_by_size": {str(b): t for b, t in measured.items()},
            "pad_buckets": list(buckets) if buckets else None,
        },
    )
    return measured, buckets
