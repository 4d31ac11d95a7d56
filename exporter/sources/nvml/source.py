"""The NVML source's lifecycle: open NVML, read devices concurrently, shut down without hanging.

A read or the Xid event wait can block inside NVML; :meth:`NVMLSource.close` never waits on them,
and NVML is shut down by whichever of them returns last.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection

import pynvml

from exporter.model import DeviceInfo, DeviceReading, XidEvent
from exporter.sources.nvml.device import NVMLDevice
from exporter.sources.nvml.enumeration import enumerate_devices
from exporter.sources.nvml.errors import NoDriverError
from exporter.sources.nvml.gpm import free_samples
from exporter.sources.nvml.reading import read_device
from exporter.sources.nvml.xid import XidEvents


class NVMLSource:
    """Real GPUs (and their MIG instances) through NVML; implements ``GPUSource``.

    Construct with ``NVMLSource.open()``.
    """

    name = "nvml"

    def __init__(
        self,
        devices: list[NVMLDevice],
        event_timeout_ms: int,
        clock: Callable[[], float],
        fields: Collection[str] | None = None,
    ) -> None:
        self._devices = devices
        self._wanted = frozenset(fields) if fields is not None else None
        self._by_key = {(d.info.index, d.info.mig_instance_id): d for d in devices}
        self._lock = threading.Lock()
        self._in_flight = 0
        self._closing = False
        self._released = False
        self._xids = XidEvents(devices, event_timeout_ms, clock, on_exit=self._release_if_idle)

    @classmethod
    def open(
        cls,
        event_timeout_ms: int = 500,
        clock: Callable[[], float] = time.time,
        fields: Collection[str] | None = None,
    ) -> NVMLSource:
        """Initialize NVML, enumerate GPUs and MIG instances, start the Xid event thread.

        ``fields`` (DCGM names; default all) limits the NVML calls to those that read one of
        them. Raises ``NoDriverError`` when NVML cannot be initialized.
        """
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoDriverError(
                f"no NVIDIA driver was found (NVML init failed: {exc}); to run without GPUs use "
                f"--source simulated (e.g. --source simulated --gpus 8)"
            ) from exc
        try:
            source = cls(enumerate_devices(), event_timeout_ms, clock, fields)
            source._xids.start()
        except pynvml.NVMLError:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            raise
        return source

    # -- GPUSource -----------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        return [d.info for d in self._devices]

    def read(self, device: DeviceInfo) -> DeviceReading:
        """Read every field of one device. May block inside NVML; the collector bounds it."""
        dev = self._by_key[(device.index, device.mig_instance_id)]
        with self._lock:
            if self._closing:
                raise RuntimeError("NVML source is closed")
            self._in_flight += 1
        try:
            with dev.lock:
                return read_device(dev, self._wanted)
        finally:
            with self._lock:
                self._in_flight -= 1
            self._release_if_idle()

    def drain_xid_events(self) -> list[tuple[DeviceInfo, XidEvent]]:
        return self._xids.drain()

    def close(self) -> None:
        """Stop the event thread and shut NVML down without waiting on a hung NVML call.

        If a read or the event wait is still inside NVML, the shutdown happens when the last of
        them returns.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._xids.stop()
        self._release_if_idle()

    def _release_if_idle(self) -> None:
        """Free NVML resources once closing and nothing is inside NVML any more."""
        with self._lock:
            busy = self._in_flight > 0 or self._xids.waiting()
            if not self._closing or self._released or busy:
                return
            self._released = True
        self._xids.free()
        for dev in self._devices:
            free_samples(dev)
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()
