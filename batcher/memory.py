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
from types import ModuleType

from batcher.torch_loaded import initialised_cuda, loaded_torch

log = logging.getLogger(__name__)

# Device memory kept free beyond what the learned batch footprint needs: the estimate is a line
# through measured peaks, and the allocator rounds blocks up.
MEMORY_MARGIN_FRACTION = 0.05
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
    if initialised_cuda() is not None:
        log.warning("CUDA already initialised; expandable segments cannot take effect")
    var = next((v for v in ALLOC_CONF_VARS if environ.get(v)), "PYTORCH_CUDA_ALLOC_CONF")
    current = environ.get(var, "")
    environ[var] = f"{current},{EXPANDABLE}" if current else EXPANDABLE
    return f"set {var}={environ[var]}"


def resolve_device(setting: str) -> str:
    """``auto`` -> ``cuda`` when a GPU is usable, else ``cpu`` (importing torch to ask)."""
    if setting == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return setting


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether a model error means the device ran out of memory."""
    torch = loaded_torch()  # not loaded: no CUDA allocation could have failed
    if torch is not None and isinstance(exc, torch.cuda.OutOfMemoryError):
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

    def _cuda(self) -> ModuleType | None:
        """``torch.cuda`` where this monitor's device is a GPU that this process has initialised;
        None otherwise, when there is nothing to read or release."""
        return initialised_cuda() if self.is_cuda else None

    def stats(self) -> dict[str, float]:
        """Allocator statistics in bytes and counts; empty on CPU (nothing applies)."""
        cuda = self._cuda()
        if cuda is None:
            return {}
        raw = cuda.memory_stats(self.device)
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
        cuda = self._cuda()
        if cuda is None:
            return False
        cuda.empty_cache()
        self.releases += 1
        log.info("released cached device memory after idle period", extra=self.stats())
        return True

    def begin_batch(self) -> float | None:
        """Start measuring a batch's peak: the bytes allocated now (None off CUDA)."""
        cuda = self._cuda()
        if cuda is None:
            return None
        cuda.reset_peak_memory_stats(self.device)
        return float(cuda.memory_allocated(self.device))

    def batch_peak_bytes(self, allocated_before: float | None) -> float | None:
        """The batch's peak allocation above ``allocated_before`` (from :meth:`begin_batch`)."""
        cuda = self._cuda()
        if allocated_before is None or cuda is None:
            return None
        return float(cuda.max_memory_allocated(self.device)) - allocated_before

    def headroom_bytes(self) -> float | None:
        """What the device can still give this process: free memory plus the allocator's
        reserved but unused blocks, less :data:`MEMORY_MARGIN_FRACTION` of the device (None
        off CUDA)."""
        cuda = self._cuda()
        if cuda is None:
            return None
        free, total = cuda.mem_get_info(self.device)
        cached = cuda.memory_reserved(self.device) - cuda.memory_allocated(self.device)
        return float(free + cached) - MEMORY_MARGIN_FRACTION * total

    def after_out_of_memory(self) -> None:
        """Give the failed batch's freed blocks back so the halves start from a clean pool."""
        cuda = self._cuda()
        if cuda is not None:
            cuda.empty_cache()


# --- the memory-aware batch cap -------------------------------------------------------------

MEMORY_CAP_REASONS = ("unlearned", "fits", "memory")


class BatchFootprint:
    """The device memory a batch of ``rows`` needs, learned from the batches that ran.

    Why: halving after an out-of-memory error finds the limit by failing at it, and a co-tenant
    that grows its share makes the same size fail again. Each batch's peak allocation above what
    was held before it (activations, workspace) is recorded by executed size; the estimate is the
    line ``fixed + per_row * rows`` whose slope is the least-squares one through the highest peak
    seen at each size, raised until no observation lies above it, so it never promises a size less
    memory than that size was seen to take.
    """

    def __init__(self, sizes_kept: int = 32) -> None:
        self.sizes_kept = sizes_kept
        self._peaks: dict[int, float] = {}

    def observe(self, rows: int, peak_bytes: float) -> None:
        """Record one finished batch of ``rows`` that took ``peak_bytes`` above its start."""
        if rows < 1 or peak_bytes < 0:
            return
        self._peaks[rows] = max(peak_bytes, self._peaks.get(rows, 0.0))
        if len(self._peaks) > self.sizes_kept:  # keep the sizes that bound the line
            middle = sorted(self._peaks)[len(self._peaks) // 2]
            del self._peaks[middle]

    def line(self) -> tuple[float, float] | None:
        """``(fixed_bytes, bytes_per_row)``, or None before two sizes were measured.

        One size cannot tell fixed from per-row memory: taking it all as per-row would pin a
        model with a large fixed part to the size it first ran at, and it would never learn
        more. Warm-up runs every power-of-two size, so on a GPU the line is known before serving.
        """
        if len(self._peaks) < 2:
            return None
        xs = list(self._peaks)
        mean_x = sum(xs) / len(xs)
        mean_y = sum(self._peaks.values()) / len(xs)
        spread = sum((x - mean_x) ** 2 for x in xs)
        slope = sum((x - mean_x) * (y - mean_y) for x, y in self._peaks.items()) / spread
        slope = max(slope, 0.0)
        fixed = max(y - slope * x for x, y in self._peaks.items())
        return max(fixed, 0.0), slope


def memory_cap(
    headroom_bytes: float | None, line: tuple[float, float] | None, maximum: int
) -> tuple[int, str]:
    """The largest batch whose learned footprint fits ``headroom_bytes``, and why.

    ``headroom_bytes`` is what the device can still give this process (free memory plus the
    allocator's reserved but unused blocks, less a safety margin); None means no device memory
    to watch (CPU). Reasons: ``unlearned`` (nothing measured, or no device), ``fits`` (the
    maximum fits), ``memory`` (memory is what bounds the batch). Never below 1: a single row
    that does not fit is the out-of-memory path's to report.
    """
    if headroom_bytes is None or line is None:
        return maximum, "unlearned"
    fixed, per_row = line
    if per_row <= 0:
        return (maximum, "fits") if fixed <= headroom_bytes else (1, "memory")
    rows = int((headroom_bytes - fixed) // per_row)
    if rows >= maximum:
        return maximum, "fits"
    return max(1, rows), "memory"
