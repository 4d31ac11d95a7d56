"""One device's reading: the queries that fill a wanted field, then the profiling fields."""

from __future__ import annotations

import pynvml

from exporter.model import DeviceReading
from exporter.sources.nvml.device import NVMLDevice
from exporter.sources.nvml.gpm import PROFILING_FIELDS, read_gpm
from exporter.sources.nvml.queries import gpu_queries, mig_queries, read_field
from exporter.sources.readings import lost_reading


def read_device(dev: NVMLDevice, wanted: frozenset[str] | None) -> DeviceReading:
    """Every field of ``dev`` in ``wanted`` (None: all); a lost GPU reads as lost, not failed.

    The caller holds ``dev.lock``: the GPM samples are the device's, one read at a time.
    """
    reading = DeviceReading()
    queries = mig_queries(dev.handle) if dev.parent is not None else gpu_queries(dev.handle)
    try:
        for names, query in queries:
            if wanted is None or not wanted.isdisjoint(names):
                read_field(reading, names, query)
        if dev.gpm and (wanted is None or not wanted.isdisjoint(PROFILING_FIELDS)):
            read_gpm(dev, reading)
    except pynvml.NVMLError_GpuIsLost:
        return lost_reading()
    return reading
