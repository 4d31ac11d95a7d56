"""What a GPU source hands the collector: device identities and one reading per device.

Sources (NVML, simulated) produce these; the collector turns them into a snapshot; renderers turn
a snapshot into exposition text. Values are keyed by DCGM field name (see ``exporter.fields``) and
expressed in DCGM's units (MiB, W, MHz, %, C, mJ, ratio 0..1 for profiling fields), so one
catalogue converts them to either naming scheme.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

WHOLE_DEVICE = "all"
"""``DeviceReading.errors`` key (and ``field`` label value) meaning the device as a whole failed:
no field could be read, e.g. ``gpu_is_lost`` or a read that missed the collection deadline."""

GPU_IS_LOST = "gpu_is_lost"
"""The reason every source gives, under :data:`WHOLE_DEVICE`, for a GPU that fell off the bus
(NVML's ``GPU_IS_LOST``); known up front, so its error counter can exist before it happens."""


@dataclass(frozen=True)
class DeviceInfo:
    """A GPU, or a MIG instance of one, as dcgm-exporter labels it."""

    index: int  # NVML index of the physical GPU: label ``gpu``
    uuid: str  # ``GPU-...`` of the physical GPU: label ``UUID``
    pci_bus_id: str  # e.g. ``00000000:3B:00.0``
    model_name: str  # e.g. ``NVIDIA H100 80GB HBM3``: label ``modelName``
    device: str  # ``nvidia0``
    driver_version: str
    mig_profile: str | None = None  # ``GPU_I_PROFILE`` e.g. ``1g.10gb``
    mig_instance_id: int | None = None  # ``GPU_I_ID``
    mig_uuid: str | None = None  # ``MIG-...``; how the kubelet names a MIG device


@dataclass(frozen=True)
class XidEvent:
    """One Xid error reported by the driver."""

    xid: int
    timestamp: float  # unix seconds


@dataclass
class DeviceReading:
    """The result of reading one device once.

    A field the device does not support is simply absent from ``values`` (never zero). A field that
    failed is absent from ``values`` and present in ``errors`` with a short reason
    (``not_supported`` is not an error; use ``gpu_is_lost``, ``timeout``, ``unknown_error``, ...);
    the key :data:`WHOLE_DEVICE` says the whole device failed.
    """

    values: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


class GPUSource(Protocol):
    """Where readings come from. ``read`` may block (a hung driver); the collector bounds it."""

    name: str

    def devices(self) -> list[DeviceInfo]: ...

    def read(self, device: DeviceInfo) -> DeviceReading: ...

    def drain_xid_events(self) -> list[tuple[DeviceInfo, XidEvent]]:
        """Xid events seen since the last call (from the source's event thread). Raises, with a
        ``reason`` attribute, while the source cannot receive them: the collector counts and
        logs that like a failed read."""
        ...

    def close(self) -> None: ...
