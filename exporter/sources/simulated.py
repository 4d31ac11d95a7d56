"""Simulated GPUs with realistic dynamics, for tests, the local stack and GPU-less evaluation.

Each GPU's utilization comes from a load profile (or from ``set_external_load``, which the batcher
will drive with its real load), plus seeded smooth noise and a per-GPU scale. The rest follows the
physics operators expect: memory follows load with a lag, power rises from idle toward the limit,
temperature approaches a power-dependent level with a thermal time constant, clocks boost under load
and fall back when the GPU runs into its power or thermal limits, energy integrates power.

Everything is a function of the injected clock and the seed: noise is hashed from (seed, GPU,
channel, second) rather than drawn from a stream, so two sources with the same seed read at the same
times give identical readings whatever else happens between reads.
"""

from __future__ import annotations

import math
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass

import pynvml

from exporter.model import DeviceInfo, DeviceReading, XidEvent
from exporter.sources.faults import (
    EccFault,
    Fault,
    FieldErrorFault,
    HangFault,
    LostFault,
    TempRampFault,
    XidFault,
)
from exporter.sources.gpu_models import GPUModel, find_model
from exporter.sources.profiles import LoadProfile
from exporter.sources.readings import lost_reading

DRIVER_VERSION = "570.124.06"
_PCI_BUSES = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)

THERMAL_TIME_CONSTANT_S = 40.0
MEMORY_TIME_CONSTANT_S = 15.0
_MAX_STEP_S = 2.0  # integration step for temperature, memory and energy
_MAX_STEPS = 20_000  # beyond this a long clock jump is integrated with coarser steps
_BUSY = 0.01  # utilization under which the GPU counts as idle
_MEMORY_CEILING = 0.92  # share of usable memory a fully loaded inference server holds


@dataclass(frozen=True)
class _Variation:
    """Fixed per-GPU differences, so eight simulated GPUs do not draw eight identical lines."""

    load_scale: float
    power_scale: float
    ambient_c: float
    weights_share: float  # memory held at zero load (model weights)


@dataclass
class _State:
    t: float
    temp_c: float
    mem_used_mib: float
    energy_mj: float
    nvlink_kib: float
    ecc_sbe: int = 0
    ecc_dbe: int = 0
    remapped_uncorrectable: int = 0
    remap_pending: int = 0


@dataclass(frozen=True)
class _Ramp:
    start_t: float
    start_c: float
    fault: TempRampFault


class SimulatedSource:
    """N simulated GPUs of one model; implements ``exporter.model.GPUSource``."""

    name = "simulated"

    def __init__(
        self,
        gpus: int,
        model: str,
        seed: int,
        profile: LoadProfile,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if gpus < 1:
            raise ValueError(f"gpus must be at least 1, not {gpus}")
        self.model: GPUModel = find_model(model)
        self._seed = seed
        self._profile = profile
        self._clock = clock
        self._start = clock()
        self._cond = threading.Condition()
        self._closed = False
        self._external: dict[int, float] = {}
        self._faults: list[Fault] = []
        self._ramps: dict[int, _Ramp] = {}
        self._xids: list[tuple[DeviceInfo, XidEvent]] = []
        self._devices = [self._device_info(i) for i in range(gpus)]
        self._variation = [self._make_variation(i) for i in range(gpus)]
        self._states = [self._initial_state(i) for i in range(gpus)]

    # -- GPUSource -----------------------------------------------------------------------------

    def devices(self) -> list[DeviceInfo]:
        return list(self._devices)

    def read(self, device: DeviceInfo) -> DeviceReading:
        """One reading at the clock's current time; blocks while a hang fault holds the GPU."""
        i = device.index
        with self._cond:
            while self._has(HangFault, i) and not self._closed:
                self._cond.wait()
            if self._closed:
                raise RuntimeError("simulated source is closed")
            if self._has(LostFault, i):
                return lost_reading()
            now = self._clock()
            self._advance(i, now)
            reading = DeviceReading(values=self._values(i, now))
            for fault in self._faults:
                if isinstance(fault, FieldErrorFault) and fault.gpu == i:
                    reading.values.pop(fault.field, None)
                    reading.errors[fault.field] = fault.reason
            return reading

    def drain_xid_events(self) -> list[tuple[DeviceInfo, XidEvent]]:
        with self._cond:
            events, self._xids = self._xids, []
            return events

    def close(self) -> None:
        """Stop the source; reads blocked by a hang fault return (with an error) at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # -- control -------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        """Start a fault. Xid and ECC faults act once; the others last until ``clear_faults``."""
        self._check_index(fault.gpu)
        with self._cond:
            now = self._clock()
            self._advance(fault.gpu, now)
            if isinstance(fault, XidFault):
                self._xids.append((self._devices[fault.gpu], XidEvent(fault.code, now)))
                return
            state = self._states[fault.gpu]
            if isinstance(fault, EccFault):
                state.ecc_sbe += fault.sbe
                state.ecc_dbe += fault.dbe
                if fault.dbe:
                    state.remapped_uncorrectable += fault.dbe
                    state.remap_pending = 1
                return
            if isinstance(fault, TempRampFault):
                self._ramps[fault.gpu] = _Ramp(now, state.temp_c, fault)
            self._faults.append(fault)

    def clear_faults(self, gpu: int | None = None) -> None:
        """End lasting faults (all GPUs, or one); hung reads resume, temperatures relax."""
        if gpu is not None:
            self._check_index(gpu)
        with self._cond:
            now = self._clock()
            for i in range(len(self._devices)) if gpu is None else [gpu]:
                self._advance(i, now)
                self._ramps.pop(i, None)
            self._faults = [f for f in self._faults if gpu is not None and f.gpu != gpu]
            self._cond.notify_all()

    def active_faults(self) -> list[Fault]:
        with self._cond:
            return list(self._faults)

    def set_external_load(self, index: int, utilization: float | None) -> None:
        """Drive GPU ``index`` with a measured utilization (0..1) instead of the profile; None
        hands it back to the profile."""
        self._check_index(index)
        with self._cond:
            self._advance(index, self._clock())
            if utilization is None:
                self._external.pop(index, None)
                return
            if not 0.0 <= utilization <= 1.0:
                raise ValueError(f"utilization is a ratio 0..1, not {utilization}")
            self._external[index] = utilization

    # -- model ---------------------------------------------------------------------------------

    def utilization(self, i: int, now: float) -> float:
        """Utilization (0..1) of GPU ``i`` at time ``now``."""
        if i in self._external:
            return self._external[i]
        base = self._profile.utilization(now, now - self._start, i)
        if base <= 0.0:
            return 0.0  # an idle profile means no work: no noise on top
        noisy = base * self._variation[i].load_scale + 0.04 * self._noise(i, 1, now)
        return min(1.0, max(0.0, noisy))

    def _raw_power(self, i: int, util: float, now: float) -> float:
        m, v = self.model, self._variation[i]
        idle = m.idle_power_w * v.power_scale
        peak = 0.97 * m.power_limit_w * v.power_scale
        busy = idle + (peak - idle) * util**0.8
        return max(0.0, busy + 0.01 * m.power_limit_w * self._noise(i, 2, now))

    def _power(self, i: int, util: float, now: float) -> float:
        return min(self.model.power_limit_w, self._raw_power(i, util, now))

    def _steady_temp(self, i: int, power_w: float) -> float:
        ambient = self._variation[i].ambient_c
        return ambient + (self.model.load_temp_c - ambient) * power_w / self.model.power_limit_w

    def _memory_target(self, i: int, util: float) -> float:
        usable = self.model.memory_mib - self.model.reserved_mib
        weights = self._variation[i].weights_share
        return usable * (weights + (_MEMORY_CEILING - weights) * util)

    def _advance(self, i: int, now: float) -> None:
        """Integrate GPU ``i``'s state from its last time to ``now``."""
        state = self._states[i]
        span = now - state.t
        if span <= 0.0:
            return
        steps = min(_MAX_STEPS, max(1, math.ceil(span / _MAX_STEP_S)))
        dt = span / steps
        t = state.t
        power_before = self._power(i, self.utilization(i, t), t)
        for _ in range(steps):
            t += dt
            util = self.utilization(i, t)
            power = self._power(i, util, t)
            state.energy_mj += (power_before + power) / 2.0 * dt * 1000.0
            power_before = power
            decay_t = math.exp(-dt / THERMAL_TIME_CONSTANT_S)
            target_t = self._steady_temp(i, power)
            state.temp_c = target_t + (state.temp_c - target_t) * decay_t
            decay_m = math.exp(-dt / MEMORY_TIME_CONSTANT_S)
            target_m = self._memory_target(i, util)
            state.mem_used_mib = target_m + (state.mem_used_mib - target_m) * decay_m
            if self.model.nvlink:
                state.nvlink_kib += 2.0 * self._nvlink_rate(util) * dt / 1024.0
        ramp = self._ramps.get(i)
        if ramp is not None:
            progress = min(1.0, (now - ramp.start_t) / ramp.fault.over_s)
            state.temp_c = ramp.start_c + (ramp.fault.to_c - ramp.start_c) * progress
        state.t = now

    def _nvlink_rate(self, util: float) -> float:
        return util * 18e9  # bytes/s each way: tensor-parallel traffic at a fraction of 450 GB/s

    def _values(self, i: int, now: float) -> dict[str, float]:
        m, state = self.model, self._states[i]
        util = self.utilization(i, now)
        raw_power = self._raw_power(i, util, now)
        power = min(m.power_limit_w, raw_power)
        reasons = 0
        sm_clock = float(m.max_sm_clock_mhz)
        if util < _BUSY:
            reasons |= pynvml.nvmlClocksEventReasonGpuIdle
            sm_clock = float(m.idle_sm_clock_mhz)
        if raw_power >= m.power_limit_w:
            reasons |= pynvml.nvmlClocksEventReasonSwPowerCap
            sm_clock *= 0.9
        if state.temp_c >= m.slowdown_temp_c:
            reasons |= (
                pynvml.nvmlClocksEventReasonSwThermalSlowdown
                | pynvml.nvmlClocksEventReasonHwThermalSlowdown
            )
            sm_clock *= 0.6
        mem_clock = m.max_mem_clock_mhz if util >= _BUSY else m.idle_mem_clock_mhz
        used = round(state.mem_used_mib)
        dram = min(1.0, util * 0.6 * (1.0 + 0.05 * self._noise(i, 3, now)))
        values = {
            "DCGM_FI_DEV_GPU_UTIL": float(round(util * 100.0)),
            "DCGM_FI_DEV_MEM_COPY_UTIL": float(round(dram * 100.0)),
            "DCGM_FI_DEV_ENC_UTIL": 0.0,
            "DCGM_FI_DEV_DEC_UTIL": 0.0,
            "DCGM_FI_DEV_FB_TOTAL": float(m.memory_mib),
            "DCGM_FI_DEV_FB_RESERVED": float(m.reserved_mib),
            "DCGM_FI_DEV_FB_USED": float(used),
            "DCGM_FI_DEV_FB_FREE": float(m.memory_mib - m.reserved_mib - used),
            "DCGM_FI_DEV_POWER_USAGE": round(power, 3),
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION": float(int(state.energy_mj)),
            "DCGM_FI_DEV_POWER_MGMT_LIMIT": m.power_limit_w,
            "DCGM_FI_DEV_GPU_TEMP": float(round(state.temp_c)),
            "DCGM_FI_DEV_SLOWDOWN_TEMP": m.slowdown_temp_c,
            "DCGM_FI_DEV_SHUTDOWN_TEMP": m.shutdown_temp_c,
            "DCGM_FI_DEV_SM_CLOCK": float(round(sm_clock)),
            "DCGM_FI_DEV_MEM_CLOCK": float(mem_clock),
            "DCGM_FI_DEV_CLOCKS_EVENT_REASONS": float(reasons),
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER": 0.0,
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL": float(state.ecc_sbe),
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": float(state.ecc_dbe),
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": 0.0,
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": float(state.remapped_uncorrectable),
            "DCGM_FI_DEV_ROW_REMAP_PENDING": float(state.remap_pending),
            "DCGM_FI_DEV_ROW_REMAP_FAILURE": 0.0,
        }
        if m.hbm:
            values["DCGM_FI_DEV_MEMORY_TEMP"] = float(round(state.temp_c + 6.0))
        if m.nvlink:
            values["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] = float(int(state.nvlink_kib))
        if m.gpm:
            values.update(self._profiling(i, util, dram, now))
        return values

    def _profiling(self, i: int, util: float, dram: float, now: float) -> dict[str, float]:
        """GPM-style ratios and rates, consistent with the utilization they come from."""
        gr = min(1.0, max(0.0, util + 0.01 * self._noise(i, 4, now))) if util else 0.0
        sm_active = gr * 0.85
        values = {
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE": round(gr, 4),
            "DCGM_FI_PROF_SM_ACTIVE": round(sm_active, 4),
            "DCGM_FI_PROF_SM_OCCUPANCY": round(sm_active * 0.55, 4),
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE": round(sm_active * 0.45, 4),
            "DCGM_FI_PROF_DRAM_ACTIVE": round(dram, 4),
            "DCGM_FI_PROF_PCIE_TX_BYTES": round(util * 1.2e9),
            "DCGM_FI_PROF_PCIE_RX_BYTES": round(util * 2.5e9),
        }
        if self.model.nvlink:
            values["DCGM_FI_PROF_NVLINK_TX_BYTES"] = round(self._nvlink_rate(util))
            values["DCGM_FI_PROF_NVLINK_RX_BYTES"] = round(self._nvlink_rate(util))
        return values

    # -- set-up and helpers --------------------------------------------------------------------

    def _device_info(self, i: int) -> DeviceInfo:
        gpu_uuid = uuid.UUID(int=_hash64(self._seed, i, 0) << 64 | _hash64(self._seed, i, 1))
        bus = _PCI_BUSES[i] if i < len(_PCI_BUSES) else 0xE0 + i
        return DeviceInfo(
            index=i,
            uuid=f"GPU-{gpu_uuid}",
            pci_bus_id=f"00000000:{bus:02X}:00.0",
            model_name=self.model.name,
            device=f"nvidia{i}",
            driver_version=DRIVER_VERSION,
        )

    def _make_variation(self, i: int) -> _Variation:
        def spread(channel: int) -> float:  # uniform in -1..1, fixed per GPU
            return _uniform(self._seed, i, 100 + channel, 0) * 2.0 - 1.0

        return _Variation(
            load_scale=1.0 + 0.08 * spread(0),
            power_scale=1.0 + 0.03 * spread(1),
            ambient_c=30.0 + 3.0 * spread(2),
            weights_share=0.35 + 0.1 * spread(3),
        )

    def _initial_state(self, i: int) -> _State:
        now = self._start
        util = self.utilization(i, now)
        power = self._power(i, util, now)
        return _State(
            t=now,
            temp_c=self._steady_temp(i, power),
            mem_used_mib=self._memory_target(i, util),
            energy_mj=_uniform(self._seed, i, 200, 0) * 5e9,  # the driver has been up a while
            nvlink_kib=0.0,
        )

    def _noise(self, i: int, channel: int, t: float) -> float:
        """Smooth noise in -1..1: hashed values at whole seconds, eased in between."""
        k = math.floor(t)
        frac = t - k
        a = _uniform(self._seed, i, channel, k)
        b = _uniform(self._seed, i, channel, k + 1)
        ease = frac * frac * (3.0 - 2.0 * frac)
        return (a + (b - a) * ease) * 2.0 - 1.0

    def _has(self, kind: type, gpu: int) -> bool:
        return any(isinstance(f, kind) and f.gpu == gpu for f in self._faults)

    def _check_index(self, index: int) -> None:
        if not 0 <= index < len(self._devices):
            raise ValueError(
                f"gpu={index} is out of range; this source has GPUs 0..{len(self._devices) - 1}"
            )


_MASK64 = (1 << 64) - 1


def _hash64(*parts: int) -> int:
    """splitmix64 over the parts: a stable hash (Python's ``hash`` is salted for str)."""
    h = 0x9E3779B97F4A7C15
    for part in parts:
        h = (h ^ (part & _MASK64)) & _MASK64
        h = (h + 0x9E3779B97F4A7C15) & _MASK64
        h = ((h ^ (h >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        h = ((h ^ (h >> 27)) * 0x94D049BB133111EB) & _MASK64
        h ^= h >> 31
    return h


def _uniform(*parts: int) -> float:
    return _hash64(*parts) / 2.0**64
