"""Keeping the CUDA caching allocator compact, and reporting what it holds.

Why: a serving process sees batches of every size, so the caching allocator accumulates blocks of
many sizes; freed blocks that are too small for the next request stay reserved ("fragmentation")
and the process OOMs with memory nominally free, or starves a co-located process. Three measures:

* expandable segments (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True``), so a segment grows
  in place instead of new segments being carved; it must be set before CUDA initialises;
* padding batches to a few bucket sizes, so activations come in a few recurring shapes whose
  blocks are reused (see :func:`bucket_size`);
* returning cached blocks to the driver after an idle period, so a neighbour can use them.

On CPU there is no caching allocator: the same code runs, nothing is released, and the statistics
are absent rather than zero.
"""

from __future__ import annotations

import logging
from bisect import bisect_left
from collections.abc import MutableMapping, Sequence

import torch

log = logging.getLogger(__name__)

ALLOC_CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
EXPANDABLE = "expandable_segments:True"

# torch.cuda.memory_stats() key -> the name exported (without prefix)
_CUDA_STATS = {
    "allocated_bytes.all.current": "allocated_bytes",
    "reserved_bytes.all.current": "reserved_bytes",
    "inactive_split_bytes.all.current": "inactive_split_bytes",
    "num_alloc_retries": "alloc_retries",
    "num_ooms": "ooms",
}


def configure_allocator(expandable_segments: bool, environ: MutableMapping[str, str]) -> str:
    """Ask for expandable segments in the allocator config, unless the operator chose already.

    Returns a short description of what was done, for the start-up log line. An explicit
    ``expandable_segments`` in the environment always wins over the setting.
    """
    for var in ALLOC_CONF_VARS:
        if "expandable_segments" in environ.get(var, ""):
            return f"kept {var}={environ[var]} (set by the operator)"
    if not expandable_segments:
        return "expandable segments off (--no-expandable-segments)"
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        log.warning("CUDA already initialised; expandable segments cannot take effect")
    var = next((v for v in ALLOC_CONF_VARS if environ.get(v)), "PYTORCH_CUDA_ALLOC_CONF")
    current = environ.get(var, "")
    environ[var] = f"{current},{EXPANDABLE}" if current else EXPANDABLE
    return f"set {var}={environ[var]}"


def resolve_device(setting: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is usable, else ``cpu``."""
    if setting == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether a model error means the device ran out of memory."""
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def bucket_size(items: int, buckets: Sequence[int]) -> int:
    """Smallest bucket that holds ``items`` (``items`` itself above the largest bucket)."""
    index = bisect_left(buckets, items)
    return buckets[index] if index < len(buckets) else items


class MemoryMonitor:
    """Allocator statistics and idle release for one device."""

    def __init__(self, device: str, idle_release_seconds: float) -> None:
        self.device = device
        self.idle_release_seconds = idle_release_seconds
        self.releases = 0
        self._released_after: float | None = None

    @property
    def is_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def stats(self) -> dict[str, float]:
        """Allocator statistics in bytes and counts; empty on CPU (nothing applies)."""
        if not self.is_cuda or not torch.cuda.is_initialized():
            return {}
        raw = torch.cuda.memory_stats(self.device)
        stats = {name: float(raw.get(key, 0)) for key, name in _CUDA_STATS.items()}
        stats["reserved_unallocated_bytes"] = stats["reserved_bytes"] - stats["allocated_bytes"]
        return stats

    def release_due(self, last_activity: float) -> float | None:
        """When to release cached memory, given the end of the last batch; None: nothing to do."""
        if not self.is_cuda or self.idle_release_seconds <= 0:
            return None
        if self._released_after is not None and self._released_after >= last_activity:
            return None
        return last_activity + self.idle_release_seconds

    def release(self, last_activity: float) -> bool:
        """Return cached blocks to the driver; True when something could be released."""
        self._released_after = last_activity
        if not self.is_cuda or not torch.cuda.is_initialized():
            return False
        torch.cuda.empty_cache()
        self.releases += 1
        log.info("released cached device memory after idle period", extra=self.stats())
        return True

    def after_out_of_memory(self) -> None:
        """Give the failed batch's freed blocks back so the halves start from a clean pool."""
        if self.is_cuda and torch.cuda.is_initialized():
            torch.cuda.empty_cache()
