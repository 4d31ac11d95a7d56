"""The NVML source: real GPUs through nvidia-ml-py (``import pynvml``).

Each field is read with its own NVML call so one unsupported or failing query costs only that
field: ``NVMLError_NotSupported`` leaves the field absent (never zero), any other NVML error is
reported in ``DeviceReading.errors`` under the error's NVML name in snake_case, and
``NVMLError_GpuIsLost`` ends the reading for the whole device. Values are converted to DCGM units
here (mW -> W, bytes -> MiB, GPM percent -> ratio, GPM MiB/s -> bytes/s).

Profiling fields come from NVML GPM: every read takes one new GPM sample and compares it with the
previous one, so the ratios cover the time between two collections. Xid errors arrive on an event
thread that waits on an NVML event set with a timeout, so ``close`` can stop it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from typing import Any

import pynvml

from exporter.fields import MIB
from exporter.model import DeviceInfo, DeviceReading, XidEvent
from exporter.sources.readings import lost_reading

log = logging.getLogger(__name__)

_ALL_SCOPES = 0xFFFFFFFF  # field-value scope meaning "summed over all NVLink links"
_NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId of an event not tied to a MIG instance

# GPM metric -> (DCGM field, factor from the GPM unit to DCGM's unit)
_GPM_METRICS: tuple[tuple[int, str, float], ...] = (
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
PROFILING_FIELDS = tuple(name for _, name, _ in _GPM_METRICS)
MEMORY_FIELDS = (
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_RESERVED",
    "DCGM_FI_DEV_FB_TOTAL",
)

# NVML return code -> snake_case reason, from the binding's own NVML_ERROR_* names
_REASONS: dict[int, str] = {
    getattr(pynvml, name): name.removeprefix("NVML_ERROR_").lower()
    for name in dir(pynvml)
    if name.startswith("NVML_ERROR_")
}


class NoDriverError(RuntimeError):
    """NVML could not be initialized: no NVIDIA driver (or no GPU) on this machine."""


def error_reason(exc: pynvml.NVMLError) -> str:
    """``NVMLError_NoPermission`` -> ``no_permission``: a stable label value for the error."""
    return _REASONS.get(exc.value, f"nvml_error_{exc.value}")


@dataclass
class _Device:
    info: DeviceInfo
    handle: Any  # the NVML handle; for a MIG instance, the MIG device handle
    parent: Any = None  # the physical GPU's handle, for MIG instances
    gpm: bool = False
    gpm_samples: list[Any] = field(default_factory=list)  # [previous, spare]
    gpm_primed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock)


class NVMLSource:
    """Real GPUs (and their MIG instances) through NVML; implements ``GPUSource``.

    Construct with ``NVMLSource.open()``.
    """

    name = "nvml"

    def __init__(
        self,
        devices: list[_Device],
        event_timeout_ms: int,
        clock: Callable[[], float],
        fields: Collection[str] | None = None,
    ) -> None:
        self._devices = devices
        self._wanted = frozenset(fields) if fields is not None else None
        self._by_key = {(d.info.index, d.info.mig_instance_id): d for d in devices}
        self._clock = clock
        self._event_timeout_ms = event_timeout_ms
        self._xids: list[tuple[DeviceInfo, XidEvent]] = []
        self._lock = threading.Lock()
        self._in_flight = 0
        self._closing = False
        self._released = False
        self._stop = threading.Event()
        self._event_set: Any = None
        self._event_thread: threading.Thread | None = None

    @classmethod
    def open(
        cls,
        event_timeout_ms: int = 500,
        clock: Callable[[], float] = time.time,
        fields: Collection[str] | None = None,
    ) -> NVMLSource:
        """Initialize NVML, enumerate GPUs and MIG instances, start the Xid event thread.

        ``fields`` (DCGM names; default all) limits the NVML calls to those that read one of
        them. Raises ``NoDriverError`` when NVML cannot be initialized.
        """
        try:
            pynvml.nvmlInit()
        except pynvml.NVMLError as exc:
            raise NoDriverError(
                f"no NVIDIA driver was found (NVML init failed: {exc}); to run without GPUs use "
                f"--source simulated (e.g. --source simulated --gpus 8)"
            ) from exc
        try:
            source = cls(_enumerate(), event_timeout_ms, clock, fields)
            source._start_events()
        except pynvml.NVMLError:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlShutdown()
            raise
        return source

    # -- GPUSource -----------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        return [d.info for d in self._devices]

    def read(self, device: DeviceInfo) -> DeviceReading:
        """Read every field of one device. May block inside NVML; the collector bounds it."""
        dev = self._by_key[(device.index, device.mig_instance_id)]
        with self._lock:
            if self._closing:
                raise RuntimeError("NVML source is closed")
            self._in_flight += 1
        try:
            with dev.lock:
                return self._read(dev)
        finally:
            with self._lock:
                self._in_flight -= 1
            self._release_if_idle()

    def drain_xid_events(self) -> list[tuple[DeviceInfo, XidEvent]]:
        with self._lock:
            events, self._xids = self._xids, []
            return events

    def close(self) -> None:
        """Stop the event thread and shut NVML down without waiting on a hung NVML call.

        If a read or the event wait is still inside NVML, the shutdown happens when the last of
        them returns.
        """
        with self._lock:
            if self._closing:
                return
            self._closing = True
        self._stop.set()
        if self._event_thread is not None:
            self._event_thread.join(timeout=self._event_timeout_ms / 1000.0 + 2.0)
            if self._event_thread.is_alive():
                log.warning("NVML event thread still waiting inside NVML; shutdown deferred")
        self._release_if_idle()

    # -- reading -------------------------------------------------------------------------------

    def _read(self, dev: _Device) -> DeviceReading:
        reading = DeviceReading()
        h = dev.handle
        if dev.parent is not None:  # per MIG instance NVML only knows memory (and GPM below);
            queries = [(MEMORY_FIELDS, lambda: _memory(h))]  # the rest is the parent GPU's
        else:
            queries = _field_queries(h)
        wanted = self._wanted
        try:
            for names, query in queries:
                if wanted is None or not wanted.isdisjoint(names):
                    _read_field(reading, names, query)
            if dev.gpm and (wanted is None or not wanted.isdisjoint(PROFILING_FIELDS)):
                self._read_gpm(dev, reading)
        except pynvml.NVMLError_GpuIsLost:
            return lost_reading()
        return reading

    def _read_gpm(self, dev: _Device, reading: DeviceReading) -> None:
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
        request.numMetrics = len(_GPM_METRICS)
        request.sample1 = previous
        request.sample2 = spare
        for slot, (metric_id, _, _) in enumerate(_GPM_METRICS):
            request.metrics[slot].metricId = metric_id
        try:
            result = pynvml.nvmlGpmMetricsGet(request)
        except pynvml.NVMLError_GpuIsLost:
            raise
        except pynvml.NVMLError as exc:
            for name in PROFILING_FIELDS:
                reading.errors[name] = error_reason(exc)
            return
        for slot, (_, name, factor) in enumerate(_GPM_METRICS):
            metric = result.metrics[slot]
            if metric.nvmlReturn == pynvml.NVML_SUCCESS:
                reading.values[name] = metric.value * factor
            elif metric.nvmlReturn != pynvml.NVML_ERROR_NOT_SUPPORTED:
                reading.errors[name] = _REASONS.get(metric.nvmlReturn, "unknown")

    # -- Xid events ----------------------------------------------------------------------------

    def _start_events(self) -> None:
        physical = [d for d in self._devices if d.parent is None]
        if not physical:
            return
        try:
            self._event_set = pynvml.nvmlEventSetCreate()
        except pynvml.NVMLError as exc:
            log.warning("Xid events unavailable: %s", exc, extra={"reason": error_reason(exc)})
            return
        registered = 0
        for dev in physical:
            try:
                pynvml.nvmlDeviceRegisterEvents(
                    dev.handle, pynvml.nvmlEventTypeXidCriticalError, self._event_set
                )
                registered += 1
            except pynvml.NVMLError as exc:
                log.warning(
                    "Xid events unavailable for one GPU",
                    extra={"gpu": dev.info.index, "reason": error_reason(exc)},
                )
        if registered == 0:
            self._free_event_set()
            return
        self._event_thread = threading.Thread(
            target=self._event_loop, name="nvml-xid-events", daemon=True
        )
        self._event_thread.start()

    def _event_loop(self) -> None:
        try:
            while not self._stop.is_set():
                try:
                    data = pynvml.nvmlEventSetWait_v2(self._event_set, self._event_timeout_ms)
                except pynvml.NVMLError_Timeout:
                    continue
                except pynvml.NVMLError as exc:
                    log.warning(
                        "waiting for Xid events failed", extra={"reason": error_reason(exc)}
                    )
                    self._stop.wait(1.0)
                    continue
                if data.eventType & pynvml.nvmlEventTypeXidCriticalError:
                    self._record_xid(data)
        finally:
            self._release_if_idle()

    def _record_xid(self, data: Any) -> None:
        try:
            gpu_uuid = _text(pynvml.nvmlDeviceGetUUID(data.device))
        except pynvml.NVMLError as exc:
            log.warning("Xid from an unidentifiable GPU", extra={"reason": error_reason(exc)})
            return
        target = None
        for dev in self._devices:
            if dev.info.uuid != gpu_uuid:
                continue
            if dev.info.mig_instance_id is None and target is None:
                target = dev.info
            if data.gpuInstanceId != _NO_INSTANCE and dev.info.mig_instance_id == (
                data.gpuInstanceId
            ):
                target = dev.info
        if target is None:
            log.warning("Xid from an unknown GPU", extra={"uuid": gpu_uuid, "xid": data.eventData})
            return
        event = XidEvent(xid=int(data.eventData), timestamp=self._clock())
        log.info("Xid error", extra={"gpu": target.index, "xid": event.xid})
        with self._lock:
            self._xids.append((target, event))

    # -- shutdown ------------------------------------------------------------------------------

    def _release_if_idle(self) -> None:
        """Free NVML resources once closing and nothing is inside NVML any more."""
        with self._lock:
            thread = self._event_thread
            busy = self._in_flight > 0 or (
                thread is not None
                and thread.is_alive()
                and thread is not threading.current_thread()
            )
            if not self._closing or self._released or busy:
                return
            self._released = True
        self._free_event_set()
        for dev in self._devices:
            for sample in dev.gpm_samples:
                with contextlib.suppress(pynvml.NVMLError):
                    pynvml.nvmlGpmSampleFree(sample)
            dev.gpm_samples = []
        with contextlib.suppress(pynvml.NVMLError):
            pynvml.nvmlShutdown()

    def _free_event_set(self) -> None:
        if self._event_set is not None:
            with contextlib.suppress(pynvml.NVMLError):
                pynvml.nvmlEventSetFree(self._event_set)
            self._event_set = None


# -- field queries -----------------------------------------------------------------------------


def _read_field(
    reading: DeviceReading, names: tuple[str, ...], query: Callable[[], dict[str, float]]
) -> None:
    try:
        reading.values.update(query())
    except pynvml.NVMLError_GpuIsLost:
        raise
    except pynvml.NVMLError_NotSupported:
        return
    except pynvml.NVMLError as exc:
        for name in names:
            reading.errors[name] = error_reason(exc)


def _field_queries(h: Any) -> list[tuple[tuple[str, ...], Callable[[], dict[str, float]]]]:
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
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, _ALL_SCOPES),
            (pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, _ALL_SCOPES),
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


# -- enumeration -------------------------------------------------------------------------------


def _enumerate() -> list[_Device]:
    driver = _text(pynvml.nvmlSystemGetDriverVersion())
    devices: list[_Device] = []
    for index in range(pynvml.nvmlDeviceGetCount()):
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        try:
            minor = pynvml.nvmlDeviceGetMinorNumber(handle)
        except pynvml.NVMLError:
            minor = index
        info = DeviceInfo(
            index=index,
            uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
            pci_bus_id=_text(pynvml.nvmlDeviceGetPciInfo(handle).busId),
            model_name=_text(pynvml.nvmlDeviceGetName(handle)),
            device=f"nvidia{minor}",
            driver_version=driver,
        )
        gpm = _gpm_supported(handle)
        devices.append(_device(info, handle, None, gpm))
        devices.extend(_mig_devices(info, handle, gpm))
    return devices


def _device(info: DeviceInfo, handle: Any, parent: Any, gpm: bool) -> _Device:
    samples: list[Any] = []
    if gpm:
        try:
            samples = [pynvml.nvmlGpmSampleAlloc(), pynvml.nvmlGpmSampleAlloc()]
        except pynvml.NVMLError as exc:
            log.warning("GPM samples unavailable", extra={"reason": error_reason(exc)})
            gpm = False
    return _Device(info, handle, parent, gpm, samples)


def _gpm_supported(handle: Any) -> bool:
    try:
        return bool(pynvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except pynvml.NVMLError:
        return False


def _mig_devices(parent: DeviceInfo, handle: Any, gpm: bool) -> list[_Device]:
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
            mig_uuid=_text(pynvml.nvmlDeviceGetUUID(mig)),
        )
        found.append(_device(info, mig, handle, gpm))
    return found


def _mig_profile(mig: Any) -> str:
    """``1g.10gb`` from the MIG device name (``NVIDIA H100 80GB HBM3 MIG 1g.10gb``)."""
    name = _text(pynvml.nvmlDeviceGetName(mig))
    _, sep, profile = name.rpartition("MIG ")
    if sep:
        return profile.strip()
    attrs = pynvml.nvmlDeviceGetAttributes(mig)
    return f"{attrs.gpuInstanceSliceCount}g.{round(attrs.memorySizeMB / 1024)}gb"


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value
