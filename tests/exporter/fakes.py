"""A scripted GPUSource for collector and render tests: values, errors, hangs and Xids on demand."""

from __future__ import annotations

import threading

from exporter.model import DeviceInfo, DeviceReading, XidEvent


def device(index: int, **overrides: object) -> DeviceInfo:
    """A plausible H100 as NVML describes it."""
    fields: dict[str, object] = {
        "index": index,
        "uuid": f"GPU-{index:08d}-aaaa-bbbb-cccc-000000000000",
        "pci_bus_id": f"00000000:{0x18 + index:02X}:00.0",
        "model_name": "NVIDIA H100 80GB HBM3",
        "device": f"nvidia{index}",
        "driver_version": "550.54.15",
    }
    fields.update(overrides)
    return DeviceInfo(**fields)  # type: ignore[arg-type]


class ScriptedSource:
    """Returns ``values[index]`` for each read; ``hang(index)`` makes reads block until released."""

    name = "scripted"

    def __init__(self, devices: list[DeviceInfo], values: dict[str, float] | None = None) -> None:
        self._devices = devices
        self.values: dict[int, dict[str, float]] = {
            i: dict(values or {"DCGM_FI_DEV_GPU_UTIL": 50.0 + i}) for i in range(len(devices))
        }
        self.errors: dict[int, dict[str, str]] = {}
        self.raises: dict[int, BaseException] = {}
        self.drain_raises: BaseException | None = None  # what draining Xid events raises
        self.reads: dict[int, int] = dict.fromkeys(range(len(devices)), 0)
        self._hangs: dict[int, threading.Event] = {}
        self._xids: list[tuple[DeviceInfo, XidEvent]] = []
        self._lock = threading.Lock()
        self.entered_hang = threading.Event()

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def read(self, device: DeviceInfo) -> DeviceReading:
        i = self._devices.index(device)
        with self._lock:
            self.reads[i] += 1
            gate = self._hangs.get(i)
        if gate is not None:
            self.entered_hang.set()
            gate.wait()
        if i in self.raises:
            raise self.raises[i]
        return DeviceReading(values=dict(self.values[i]), errors=dict(self.errors.get(i, {})))

    def hang(self, index: int) -> None:
        with self._lock:
            self._hangs[index] = threading.Event()

    def release(self, index: int) -> None:
        with self._lock:
            gate = self._hangs.pop(index, None)
        if gate is not None:
            gate.set()

    def add_xid(self, index: int, xid: int, timestamp: float) -> None:
        with self._lock:
            self._xids.append((self._devices[index], XidEvent(xid, timestamp)))

    def add_xid_for(self, info: DeviceInfo, event: XidEvent) -> None:
        with self._lock:
            self._xids.append((info, event))

    def drain_xid_events(self) -> list[tuple[DeviceInfo, XidEvent]]:
        if self.drain_raises is not None:
            raise self.drain_raises
        with self._lock:
            events, self._xids = self._xids, []
        return events

    def close(self) -> None:
        for index in list(self._hangs):
            self.release(index)
