"""GPU sources: NVML for real GPUs, a simulator for everything else (see ``exporter.model``)."""

from exporter.sources.faults import Fault, parse_fault
from exporter.sources.nvml import NoDriverError, NVMLSource
from exporter.sources.profiles import LoadProfile, load_profile
from exporter.sources.simulated import SimulatedSource

__all__ = [
    "Fault",
    "LoadProfile",
    "NVMLSource",
    "NoDriverError",
    "SimulatedSource",
    "load_profile",
    "parse_fault",
]
