"""Readings shared by every source."""

from __future__ import annotations

from exporter.model import GPU_IS_LOST, WHOLE_DEVICE, DeviceReading


def lost_reading() -> DeviceReading:
    """What a GPU that fell off the bus reads as: nothing, and one device-wide ``gpu_is_lost``."""
    return DeviceReading(errors={WHOLE_DEVICE: GPU_IS_LOST})
