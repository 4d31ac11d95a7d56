"""The field catalogue: every GPU field the exporter knows, under both naming schemes.

Sources report values keyed by DCGM field name in DCGM's units. This catalogue is the one place
that says, for each field, what dcgm-exporter (4.x ``default-counters.csv`` and its DCP list)
calls it, its Prometheus type and help text, and the conventional name and base-unit factor used
by ``--naming prometheus``. Renderers never hard-code a metric name; they look it up here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricKind = Literal["gauge", "counter"]

MIB = 1024.0 * 1024.0  # bytes in a MiB, DCGM's unit for framebuffer sizes


@dataclass(frozen=True)
class FieldSpec:
    """One GPU field.

    ``dcgm_*`` describe the series as dcgm-exporter exposes it (value in DCGM units);
    ``prom_*`` describe the same value under a conventional name, multiplied by ``scale`` so it is
    in base units (bytes, watts, joules, hertz, celsius, ratio 0..1).
    """

    dcgm_name: str
    kind: MetricKind
    dcgm_help: str
    prom_name: str
    prom_help: str
    scale: float = 1.0
    profiling: bool = False  # NVML GPM field: absent (never zero) where the GPU lacks GPM
    from_source: bool = True  # False: derived by the collector (Xid), not read from a source


def _f(
    dcgm_name: str,
    kind: MetricKind,
    dcgm_help: str,
    prom_name: str,
    prom_help: str,
    scale: float = 1.0,
    **flags: bool,
) -> FieldSpec:
    return FieldSpec(dcgm_name, kind, dcgm_help, prom_name, prom_help, scale, **flags)


# fmt: off
FIELDS: tuple[FieldSpec, ...] = (
    # Clocks
    _f("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).",
       "autoglm_gpu_sm_clock_hertz", "SM clock frequency in hertz.", 1e6),
    _f("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).",
       "autoglm_gpu_memory_clock_hertz", "Memory clock frequency in hertz.", 1e6),
    # Temperature
    _f("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).",
       "autoglm_gpu_memory_temperature_celsius", "Memory temperature in degrees celsius."),
    _f("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).",
       "autoglm_gpu_temperature_celsius", "GPU temperature in degrees celsius."),
    _f("DCGM_FI_DEV_SLOWDOWN_TEMP", "gauge", "Slowdown temperature for the device (in C).",
       "autoglm_gpu_slowdown_temperature_celsius",
       "Temperature at which the GPU starts to slow down its clocks, in degrees celsius."),
    _f("DCGM_FI_DEV_SHUTDOWN_TEMP", "gauge", "Shutdown temperature for the device (in C).",
       "autoglm_gpu_shutdown_temperature_celsius",
       "Temperature at which the GPU shuts down, in degrees celsius."),
    # Power
    _f("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).",
       "autoglm_gpu_power_watts", "Power draw in watts."),
    _f("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter",
       "Total energy consumption since boot (in mJ).",
       "autoglm_gpu_energy_joules_total", "Energy consumed since the driver loaded, in joules.",
       1e-3),
    _f("DCGM_FI_DEV_POWER_MGMT_LIMIT", "gauge", "Power management limit (in W).",
       "autoglm_gpu_power_limit_watts", "Power management limit in watts."),
    # PCIe
    _f("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.",
       "autoglm_gpu_pcie_replays_total", "PCIe replays (retries) since the driver loaded."),
    # Utilization
    _f("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).",
       "autoglm_gpu_utilization_ratio",
       "Fraction of the sample period during which a kernel ran, 0 to 1.", 0.01),
    _f("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).",
       "autoglm_gpu_memory_copy_utilization_ratio",
       "Fraction of the sample period during which device memory was read or written, 0 to 1.",
       0.01),
    _f("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).",
       "autoglm_gpu_encoder_utilization_ratio", "Video encoder utilization, 0 to 1.", 0.01),
    _f("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).",
       "autoglm_gpu_decoder_utilization_ratio", "Video decoder utilization, 0 to 1.", 0.01),
    # Errors and violations
    _f("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.",
       "autoglm_gpu_last_xid_code",
       "Code of the most recent Xid error within the hold window, 0 when none.",
       from_source=False),
    _f("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "gauge",
       "Current clock event reasons (bitmask of DCGM_CLOCKS_EVENT_REASON_*).",
       "autoglm_gpu_clocks_event_reasons",
       "Bitmask of the reasons the clocks are held below their maximum (NVML clocks event "
       "reasons)."),
    # Memory usage (NVML v2 memory info)
    _f("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).",
       "autoglm_gpu_memory_free_bytes", "Framebuffer memory free in bytes.", MIB),
    _f("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).",
       "autoglm_gpu_memory_used_bytes", "Framebuffer memory used in bytes.", MIB),
    _f("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).",
       "autoglm_gpu_memory_reserved_bytes",
       "Framebuffer memory reserved by the driver and firmware, in bytes.", MIB),
    _f("DCGM_FI_DEV_FB_TOTAL", "gauge", "Framebuffer memory total (in MiB).",
       "autoglm_gpu_memory_total_bytes", "Total framebuffer memory in bytes.", MIB),
    # ECC
    _f("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "counter",
       "Total number of single-bit volatile ECC errors.",
       "autoglm_gpu_ecc_single_bit_volatile_errors_total",
       "Single-bit (corrected) volatile ECC errors since the driver loaded."),
    _f("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter",
       "Total number of double-bit volatile ECC errors.",
       "autoglm_gpu_ecc_double_bit_volatile_errors_total",
       "Double-bit (uncorrected) volatile ECC errors since the driver loaded."),
    # NVLink
    _f("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter",
       "Total number of NVLink bandwidth counters for all lanes.",
       "autoglm_gpu_nvlink_bandwidth_total",
       "NVLink bandwidth counter summed over all links, as DCGM reports it."),
    # Remapped rows
    _f("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter",
       "Number of remapped rows for uncorrectable errors",
       "autoglm_gpu_uncorrectable_remapped_rows_total",
       "Memory rows remapped because of uncorrectable errors."),
    _f("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter",
       "Number of remapped rows for correctable errors",
       "autoglm_gpu_correctable_remapped_rows_total",
       "Memory rows remapped because of correctable errors."),
    _f("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", "Whether remapping of rows has failed",
       "autoglm_gpu_row_remap_failed", "1 when a row remapping has failed, else 0."),
    _f("DCGM_FI_DEV_ROW_REMAP_PENDING", "gauge", "Whether remapping of rows is pending",
       "autoglm_gpu_row_remap_pending",
       "1 when a row remapping is pending (needs a GPU reset), else 0."),
    # Profiling (DCP; from NVML GPM here)
    _f("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", "Ratio of time the graphics engine is active.",
       "autoglm_gpu_graphics_engine_active_ratio",
       "Fraction of time the graphics or compute engine was active, 0 to 1.", profiling=True),
    _f("DCGM_FI_PROF_SM_ACTIVE", "gauge",
       "The ratio of cycles an SM has at least 1 warp assigned.",
       "autoglm_gpu_sm_active_ratio",
       "Fraction of cycles an SM had at least one warp assigned, 0 to 1.", profiling=True),
    _f("DCGM_FI_PROF_SM_OCCUPANCY", "gauge",
       "The ratio of number of warps resident on an SM.",
       "autoglm_gpu_sm_occupancy_ratio",
       "Resident warps as a fraction of the maximum per SM, 0 to 1.", profiling=True),
    _f("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge",
       "Ratio of cycles the tensor (HMMA) pipe is active.",
       "autoglm_gpu_tensor_pipe_active_ratio",
       "Fraction of cycles the tensor pipe was active, 0 to 1.", profiling=True),
    _f("DCGM_FI_PROF_DRAM_ACTIVE", "gauge",
       "Ratio of cycles the device memory interface is active sending or receiving data.",
       "autoglm_gpu_dram_active_ratio",
       "Fraction of cycles the device memory interface was busy, 0 to 1.", profiling=True),
    _f("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge",
       "The rate of data transmitted over the PCIe bus - including both protocol headers and "
       "data payloads - in bytes per second.",
       "autoglm_gpu_pcie_transmit_bytes_per_second",
       "PCIe transmit rate including headers, in bytes per second.", profiling=True),
    _f("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge",
       "The rate of data received over the PCIe bus - including both protocol headers and "
       "data payloads - in bytes per second.",
       "autoglm_gpu_pcie_receive_bytes_per_second",
       "PCIe receive rate including headers, in bytes per second.", profiling=True),
    _f("DCGM_FI_PROF_NVLINK_TX_BYTES", "gauge",
       "The rate of data transmitted over NVLink, not including protocol headers, in bytes "
       "per second.",
       "autoglm_gpu_nvlink_transmit_bytes_per_second",
       "NVLink transmit rate excluding headers, in bytes per second.", profiling=True),
    _f("DCGM_FI_PROF_NVLINK_RX_BYTES", "gauge",
       "The rate of data received over NVLink, not including protocol headers, in bytes "
       "per second.",
       "autoglm_gpu_nvlink_receive_bytes_per_second",
       "NVLink receive rate excluding headers, in bytes per second.", profiling=True),
)
# fmt: on

BY_NAME: dict[str, FieldSpec] = {spec.dcgm_name: spec for spec in FIELDS}

SOURCE_FIELDS: tuple[str, ...] = tuple(s.dcgm_name for s in FIELDS if s.from_source)
"""Field ids a source may put in ``DeviceReading.values``."""

PROFILING_FIELDS: tuple[str, ...] = tuple(s.dcgm_name for s in FIELDS if s.profiling)

XID_FIELD = "DCGM_FI_DEV_XID_ERRORS"

CRITICAL_XIDS: tuple[int, ...] = (48, 63, 64, 74, 79, 94, 95)
"""Xid codes that mean the GPU needs draining and a reset or replacement: 48 double-bit ECC error,
63 and 64 ECC page retirement or row remapping (recorded / failed), 74 NVLink error, 79 GPU fallen
off the bus, 94 contained and 95 uncontained ECC error.

``autoglm_gpu_xid_errors_total`` carries a series at 0 for each of these codes on every GPU from
the exporter's start, so the first such Xid is an increase that ``increase()`` and ``rate()`` see
(a counter series that is born at 1 looks to them like no change at all). Other codes get their
series at their first event."""
