"""Garbage-collector pauses, kept off a server's latency tail and exported.

CPython's cyclic collector stops the interpreter while it walks the objects of a generation.
After start-up a serving process holds hundreds of thousands of long-lived objects (torch,
numpy, the web stack, the model's modules); a full collection walks all of them, and it runs
every few seconds under load because requests allocate. Measured on the batcher, such a
collection stalled every request in flight for longer than the latency SLO, which alone failed
the p99 of a load the server otherwise held (docs/batcher-serving.md has the run).

:func:`freeze_startup_heap` moves what exists once the server is up into the permanent
generation (``gc.freeze``, as large Python web fleets do after forking their workers): later
collections walk only what serving allocated since, so a full one costs little. Nothing is
leaked; frozen objects are still freed by reference counting, only cycles among them wait.
:class:`GcPauses` times every collection, so the effect (or its absence) shows on ``/metrics``.
"""

from __future__ import annotations

import gc
import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_PAUSE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0)
GENERATIONS = ("0", "1", "2")


def freeze_startup_heap(collect: bool = True) -> int:
    """Exempt every object alive now from future collections; the number of objects frozen.

    Call when start-up has built what the process keeps until it exits. ``collect`` first frees
    what start-up left unreachable, a full walk of the heap: do that before the server listens,
    then once more with ``collect=False`` (a list splice, no walk) for what listening added.
    """
    if collect:
        gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


class GcPauses:
    """``<prefix>_gc_pause_seconds{generation}``: how long each collection stopped the process,
    ``<prefix>_gc_collected_objects_total{generation}`` and ``<prefix>_gc_frozen_objects``."""

    def __init__(self, registry: CollectorRegistry, prefix: str) -> None:
        self.pauses = Histogram(
            f"{prefix}_gc_pause_seconds",
            "Time one cyclic garbage collection stopped the interpreter (every thread).",
            ["generation"],
            buckets=_PAUSE_BUCKETS,
            registry=registry,
        )
        self.collected = Counter(
            f"{prefix}_gc_collected_objects",
            "Unreachable objects the cyclic collector freed.",
            ["generation"],
            registry=registry,
        )
        self.frozen = Gauge(
            f"{prefix}_gc_frozen_objects",
            "Objects exempt from collection since start-up (gc.freeze).",
            registry=registry,
        )
        self.frozen.set_function(gc.get_freeze_count)
        for generation in GENERATIONS:  # every series exists from the start
            self.pauses.labels(generation)
            self.collected.labels(generation)
        self._started = 0.0

    def install(self) -> None:
        """Start timing collections (one callback per process; :meth:`remove` stops it)."""
        if self._on_collection not in gc.callbacks:
            gc.callbacks.append(self._on_collection)

    def remove(self) -> None:
        if self._on_collection in gc.callbacks:
            gc.callbacks.remove(self._on_collection)

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation = str(info["generation"])
        self.pauses.labels(generation).observe(time.perf_counter() - self._started)
        if info["collected"]:
            self.collected.labels(generation).inc(info["collected"])
