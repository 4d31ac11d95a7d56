"""The NVML source: real GPUs through nvidia-ml-py (``import pynvml``).

Each field is read with its own NVML call so one unsupported or failing query costs only that
field: ``NVMLError_NotSupported`` leaves the field absent (never zero), any other NVML error is
reported in ``DeviceReading.errors`` under the error's NVML name in snake_case, and
``NVMLError_GpuIsLost`` ends the reading for the whole device. Values are converted to DCGM units
here (mW -> W, bytes -> MiB, GPM percent -> ratio, GPM MiB/s -> bytes/s).

Profiling fields come from NVML GPM: every read takes one new GPM sample and compares it with the
previous one, so the ratios cover the time between two collections. Xid errors arrive on an event
thread that waits on an NVML event set with a timeout, so ``close`` can stop it.

One job a module: :mod:`.source` (the source's lifecycle: open, concurrent reads, a shutdown that
never waits on a hung NVML call), :mod:`.enumeration` (GPUs and MIG instances), :mod:`.reading`
(one device's reading), :mod:`.queries` (each NVML query and the DCGM fields it fills),
:mod:`.gpm` (the profiling fields), :mod:`.xid` (the Xid event thread), :mod:`.errors` (NVML
errors as label values).
"""

from exporter.sources.nvml.errors import NoDriverError, error_reason
from exporter.sources.nvml.source import NVMLSource

__all__ = ["NVMLSource", "NoDriverError", "error_reason"]
