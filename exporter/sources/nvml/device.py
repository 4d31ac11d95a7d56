"""One GPU or MIG instance as the source holds it: its labels, NVML handles and GPM samples."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

from exporter.model import DeviceInfo


@dataclass
class NVMLDevice:
    info: DeviceInfo
    handle: Any  # the NVML handle; for a MIG instance, the MIG device handle
    parent: Any = None  # the physical GPU's handle, for MIG instances
    gpm: bool = False
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, spare]
    gpm_primed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


def text(value: str | bytes) -> str:
    """An NVML string, which some bindings return as bytes."""
    return value.decode() if isinstance(value, bytes) else value
