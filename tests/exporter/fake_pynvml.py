"""A stand-in for the NVML library behind nvidia-ml-py, for machines without a GPU.

``FakeNVML.install(monkeypatch)`` replaces the ``pynvml`` functions the exporter calls. The fakes
keep the binding's contract: handles are real ``c_nvmlDevice_t`` pointers, results are the
binding's own ctypes structures (``c_nvmlMemory_v2_t``, ``c_nvmlFieldValue_t``,
``c_nvmlGpmMetricsGet_t``, ``c_nvmlEventData_t``), and failures raise the binding's real
``NVMLError_*`` classes. Tests can make any function fail for one GPU, or hang until released.
"""

from __future__ import annotations

import ctypes
import itertools
import queue
import threading
from dataclasses import dataclass, field
from typing import Any

import pynvml

GIB = 1024**3


@dataclass
class FakeMIG:
    gpu_instance_id: int
    uuid: str
    profile: str  # e.g. "1g.10gb"
    memory_used: int
    memory_total: int
    gpm: dict[int, float] | None = None


@dataclass
class FakeGPU:
    index: int
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:18:00.0"
    minor: int | None = None
    util_gpu: int = 87
    util_mem: int = 41
    mem_total: int = 81559 * 1024 * 1024
    mem_reserved: int = 527 * 1024 * 1024
    mem_used: int = 40000 * 1024 * 1024
    power_mw: int = 512_345
    energy_mj: int = 9_876_543_210
    power_limit_mw: int = 700_000
    temp_c: int = 63
    mem_temp_c: int | None = 70
    slowdown_c: int = 89
    shutdown_c: int = 92
    sm_clock: int = 1980
    mem_clock: int = 2619
    clock_reasons: int = pynvml.nvmlClocksEventReasonSwPowerCap
    pcie_replays: int = 3
    enc_util: int = 0
    dec_util: int = 5
    ecc_sbe: int = 12
    ecc_dbe: int = 1
    remapped_rows: tuple[int, int, int, int] = (2, 1, 1, 0)
    nvlink_kib: tuple[int, int] | None = (1_000_000, 3_000_000)  # tx, rx; None: no NVLink
    gpm: dict[int, float] | None = None  # metric id -> value; None: GPM unsupported
    migs: list[FakeMIG] | None = None  # None: MIG not supported; []: supported, disabled
    max_mig_devices: int = 7
    handle: Any = field(default=None, repr=False)


class FakeNVML:
    """The NVML library state: GPUs, injected failures, queued events, and a call log."""

    def __init__(self, gpus: list[FakeGPU], driver: str = "570.124.06") -> None:
        self.gpus = gpus
        self.driver = driver
        self.init_error: int | None = None
        self.initialized = False
        self.shutdowns = 0
        self.calls: list[str] = []
        self._failures: dict[tuple[str, int | None], int] = {}
        self._hangs: dict[str, threading.Event] = {}
        self.hung = threading.Event()  # set while a call is blocked by a hang
        self._by_address: dict[int, Any] = {}
        self._samples: dict[int, tuple[int, int]] = {}  # sample address -> (gpu id, sequence)
        self._sequence = itertools.count(1)
        self.freed_samples = 0
        self.events: queue.Queue[tuple[FakeGPU, int, int]] = queue.Queue()
        self.registered: dict[int, int] = {}  # gpu index -> event mask
        self.event_sets_freed = 0
        self._lock = threading.Lock()
        for gpu in gpus:
            gpu.handle = self._new_handle(gpu)
            for mig in gpu.migs or []:
                self._new_handle((gpu, mig))

    # -- test controls -------------------------------------------------------------------------

    def fail(self, function: str, code: int, gpu: int | None = None) -> None:
        """Make ``function`` raise ``NVMLError(code)`` (for one GPU index, or for all)."""
        self._failures[(function, gpu)] = code

    def heal(self, function: str, gpu: int | None = None) -> None:
        """Undo :meth:`fail`: ``function`` answers again."""
        self._failures.pop((function, gpu), None)

    def hang(self, function: str) -> threading.Event:
        """Make ``function`` block until the returned event is set."""
        release = threading.Event()
        self._hangs[function] = release
        return release

    def emit_xid(self, gpu: FakeGPU, xid: int, gpu_instance_id: int = 0xFFFFFFFF) -> None:
        self.events.put((gpu, xid, gpu_instance_id))

    def install(self, monkeypatch: Any) -> None:
        for name in dir(self):
            if name.startswith("nvml"):
                monkeypatch.setattr(pynvml, name, getattr(self, name))

    # -- plumbing ------------------------------------------------------------------------------

    def _new_handle(self, target: Any) -> Any:
        handle = ctypes.pointer(pynvml.struct_c_nvmlDevice_t())
        self._by_address[ctypes.addressof(handle.contents)] = target
        if isinstance(target, tuple):
            target[1].handle = handle
        return handle

    def _target(self, handle: Any) -> Any:
        try:
            return self._by_address[ctypes.addressof(handle.contents)]
        except (KeyError, ValueError, TypeError):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT) from None

    def _enter(self, function: str, handle: Any = None) -> Any:
        """Log the call, apply injected failures and hangs, and resolve the handle."""
        self.calls.append(function)
        if not self.initialized:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        target = self._target(handle) if handle is not None else None
        gpu = target[0] if isinstance(target, tuple) else target
        index = gpu.index if gpu is not None else None
        code = self._failures.get((function, index), self._failures.get((function, None)))
        if code is not None:
            raise pynvml.NVMLError(code)
        release = self._hangs.get(function)
        if release is not None:
            self.hung.set()
            release.wait(timeout=60)
        return target

    @staticmethod
    def _physical(target: Any) -> FakeGPU:
        if isinstance(target, tuple):  # most device queries are not available on a MIG handle
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return target

    # -- system --------------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.init_error is not None:
            raise pynvml.NVMLError(self.init_error)
        self.initialized = True

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized = False
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any:
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return self.gpus[index].handle

    # -- identity ------------------------------------------------------------------------------

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        target = self._enter("nvmlDeviceGetUUID", handle)
        return target[1].uuid if isinstance(target, tuple) else target.uuid

    def nvmlDeviceGetName(self, handle: Any) -> str:
        target = self._enter("nvmlDeviceGetName", handle)
        if isinstance(target, tuple):
            return f"{target[0].name} MIG {target[1].profile}"
        return target.name

    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any:
        gpu = self._physical(self._enter("nvmlDeviceGetPciInfo", handle))
        info = pynvml.nvmlPciInfo_t()
        info.busId = gpu.pci_bus_id.encode()
        return info

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        gpu = self._physical(self._enter("nvmlDeviceGetMinorNumber", handle))
        if gpu.minor is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return gpu.minor

    # -- MIG -----------------------------------------------------------------------------------

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._physical(self._enter("nvmlDeviceGetMigMode", handle))
        if gpu.migs is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        mode = pynvml.NVML_DEVICE_MIG_ENABLE if gpu.migs else pynvml.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        gpu = self._physical(self._enter("nvmlDeviceGetMaxMigDeviceCount", handle))
        return gpu.max_mig_devices

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any:
        gpu = self._physical(self._enter("nvmlDeviceGetMigDeviceHandleByIndex", handle))
        if index >= len(gpu.migs or []):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_FOUND)
        return gpu.migs[index].handle

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        target = self._enter("nvmlDeviceGetGpuInstanceId", handle)
        if not isinstance(target, tuple):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return target[1].gpu_instance_id

    # -- fields --------------------------------------------------------------------------------

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any:
        gpu = self._physical(self._enter("nvmlDeviceGetUtilizationRates", handle))
        rates = pynvml.c_nvmlUtilization_t()
        rates.gpu, rates.memory = gpu.util_gpu, gpu.util_mem
        return rates

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> Any:
        target = self._enter("nvmlDeviceGetMemoryInfo", handle)
        if version != pynvml.nvmlMemory_v2:
            raise AssertionError("the exporter must ask for v2 memory info")
        info = pynvml.c_nvmlMemory_v2_t()
        info.version = version
        if isinstance(target, tuple):
            mig = target[1]
            info.total, info.reserved, info.used = mig.memory_total, 0, mig.memory_used
        else:
            info.total, info.reserved, info.used = (
                target.mem_total,
                target.mem_reserved,
                (target.mem_used),
            )
        info.free = info.total - info.reserved - info.used
        return info

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        return self._physical(self._enter("nvmlDeviceGetPowerUsage", handle)).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int:
        gpu = self._physical(self._enter("nvmlDeviceGetTotalEnergyConsumption", handle))
        return gpu.energy_mj

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        gpu = self._physical(self._enter("nvmlDeviceGetPowerManagementLimit", handle))
        return gpu.power_limit_mw

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._physical(self._enter("nvmlDeviceGetTemperature", handle))
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return gpu.temp_c

    def nvmlDeviceGetTemperatureThreshold(self, handle: Any, threshold: int) -> int:
        gpu = self._physical(self._enter("nvmlDeviceGetTemperatureThreshold", handle))
        return {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: gpu.slowdown_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: gpu.shutdown_c,
        }[threshold]

    def nvmlDeviceGetClockInfo(self, handle: Any, clock: int) -> int:
        gpu = self._physical(self._enter("nvmlDeviceGetClockInfo", handle))
        return {pynvml.NVML_CLOCK_SM: gpu.sm_clock, pynvml.NVML_CLOCK_MEM: gpu.mem_clock}[clock]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu = self._physical(self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle))
        return gpu.clock_reasons

    def nvmlDeviceGetPcieReplayCounter(self, handle: Any) -> int:
        return self._physical(self._enter("nvmlDeviceGetPcieReplayCounter", handle)).pcie_replays

    def nvmlDeviceGetEncoderUtilization(self, handle: Any) -> list[int]:
        gpu = self._physical(self._enter("nvmlDeviceGetEncoderUtilization", handle))
        return [gpu.enc_util, 167000]

    def nvmlDeviceGetDecoderUtilization(self, handle: Any) -> list[int]:
        gpu = self._physical(self._enter("nvmlDeviceGetDecoderUtilization", handle))
        return [gpu.dec_util, 167000]

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter: int) -> int:
        gpu = self._physical(self._enter("nvmlDeviceGetTotalEccErrors", handle))
        assert counter == pynvml.NVML_VOLATILE_ECC
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return gpu.ecc_sbe
        return gpu.ecc_dbe

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        return self._physical(self._enter("nvmlDeviceGetRemappedRows", handle)).remapped_rows

    def nvmlDeviceGetFieldValues(self, handle: Any, field_ids: list[Any]) -> Any:
        gpu = self._physical(self._enter("nvmlDeviceGetFieldValues", handle))
        values = (pynvml.c_nvmlFieldValue_t * len(field_ids))()
        for slot, requested in enumerate(field_ids):
            field_id, scope = requested if isinstance(requested, tuple) else (requested, 0)
            value = values[slot]
            value.fieldId, value.scopeId = field_id, scope
            value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
            number = self._field(gpu, field_id, scope)
            if number is None:
                value.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
            else:
                value.nvmlReturn = pynvml.NVML_SUCCESS
                if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
                    value.valueType = pynvml.NVML_VALUE_TYPE_UNSIGNED_INT
                    value.value.uiVal = number
                else:
                    value.value.ullVal = number
        return values

    @staticmethod
    def _field(gpu: FakeGPU, field_id: int, scope: int) -> int | None:
        if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP:
            return gpu.mem_temp_c
        if gpu.nvlink_kib is None:
            return None
        assert scope == 0xFFFFFFFF, "NVLink throughput must be summed over all links"
        tx, rx = gpu.nvlink_kib
        return {
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX: tx,
            pynvml.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX: rx,
        }.get(field_id)

    # -- GPM -----------------------------------------------------------------------------------

    def nvmlGpmQueryDeviceSupport(self, handle: Any) -> Any:
        gpu = self._physical(self._enter("nvmlGpmQueryDeviceSupport", handle))
        support = pynvml.c_nvmlGpmSupport_t()
        support.version = pynvml.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = 1 if gpu.gpm is not None else 0
        return support

    def nvmlGpmSampleAlloc(self) -> Any:
        self._enter("nvmlGpmSampleAlloc")
        sample = ctypes.pointer(pynvml.struct_c_nvmlGpmSample_t())
        self._samples[ctypes.addressof(sample.contents)] = (0, 0)
        return sample

    def nvmlGpmSampleFree(self, sample: Any) -> None:
        self._enter("nvmlGpmSampleFree")
        del self._samples[ctypes.addressof(sample.contents)]
        self.freed_samples += 1

    def nvmlGpmSampleGet(self, handle: Any, sample: Any) -> Any:
        gpu = self._physical(self._enter("nvmlGpmSampleGet", handle))
        if gpu.gpm is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._take(sample, id(gpu.gpm))
        return sample

    def nvmlGpmMigSampleGet(self, handle: Any, gpu_instance_id: int, sample: Any) -> Any:
        gpu = self._physical(self._enter("nvmlGpmMigSampleGet", handle))
        mig = next(m for m in gpu.migs or [] if m.gpu_instance_id == gpu_instance_id)
        if mig.gpm is None:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        self._take(sample, id(mig.gpm))
        return sample

    def _take(self, sample: Any, source: int) -> None:
        address = ctypes.addressof(sample.contents)
        if address not in self._samples:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        self._samples[address] = (source, next(self._sequence))

    def nvmlGpmMetricsGet(self, request: Any) -> Any:
        self._enter("nvmlGpmMetricsGet")
        assert request.version == pynvml.NVML_GPM_METRICS_GET_VERSION
        first = self._samples[ctypes.addressof(request.sample1.contents)]
        second = self._samples[ctypes.addressof(request.sample2.contents)]
        if first[0] != second[0] or not 0 < first[1] < second[1]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        metrics = next(
            m for g in self.gpus for m in [g.gpm, *(x.gpm for x in g.migs or [])]
            if m is not None and id(m) == first[0]
        )  # fmt: skip
        for slot in range(request.numMetrics):
            metric = request.metrics[slot]
            if metric.metricId in metrics:
                metric.nvmlReturn = pynvml.NVML_SUCCESS
                metric.value = metrics[metric.metricId]
            else:
                metric.nvmlReturn = pynvml.NVML_ERROR_NOT_SUPPORTED
        return request

    # -- events --------------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> Any:
        self._enter("nvmlEventSetCreate")
        return ctypes.pointer(pynvml.struct_c_nvmlEventSet_t())

    def nvmlDeviceRegisterEvents(self, handle: Any, event_types: int, event_set: Any) -> None:
        gpu = self._physical(self._enter("nvmlDeviceRegisterEvents", handle))
        with self._lock:
            self.registered[gpu.index] = self.registered.get(gpu.index, 0) | event_types

    def nvmlEventSetWait_v2(self, event_set: Any, timeout_ms: int) -> Any:
        self._enter("nvmlEventSetWait_v2")
        try:
            gpu, xid, gpu_instance_id = self.events.get(timeout=timeout_ms / 1000.0)
        except queue.Empty:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT) from None
        assert self.registered.get(gpu.index, 0) & pynvml.nvmlEventTypeXidCriticalError
        data = pynvml.c_nvmlEventData_t()
        data.device = gpu.handle
        data.eventType = pynvml.nvmlEventTypeXidCriticalError
        data.eventData = xid
        data.gpuInstanceId = gpu_instance_id
        data.computeInstanceId = 0xFFFFFFFF
        return data

    def nvmlEventSetFree(self, event_set: Any) -> None:
        self._enter("nvmlEventSetFree")
        self.event_sets_freed += 1
