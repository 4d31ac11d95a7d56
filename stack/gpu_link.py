"""Simulated GPUs that follow the batcher's real work: worker slot *i* drives GPU *i*.

Each batcher worker counts the time its device spends executing batches
(``autoglm_batcher_device_busy_seconds_total``: online and best-effort batches together, the sum
of ``autoglm_batcher_class_busy_seconds_total`` over its classes). Its rate over the last few
seconds is the busy fraction a real GPU under that worker would show, so it becomes the
simulated GPU's utilization
through ``SimulatedSource.set_external_load``; power, temperature, memory and clocks then follow
from the simulation's physics. A slot with no worker is an idle GPU (0 %).

The link also tells the exporter which "pod" holds each GPU, as the kubelet's pod-resources API
would in a cluster, so the exporter's series carry ``namespace``/``pod``/``container`` labels and
the dashboards' per-workload panels work on a laptop too.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from stack.window import MetricsWindow

log = logging.getLogger(__name__)

BUSY_COUNTER = "autoglm_batcher_device_busy_seconds_total"
CLASS_BUSY_COUNTER = "autoglm_batcher_class_busy_seconds_total"
ONLINE = "online"  # the batcher's request classes, as its ``class`` label spells them
BEST_EFFORT = "best_effort"
NAMESPACE = "local"
WORKLOAD = "batcher"


class ExternalLoad(Protocol):
    def set_external_load(self, index: int, utilization: float | None) -> None: ...


def busy_fraction(window: MetricsWindow, endpoint: str, seconds: float, now: float) -> float | None:
    """The worker's busy fraction (0..1) over about the last ``seconds``; None without data."""
    rate = window.rate(endpoint, BUSY_COUNTER, seconds, now)
    return None if rate is None else min(1.0, max(0.0, rate))


def slot_loads(
    slots: Sequence[str | None], busy: Callable[[str], float | None]
) -> dict[int, float]:
    """GPU index -> utilization for every slot: the worker's busy fraction, 0 when the slot is
    empty or its worker has no reading yet (a starting worker does no work)."""
    loads = {}
    for index, endpoint in enumerate(slots):
        value = busy(endpoint) if endpoint is not None else None
        loads[index] = value if value is not None else 0.0
    return loads


@dataclass(frozen=True)
class PodRef:
    namespace: str
    pod: str
    container: str


class GPULink:
    """Pushes each worker's busy fraction into its simulated GPU; serves the GPU->pod map."""

    def __init__(
        self,
        source: ExternalLoad,
        gpu_uuids: Sequence[str],
        window: MetricsWindow,
        workers: Callable[[], Sequence[str]],
        rate_seconds: float = 3.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.source, self.gpu_uuids, self.window = source, list(gpu_uuids), window
        self.workers, self.rate_seconds, self.clock = workers, rate_seconds, clock
        self._slots: list[str | None] = [None] * len(self.gpu_uuids)
        self.last_success: float | None = None

    def slots(self) -> list[str | None]:
        """Worker endpoint per GPU index (None: no worker on that GPU)."""
        names = list(self.workers())[: len(self.gpu_uuids)]
        return names + [None] * (len(self.gpu_uuids) - len(names))

    def update(self, now: float) -> dict[int, float]:
        """One step: read every worker's busy fraction and set its GPU's load."""
        self._slots = self.slots()
        loads = slot_loads(
            self._slots, lambda e: busy_fraction(self.window, e, self.rate_seconds, now)
        )
        for index, load in loads.items():
            self.source.set_external_load(index, load)
        self.last_success = self.clock()
        return loads

    # -- exporter.service.AttributionSource ----------------------------------------------------

    @property
    def healthy(self) -> bool:
        return True

    def attribution(self) -> Mapping[str, Sequence[PodRef]]:
        return {
            self.gpu_uuids[i]: [PodRef(NAMESPACE, f"{WORKLOAD}-{i}", WORKLOAD)]
            for i, endpoint in enumerate(self._slots)
            if endpoint is not None
        }
