"""The GPUs NVML sees and, where MIG is enabled, their MIG instances, with DCGM's labels."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pynvml

from exporter.model import DeviceInfo
from exporter.sources.nvml.device import NVMLDevice, text
from exporter.sources.nvml.gpm import allocate_samples, gpm_supported


def enumerate_devices() -> list[NVMLDevice]:
    """Every GPU, each followed by its MIG instances when MIG is enabled on it."""
    driver = text(pynvml.nvmlSystemGetDriverVersion())
    devices: list[NVMLDevice] = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            minor = pynvml.nvmlDeviceGetMinorNumber(handle)
        except pynvml.NVMLError:
            minor = index
        info = DeviceInfo(
            index=index,
            uuid=text(pynvml.nvmlDeviceGetUUID(handle)),
            pci_bus_id=text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            model_name=text(pynvml.nvmlDeviceGetName(handle)),
            device=f"nvidia{minor}",
            driver_version=driver,
        )
        gpm = gpm_supported(handle)
        devices.append(_device(info, handle, None, gpm))
        devices.extend(_mig_devices(info, handle, gpm))
    return devices


def _device(info: DeviceInfo, handle: Any, parent: Any, gpm: bool) -> NVMLDevice:
    samples = allocate_samples() if gpm else []
    return NVMLDevice(info, handle, parent, bool(samples), samples)


def _mig_devices(parent: DeviceInfo, handle: Any, gpm: bool) -> list[NVMLDevice]:
    try:
        current, _pending = pynvml.nvmlDeviceGetMigMode(handle)
    except pynvml.NVMLError:
        return []  # no MIG on this GPU
    if current != pynvml.NVML_DEVICE_MIG_ENABLE:
        return []
    found = []
    for slot in range(pynvml.nvmlDeviceGetMaxMigDeviceCount(handle)):
        try:
            mig = pynvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, slot)
        except pynvml.NVMLError_NotFound:
            continue  # an empty slot
        info = replace(  # a MIG instance carries its parent GPU's labels plus its own
            parent,
            mig_profile=_mig_profile(mig),
            mig_instance_id=pynvml.nvmlDeviceGetGpuInstanceId(mig),
            mig_uuid=text(pynvml.nvmlDeviceGetUUID(mig)),
        )
        found.append(_device(info, mig, handle, gpm))
    return found


def _mig_profile(mig: Any) -> str:
    """``1g.10gb`` from the MIG device name (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``)."""
    name = text(pynvml.nvmlDeviceGetName(mig))
    _, sep, profile = name.rpartition("MIG ")
    if sep:
        return profile.strip()
    attrs = pynvml.nvmlDeviceGetAttributes(mig)
    return f"{attrs.gpuInstanceSliceCount}g.{round(attrs.memorySizeMB / 1024)}gb"
