"""Xid errors of the physical GPUs, waited for on a thread and kept until the collector drains them.

The thread waits on an NVML event set with a timeout, so :meth:`XidEvents.stop` can end it; an
event names its GPU by UUID and, on a MIG GPU, its GPU instance, which picks the MIG device.
A failing wait is not logged here: :meth:`XidEvents.drain` raises it, so the collector counts it
and logs it once per outage, like every other failed read.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from typing import Any

import pynvml

from exporter.model import DeviceInfo, XidEvent
from exporter.sources.nvml.device import NVMLDevice, text
from exporter.sources.nvml.errors import error_reason

log = logging.getLogger(__name__)

_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of an event not tied to a MIG instance


class XidWaitError(RuntimeError):
    """NVML's wait on the event set is failing; ``reason`` is the NVML error, as the collector
    labels failures."""

    def __init__(self, reason: str, error: str) -> None:
        super().__init__(f"waiting for Xid events failed: {error}")
        self.reason = reason


class XidEvents:
    """The event set and its thread for ``devices``; ``on_exit`` runs when the thread ends."""

    def __init__(
        self,
        devices: list[NVMLDevice],
        timeout_ms: int,
        clock: Callable[[], float],
        on_exit: Callable[[], None],
    ) -> None:
        self._devices = devices
        self.timeout_ms = timeout_ms
        self._clock = clock
        self._on_exit = on_exit
        self._events: list[tuple[DeviceInfo, XidEvent]] = []
        self._wait_failure: tuple[str, str] | None = None  # (reason, error) of the last wait
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._event_set: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Register every physical GPU and start waiting; without one, Xid events are off."""
        physical = [d for d in self._devices if d.parent is None]
        if not physical:
            return
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("Xid events unavailable: %s", exc, extra={"reason": error_reason(exc)})
            return
        registered = 0
        for dev in physical:
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    dev.handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set
                )
                registered += 1
            except pynvml.NVMLError as exc:
                log.warning(
                    "Xid events unavailable for one GPU",
                    extra={"gpu": dev.info.index, "reason": error_reason(exc)},
                )
        if registered == 0:
            self.free()
            return
        self._thread = threading.Thread(target=self._loop, name="nvml-xid-events", daemon=True)
        self._thread.start()

    def drain(self) -> list[tuple[DeviceInfo, XidEvent]]:
        """The events since the last drain. With none, and the last wait failed, raises
        :class:`XidWaitError` instead: events already recorded are handed over first, never
        held back behind the failure."""
        with self._lock:
            events, self._events = self._events, []
            failure = self._wait_failure
        if failure is not None and not events:
            raise XidWaitError(*failure)  # a new one each time: a re-raised one grows its trace
        return events

    def stop(self) -> None:
        """Ask the thread to end and wait one timeout for it; it may still be inside NVML."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.timeout_ms / 1000.0 + 2.0)
            if self._thread.is_alive():
                log.warning("NVML event thread still waiting inside NVML; shutdown deferred")

    def waiting(self) -> bool:
        """Whether the thread is (still) inside NVML, seen from any other thread."""
        thread = self._thread
        return thread is not None and thread.is_alive() and thread is not threading.current_thread()

    def free(self) -> None:
        """Give the event set back to NVML (once the thread no longer waits on it)."""
        if self._event_set is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None

    def _loop(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(self._event_set, self.timeout_ms)
                except pynvml.NVMLError_Timeout:
                    self._set_wait_failure(None)  # the wait works; there was just no event
                    continue
                except pynvml.NVMLError as exc:
                    self._set_wait_failure((error_reason(exc), str(exc)))
                    self._stop.wait(1.0)
                    continue
                self._set_wait_failure(None)
                if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    self._record(data)
        finally:
            self._on_exit()

    def _set_wait_failure(self, failure: tuple[str, str] | None) -> None:
        with self._lock:
            self._wait_failure = failure

    def _record(self, data: Any) -> None:
        try:
            gpu_uuid = text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:
            log.warning("Xid from an unidentifiable GPU", extra={"reason": error_reason(exc)})
            return
        target = None
        for dev in self._devices:
            if dev.info.uuid != gpu_uuid:
                continue
            if dev.info.mig_instance_id is None and target is None:
                target = dev.info
            if data.gpuInstanceId != _NO_INSTANCE and dev.info.mig_instance_id == (
                data.gpuInstanceId
            ):
                target = dev.info
        if target is None:
            log.warning("Xid from an unknown GPU", extra={"uuid": gpu_uuid, "xid": data.eventData})
            return
        event = XidEvent(xid=int(data.eventData), timestamp=self._clock())
        log.info("Xid error", extra={"gpu": target.index, "xid": event.xid})
        with self._lock:
            self._events.append((target, event))
