"""The profiling fields, from NVML GPM: two samples a collection apart, their ratios in DCGM units.

Every read takes one new sample into the spare buffer and compares it with the previous one, so
the ratios cover the time between two collections; the first read of a device only primes it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Any

import pynvml

from exporter.fields import MIB
from exporter.model import DeviceReading
from exporter.sources.nvml.device import NVMLDevice
from exporter.sources.nvml.errors import code_reason, error_reason

log = logging.getLogger(__name__)

# GPM metric -> (DCGM field, factor from the GPM unit to DCGM's unit)
GPM_METRICS: tuple[tuple[int, str, float], ...] = (
    (pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, "DCGM_FI_PROF_GR_ENGINE_ACTIVE", 0.01),
    (pynvml.NVML_GPM_METRIC_SM_UTIL, "DCGM_FI_PROF_SM_ACTIVE", 0.01),
    (pynvml.NVML_GPM_METRIC_SM_OCCUPANCY, "DCGM_FI_PROF_SM_OCCUPANCY", 0.01),
    (pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", 0.01),
    (pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL, "DCGM_FI_PROF_DRAM_ACTIVE", 0.01),
    (pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC, "DCGM_FI_PROF_PCIE_TX_BYTES", MIB),
    (pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC, "DCGM_FI_PROF_PCIE_RX_BYTES", MIB),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC, "DCGM_FI_PROF_NVLINK_TX_BYTES", MIB),
    (pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC, "DCGM_FI_PROF_NVLINK_RX_BYTES", MIB),
)
PROFILING_FIELDS = tuple(name for _, name, _ in GPM_METRICS)


def gpm_supported(handle: Any) -> bool:
    try:
        return bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except pynvml.NVMLError:
        return False


def allocate_samples() -> list[Any]:
    """The two sample buffers a device reads into; none when NVML cannot allocate them."""
    try:
        return [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
    except pynvml.NVMLError as exc:
        log.warning("GPM samples unavailable", extra={"reason": error_reason(exc)})
        return []


def free_samples(dev: NVMLDevice) -> None:
    """Give the device's sample buffers back to NVML (at shutdown)."""
    for sample in dev.gpm_samples:
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlGpmSampleFree(sample)
    dev.gpm_samples = []


def read_gpm(dev: NVMLDevice, reading: DeviceReading) -> None:
    """Add the profiling fields to ``reading``; ``NVMLError_GpuIsLost`` propagates."""
    previous, spare = dev.gpm_samples
    try:
        if dev.parent is not None:
            pynvml.nvmlGpmMigSampleGet(dev.parent, dev.info.mig_instance_id, spare)
        else:
            pynvml.nvmlGpmSampleGet(dev.handle, spare)
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError_NotSupported:
        dev.gpm = False
        return
    except pynvml.NVMLError as exc:
        dev.gpm_primed = False
        for name in PROFILING_FIELDS:
            reading.errors[name] = error_reason(exc)
        return
    dev.gpm_samples = [spare, previous]
    if not dev.gpm_primed:
        dev.gpm_primed = True  # one sample only: the next read can compute rates
        return
    request = pynvml.c_nvmlGpmMetricsGet_t()
    request.version = pynvml.NVML_GPM_METRICS_GET_VERSION
    request.numMetrics = len(GPM_METRICS)
    request.sample1 = previous
    request.sample2 = spare
    for slot, (metric_id, _, _) in enumerate(GPM_METRICS):
        request.metrics[slot].metricId = metric_id
    try:
        result = pynvml.nvmlGpmMetricsGet(request)
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError as exc:
        for name in PROFILING_FIELDS:
            reading.errors[name] = error_reason(exc)
        return
    for slot, (_, name, factor) in enumerate(GPM_METRICS):
        metric = result.metrics[slot]
        if metric.nvmlReturn == pynvml.NVML_SUCCESS:
            reading.values[name] = metric.value * factor
        elif metric.nvmlReturn != pynvml.NVML_ERROR_NOT_SUPPORTED:
            reading.errors[name] = code_reason(metric.nvmlReturn)
