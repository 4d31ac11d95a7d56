"""Each NVML query of a device with the DCGM fields it fills, its values in DCGM units.

One query a call, so one unsupported or failing query costs only its own fields (see
:func:`read_field`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pynvml

from exporter.fields import MIB
from exporter.model import DeviceReading
from exporter.sources.nvml.errors import error_reason

ALL_SCOPES = 0xFFFFFFFF  # field-value scope meaning "summed over all NVLink links"
MEMORY_FIELDS = (
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_FB_TOTAL",
)

Query = tuple[tuple[str, ...], Callable[[], dict[str, float]]]
"""The DCGM fields a query fills, and the query."""


def read_field(
    reading: DeviceReading, names: tuple[str, ...], query: Callable[[], dict[str, float]]
) -> None:
    """Add the query's values to ``reading``: an unsupported query leaves its fields absent,
    another NVML error is reported per field, ``NVMLError_GpuIsLost`` propagates."""
    try:
        reading.values.update(query())
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError_NotSupported:
        return
    except pynvml.NVMLError as exc:
        for name in names:
            reading.errors[name] = error_reason(exc)


def mig_queries(h: Any) -> list[Query]:
    """Per MIG instance NVML only knows memory (and GPM); the rest is the parent GPU's."""
    return [(MEMORY_FIELDS, lambda: _memory(h))]


def gpu_queries(h: Any) -> list[Query]:
    """Each NVML query of one physical GPU with the DCGM fields it fills."""
    return [
        (("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL"), lambda: _utilization(h)),
        (MEMORY_FIELDS, lambda: _memory(h)),
        (
            ("DCGM_FI_DEV_POWER_USAGE",),
            lambda: {"DCGM_FI_DEV_POWER_USAGE": pynvml.nvmlDeviceGetPowerUsage(h) / 1000.0},
        ),
        (
            ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",),
            lambda: {
                "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": float(
                    pynvml.nvmlDeviceGetTotalEnergyConsumption(h)
                )
            },
        ),
        (
            ("DCGM_FI_DEV_POWER_MGMT_LIMIT",),
            lambda: {
                "DCGM_FI_DEV_POWER_MGMT_LIMIT": pynvml.nvmlDeviceGetPowerManagementLimit(h) / 1000.0
            },
        ),
        (
            ("DCGM_FI_DEV_GPU_TEMP",),
            lambda: {
                "DCGM_FI_DEV_GPU_TEMP": float(
                    pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)
                )
            },
        ),
        (
            ("DCGM_FI_DEV_MEMORY_TEMP",),
            lambda: _field_value(h, "DCGM_FI_DEV_MEMORY_TEMP", pynvml.NVML_FI_DEV_MEMORY_TEMP),
        ),
        (
            ("DCGM_FI_DEV_SLOWDOWN_TEMP",),
            lambda: _threshold(h, "DCGM_FI_DEV_SLOWDOWN_TEMP", "SLOWDOWN"),
        ),
        (
            ("DCGM_FI_DEV_SHUTDOWN_TEMP",),
            lambda: _threshold(h, "DCGM_FI_DEV_SHUTDOWN_TEMP", "SHUTDOWN"),
        ),
        (
            ("DCGM_FI_DEV_SM_CLOCK",),
            lambda: {
                "DCGM_FI_DEV_SM_CLOCK": float(
                    pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)
                )
            },
        ),
        (
            ("DCGM_FI_DEV_MEM_CLOCK",),
            lambda: {
                "DCGM_FI_DEV_MEM_CLOCK": float(
                    pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)
                )
            },
        ),
        (("DCGM_FI_DEV_CLOCKS_EVENT_REASONS",), lambda: _clock_event_reasons(h)),
        (
            ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER",),
            lambda: {
                "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": float(pynvml.nvmlDeviceGetPcieReplayCounter(h))
            },
        ),
        (
            ("DCGM_FI_DEV_ENC_UTIL",),
            lambda: {"DCGM_FI_DEV_ENC_UTIL": float(pynvml.nvmlDeviceGetEncoderUtilization(h)[0])},
        ),
        (
            ("DCGM_FI_DEV_DEC_UTIL",),
            lambda: {"DCGM_FI_DEV_DEC_UTIL": float(pynvml.nvmlDeviceGetDecoderUtilization(h)[0])},
        ),
        (
            ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",),
            lambda: _ecc(
                h, "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
            ),
        ),
        (
            ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",),
            lambda: _ecc(
                h, "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
            ),
        ),
        (
            (
                "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
                "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
                "DCGM_FI_DEV_ROW_REMAP_PENDING",
                "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            ),
            lambda: _remapped_rows(h),
        ),
        (("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",), lambda: _nvlink_total(h)),
    ]


def _utilization(h: Any) -> dict[str, float]:
    rates = pynvml.nvmlDeviceGetUtilizationRates(h)
    return {
        "DCGM_FI_DEV_GPU_UTIL": float(rates.gpu),
        "DCGM_FI_DEV_MEM_COPY_UTIL": float(rates.memory),
    }


def _memory(h: Any) -> dict[str, float]:
    info = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    return {
        "DCGM_FI_DEV_FB_USED": info.used / MIB,
        "DCGM_FI_DEV_FB_FREE": info.free / MIB,
        "DCGM_FI_DEV_FB_RESERVED": info.reserved / MIB,
        "DCGM_FI_DEV_FB_TOTAL": info.total / MIB,
    }


def _threshold(h: Any, name: str, which: str) -> dict[str, float]:
    kind = getattr(pynvml, f"NVML_TEMPERATURE_THRESHOLD_{which}")
    return {name: float(pynvml.nvmlDeviceGetTemperatureThreshold(h, kind))}


def _clock_event_reasons(h: Any) -> dict[str, float]:
    try:
        reasons = pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)
    except pynvml.NVMLError_FunctionNotFound:  # drivers before 535 only have the old name
        reasons = pynvml.nvmlDeviceGetCurrentClocksThrottleReasons(h)
    return {"DCGM_FI_DEV_CLOCKS_EVENT_REASONS": float(reasons)}


def _ecc(h: Any, name: str, error_type: int) -> dict[str, float]:
    count = pynvml.nvmlDeviceGetTotalEccErrors(h, error_type, pynvml.NVML_VOLATILE_ECC)
    return {name: float(count)}


def _remapped_rows(h: Any) -> dict[str, float]:
    corrected, uncorrected, pending, failure = pynvml.nvmlDeviceGetRemappedRows(h)
    return {
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": float(corrected),
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": float(uncorrected),
        "DCGM_FI_DEV_ROW_REMAP_PENDING": float(1 if pending else 0),
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": float(1 if failure else 0),
    }


def _field_value(h: Any, name: str, field_id: int) -> dict[str, float]:
    (value,) = pynvml.nvmlDeviceGetFieldValues(h, [field_id])
    return {name: _unpack(value)}


def _nvlink_total(h: Any) -> dict[str, float]:
    """NVLink data throughput counters (KiB), transmit plus receive, summed over all links."""
    values = pynvml.nvmlDeviceGetFieldValues(
        h,
        [
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, ALL_SCOPES),
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, ALL_SCOPES),
        ],
    )
    return {"DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL": sum(_unpack(v) for v in values)}


def _unpack(value: Any) -> float:
    """The number inside an ``nvmlFieldValue_t``; raises its per-field NVML error."""
    if value.nvmlReturn != pynvml.NVML_SUCCESS:
        raise pynvml.NVMLError(value.nvmlReturn)
    member = {
        pynvml.NVML_VALUE_TYPE_DOUBLE: "dVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_INT: "uiVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG: "ulVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG: "ullVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_LONG_LONG: "sllVal",
        pynvml.NVML_VALUE_TYPE_SIGNED_INT: "siVal",
        pynvml.NVML_VALUE_TYPE_UNSIGNED_SHORT: "usVal",
    }.get(value.valueType, "ullVal")
    return float(getattr(value.value, member))
