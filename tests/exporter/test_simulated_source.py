"""SimulatedSource: determinism, physical relationships, load profiles, faults, external load."""

from __future__ import annotations

import csv
import io
import tarfile
import threading
from pathlib import Path

import pynvml
import pytest

from autoglm.datasets import expected_path, fetch_hint
from exporter.fields import PROFILING_FIELDS, SOURCE_FIELDS
from exporter.model import WHOLE_DEVICE, XidEvent
from exporter.sources import SimulatedSource, load_profile, parse_fault
from exporter.sources.faults import (
    EccFault,
    FieldErrorFault,
    HangFault,
    LostFault,
    TempRampFault,
    XidFault,
)
from exporter.sources.gpu_models import MODELS, find_model
from exporter.sources.profiles import DiurnalProfile, TraceProfile

DUTY_CYCLE = expected_path("genai-gpu-duty-cycle")
NO_DUTY_CYCLE = f"needs the whole trace: {fetch_hint('genai-gpu-duty-cycle')}"
NEEDS_DUTY_CYCLE = pytest.mark.skipif(not DUTY_CYCLE.is_file(), reason=NO_DUTY_CYCLE)
START = 1_700_000_000.0
THERMAL = pynvml.nvmlClocksEventReasonHwThermalSlowdown | (
    pynvml.nvmlClocksEventReasonSwThermalSlowdown
)


class Clock:
    """A hand-driven clock: tests move time, nothing sleeps."""

    def __init__(self, t: float = START) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def make(
    profile: str = "constant:0.5", gpus: int = 4, model: str = "H100", seed: int = 7
) -> tuple[SimulatedSource, Clock]:
    clock = Clock()
    return SimulatedSource(gpus, model, seed, load_profile(profile), clock=clock), clock


def values(src: SimulatedSource, gpu: int = 0) -> dict[str, float]:
    reading = src.read(src.devices()[gpu])
    assert not reading.errors
    return reading.values


# -- determinism -------------------------------------------------------------------------------


def run(seed: int) -> tuple[list[str], list[dict[str, float]]]:
    src, clock = make("diurnal:period=600:low=0.1:high=0.9", gpus=3, seed=seed)
    out = []
    for step in range(40):
        clock.t += 1.7
        if step == 20:
            src.set_external_load(2, 0.3)
        out += [values(src, i) for i in range(3)]
    return [d.uuid for d in src.devices()], out


def test_same_seed_and_clock_give_identical_readings() -> None:
    assert run(11) == run(11)


def test_another_seed_gives_other_gpus_and_values() -> None:
    uuids_a, readings_a = run(11)
    uuids_b, readings_b = run(12)
    assert set(uuids_a).isdisjoint(uuids_b)
    assert readings_a != readings_b


def test_instant_values_do_not_depend_on_how_often_the_gpu_is_read() -> None:
    often, clock_often = make("diurnal:period=300:low=0.2:high=0.8")
    rarely, clock_rarely = make("diurnal:period=300:low=0.2:high=0.8")
    for _ in range(120):
        clock_often.t += 1.0
        values(often)
    clock_rarely.t += 120.0
    a, b = values(often), values(rarely)
    for name in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK"):
        assert a[name] == b[name]
    assert abs(a["DCGM_FI_DEV_GPU_TEMP"] - b["DCGM_FI_DEV_GPU_TEMP"]) <= 1


# -- physics -----------------------------------------------------------------------------------


def test_power_rises_with_utilization_from_idle_toward_the_limit() -> None:
    model = find_model("H100")
    powers = []
    for level in (0.0, 0.25, 0.5, 0.75, 1.0):
        src, _ = make(f"constant:{level}", gpus=1)
        powers.append(values(src)["DCGM_FI_DEV_POWER_USAGE"])
    assert powers == sorted(powers) and len(set(powers)) == len(powers)
    assert powers[0] == pytest.approx(model.idle_power_w, rel=0.1)
    assert powers[-1] > 0.85 * model.power_limit_w


@pytest.mark.parametrize("model", [m.name for m in MODELS])
def test_limits_of_the_model_hold_under_any_load(model: str) -> None:
    spec = find_model(model)
    src, clock = make("diurnal:period=120:low=0:high=1", gpus=8, model=model)
    for _ in range(60):
        clock.t += 3.0
        for i in range(8):
            v = values(src, i)
            assert 0 <= v["DCGM_FI_DEV_GPU_UTIL"] <= 100
            assert 0 < v["DCGM_FI_DEV_POWER_USAGE"] <= spec.power_limit_w
            assert v["DCGM_FI_DEV_GPU_TEMP"] < spec.slowdown_temp_c
            assert v["DCGM_FI_DEV_SM_CLOCK"] <= spec.max_sm_clock_mhz
            used, free = v["DCGM_FI_DEV_FB_USED"], v["DCGM_FI_DEV_FB_FREE"]
            assert used + free + v["DCGM_FI_DEV_FB_RESERVED"] == v["DCGM_FI_DEV_FB_TOTAL"]
            assert v["DCGM_FI_DEV_FB_TOTAL"] == spec.memory_mib and free > 0
            assert v["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == spec.power_limit_w
            assert v["DCGM_FI_DEV_SLOWDOWN_TEMP"] == spec.slowdown_temp_c
            assert v["DCGM_FI_DEV_SHUTDOWN_TEMP"] == spec.shutdown_temp_c
            for name in PROFILING_FIELDS[:5]:
                if name in v:
                    assert 0.0 <= v[name] <= 1.0


def test_temperature_lags_a_step_in_power() -> None:
    src, clock = make("constant:0", gpus=1)
    idle = values(src)
    src.set_external_load(0, 1.0)
    clock.t += 2.0
    hot_power = values(src)
    temps = [hot_power["DCGM_FI_DEV_GPU_TEMP"]]
    for _ in range(60):
        clock.t += 5.0
        temps.append(values(src)["DCGM_FI_DEV_GPU_TEMP"])
    assert hot_power["DCGM_FI_DEV_POWER_USAGE"] > 5 * idle["DCGM_FI_DEV_POWER_USAGE"]
    rise = temps[-1] - idle["DCGM_FI_DEV_GPU_TEMP"]
    assert rise > 25
    assert temps[0] - idle["DCGM_FI_DEV_GPU_TEMP"] < 0.1 * rise  # power jumped, temp not yet
    assert temps[8] - idle["DCGM_FI_DEV_GPU_TEMP"] < 0.8 * rise  # 40 s: still on its way
    assert temps == sorted(temps)


def test_memory_follows_load_with_a_lag() -> None:
    src, clock = make("constant:0.1", gpus=1)
    low = values(src)["DCGM_FI_DEV_FB_USED"]
    src.set_external_load(0, 0.9)
    clock.t += 1.0
    just_after = values(src)["DCGM_FI_DEV_FB_USED"]
    clock.t += 120.0
    later = values(src)["DCGM_FI_DEV_FB_USED"]
    assert low < just_after < later
    assert later - low > 0.3 * find_model("H100").memory_mib
    src.set_external_load(0, None)  # back to the profile: memory is released again
    clock.t += 120.0
    assert values(src)["DCGM_FI_DEV_FB_USED"] == pytest.approx(low, rel=0.03)


def test_clocks_boost_under_load_and_idle_is_flagged() -> None:
    model = find_model("L4")
    src, clock = make("constant:0", gpus=1, model="L4")
    idle = values(src)
    assert idle["DCGM_FI_DEV_SM_CLOCK"] == model.idle_sm_clock_mhz
    assert idle["DCGM_FI_DEV_MEM_CLOCK"] == model.idle_mem_clock_mhz
    assert int(idle["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]) & pynvml.nvmlClocksEventReasonGpuIdle
    src.set_external_load(0, 0.6)
    clock.t += 1.0
    busy = values(src)
    assert busy["DCGM_FI_DEV_SM_CLOCK"] == model.max_sm_clock_mhz
    assert busy["DCGM_FI_DEV_MEM_CLOCK"] == model.max_mem_clock_mhz
    assert busy["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == 0


def test_energy_counter_integrates_power() -> None:
    src, clock = make("constant:0.7", gpus=1)
    before = values(src)
    powers = []
    for _ in range(100):
        clock.t += 1.0
        powers.append(values(src)["DCGM_FI_DEV_POWER_USAGE"])
    after = values(src)
    delta_mj = (
        after["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
        - (before["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"])
    )
    assert delta_mj == pytest.approx(sum(powers) * 1000.0, rel=0.01)


def test_profiling_fields_track_utilization_on_gpm_models_only() -> None:
    src, _ = make("constant:0.2", gpus=2)
    src.set_external_load(1, 0.9)
    low, high = values(src, 0), values(src, 1)
    assert set(low) == set(SOURCE_FIELDS)
    for name in PROFILING_FIELDS:
        assert high[name] > low[name]
    assert high["DCGM_FI_PROF_SM_ACTIVE"] <= high["DCGM_FI_PROF_GR_ENGINE_ACTIVE"]
    for model, absent in (
        ("A100", set(PROFILING_FIELDS)),
        (
            "L4",
            {*PROFILING_FIELDS, "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"},
        ),
    ):
        other, _ = make("constant:0.5", gpus=1, model=model)
        assert set(values(other)) == set(SOURCE_FIELDS) - absent


def test_devices_carry_model_and_distinct_identities() -> None:
    src, _ = make(gpus=8, model="NVIDIA H200")
    devices = src.devices()
    assert {d.model_name for d in devices} == {"NVIDIA H200"}
    assert len({d.uuid for d in devices}) == len({d.pci_bus_id for d in devices}) == 8
    assert [d.device for d in devices] == [f"nvidia{i}" for i in range(8)]
    assert all(d.uuid.startswith("GPU-") for d in devices)


def test_unknown_model_and_bad_gpu_count_are_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown GPU model 'B300'.*NVIDIA H100 80GB HBM3"):
        SimulatedSource(1, "B300", 0, load_profile("constant:0.5"))
    with pytest.raises(ValueError, match="at least 1"):
        SimulatedSource(0, "H100", 0, load_profile("constant:0.5"))


# -- profiles ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def duty_cycle() -> dict[float, dict[str, float]]:
    """The real Alibaba per-pod GPU duty cycle, read independently of the code under test."""
    if not DUTY_CYCLE.is_file():
        pytest.skip(NO_DUTY_CYCLE)
    with tarfile.open(DUTY_CYCLE) as archive:
        (member,) = archive.getmembers()
        text = io.TextIOWrapper(archive.extractfile(member), encoding="utf-8")
        table: dict[float, dict[str, float]] = {}
        for row in csv.DictReader(text):
            table.setdefault(float(row["timestamp_anon"]), {})[row["container_ip"]] = float(
                row["value"]
            )
    return table


def test_trace_replay_of_the_alibaba_duty_cycle_mean(duty_cycle) -> None:
    profile = load_profile(f"trace:{DUTY_CYCLE}:speed=57")
    assert isinstance(profile, TraceProfile) and len(profile.series) == 1
    times = sorted(duty_cycle)
    for step in (0, 1, 100, 700):  # speed=57: one trace sample (57 s apart) per second
        row = duty_cycle[times[step]]
        expected = sum(row.values()) / len(row) / 100.0
        assert profile.utilization(START, float(step), 0) == pytest.approx(expected)
    # Halfway between two samples: linear interpolation.
    a, b = duty_cycle[times[10]], duty_cycle[times[11]]
    mid = (sum(a.values()) / len(a) + sum(b.values()) / len(b)) / 200.0
    assert profile.utilization(START, 10.5, 0) == pytest.approx(mid)


def test_trace_replay_per_container(duty_cycle) -> None:
    each = load_profile(f"trace:{DUTY_CYCLE}:container=each")
    containers = {cid for row in duty_cycle.values() for cid in row}
    assert len(each.series) == len(containers)
    means = [sum(s.values) / len(s.values) for s in each.series]
    assert means == sorted(means, reverse=True)  # GPU 0 replays the busiest pod

    cid = sorted(containers)[0]
    one = load_profile(f"trace:{DUTY_CYCLE}:container={cid}")
    first = duty_cycle[min(duty_cycle)][cid]
    assert one.utilization(START, 0.0, 5) == pytest.approx(first / 100.0)

    fast = load_profile(f"trace:{DUTY_CYCLE}:container=each:speed=100")
    clock = Clock()
    src = SimulatedSource(8, "H100", 3, fast, clock=clock)
    totals = [0.0] * 8
    for _ in range(82):  # 820 s at speed 100: the whole 22.8 h trace
        clock.t += 10.0
        for i in range(8):
            totals[i] += values(src, i)["DCGM_FI_DEV_GPU_UTIL"]
    assert totals[0] > totals[7] > 0


def test_trace_from_a_plain_csv_loops_and_compresses_time(tmp_path: Path) -> None:
    path = tmp_path / "load.csv"
    path.write_text("timestamp,value\n100,0.2\n110,0.6\n120,1.0\n")
    profile = load_profile(f"trace:{path}:speed=2")
    assert profile.utilization(0, 0.0, 0) == pytest.approx(0.2)
    assert profile.utilization(0, 2.5, 0) == pytest.approx(0.4)  # 5 s into the trace
    assert profile.utilization(0, 10.0, 0) == pytest.approx(0.2)  # 20 s: looped to the start
    percent = tmp_path / "percent.csv"
    percent.write_text("timestamp,value\n0,0.5\n10,0.9\n")
    assert load_profile(f"trace:{percent}:unit=percent").utilization(0, 0, 0) == 0.005


def test_diurnal_profile_peaks_at_its_peak() -> None:
    profile = load_profile("diurnal:period=86400:low=0.2:high=0.9:peak=50400")
    assert isinstance(profile, DiurnalProfile)
    assert profile.utilization(86400 * 3 + 50400, 0, 0) == pytest.approx(0.9)
    assert profile.utilization(86400 * 3 + 50400 - 43200, 0, 0) == pytest.approx(0.2)


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("constant:1.5", "between 0 and 1"),
        ("constant:lots", "must be a number"),
        ("sine:0.5", "unknown load profile"),
        ("diurnal:period=0", "above 0"),
        ("diurnal:low=0.9:high=0.1", "above high"),
        ("diurnal:width=3", "bad option 'width=3'"),
        ("trace:", "needs a file path"),
        ("trace:/nonexistent/x.csv", "does not exist"),
        pytest.param(
            f"trace:{DUTY_CYCLE}:container=nope", "no container 'nope'", marks=NEEDS_DUTY_CYCLE
        ),
        (f"trace:{DUTY_CYCLE}:speed=-1", "above 0"),
        (f"trace:{DUTY_CYCLE}:unit=watts", "percent or ratio"),
    ],
)
def test_bad_profile_specs_name_the_problem(spec: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        load_profile(spec)


def test_trace_without_usable_header_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("when,how_much\n1,2\n")
    with pytest.raises(ValueError, match="header must name a timestamp column"):
        load_profile(f"trace:{path}")


# -- faults ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "fault"),
    [
        ("xid:gpu=2:code=79", XidFault(2, 79)),
        ("lost:gpu=1", LostFault(1)),
        ("temp-ramp:gpu=0:to=95:over=30s", TempRampFault(0, 95.0, 30.0)),
        ("temp-ramp:gpu=0:to=95:over=2m", TempRampFault(0, 95.0, 120.0)),
        ("hang:gpu=3", HangFault(3)),
        (
            "field-error:gpu=0:field=DCGM_FI_DEV_POWER_USAGE",
            FieldErrorFault(0, "DCGM_FI_DEV_POWER_USAGE", "unknown"),
        ),
        (
            "field-error:gpu=0:field=DCGM_FI_DEV_GPU_TEMP:reason=timeout",
            FieldErrorFault(0, "DCGM_FI_DEV_GPU_TEMP", "timeout"),
        ),
        ("ecc:gpu=4:dbe=2", EccFault(4, 0, 2)),
    ],
)
def test_fault_specs_parse_and_round_trip(spec: str, fault) -> None:
    assert parse_fault(spec) == fault
    assert parse_fault(fault.spec()) == fault


@pytest.mark.parametrize(
    ("spec", "problem"),
    [
        ("melt:gpu=0", "unknown fault kind 'melt'"),
        ("xid:gpu=2", "missing code"),
        ("xid:gpu=two:code=79", "gpu must be a whole number"),
        ("lost:gpu=1:when=now", "bad part 'when=now'"),
        ("temp-ramp:gpu=0:to=95:over=soon", "over must be a duration"),
        ("temp-ramp:gpu=0:to=900:over=30s", "not a GPU temperature"),
        ("field-error:gpu=0:field=POWER", "unknown field 'POWER'"),
        ("field-error:gpu=0:field=DCGM_FI_DEV_GPU_TEMP:reason=Bad Reason", "snake_case"),
    ],
)
def test_bad_fault_specs_name_the_problem(spec: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem) as caught:
        parse_fault(spec)
    if problem.startswith(("unknown fault", "missing", "bad part")):  # the shape is wrong
        assert "xid:gpu=N:code=N" in str(caught.value)  # so the message shows the forms


def test_xid_fault_is_reported_once() -> None:
    src, clock = make()
    clock.t += 5.0
    src.inject(parse_fault("xid:gpu=2:code=79"))
    assert src.drain_xid_events() == [(src.devices()[2], XidEvent(79, START + 5.0))]
    assert src.drain_xid_events() == []
    assert src.active_faults() == []


def test_lost_gpu_fails_like_nvml_until_cleared() -> None:
    src, _ = make()
    src.inject(parse_fault("lost:gpu=1"))
    lost = src.read(src.devices()[1])
    assert lost.values == {} and lost.errors == {WHOLE_DEVICE: "gpu_is_lost"}
    assert values(src, 0)  # the others read fine
    src.clear_faults()
    assert set(values(src, 1)) == set(SOURCE_FIELDS)


def test_temperature_ramp_reaches_its_target_and_throttles() -> None:
    model = find_model("H100")
    src, clock = make("constant:0.6")
    start = values(src)["DCGM_FI_DEV_GPU_TEMP"]
    src.inject(parse_fault("temp-ramp:gpu=0:to=95:over=30s"))
    clock.t += 15.0
    halfway = values(src)["DCGM_FI_DEV_GPU_TEMP"]
    assert halfway == pytest.approx((start + 95) / 2, abs=1)
    clock.t += 15.0
    hot = values(src)
    assert hot["DCGM_FI_DEV_GPU_TEMP"] == 95
    assert int(hot["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"]) & THERMAL == THERMAL
    assert hot["DCGM_FI_DEV_SM_CLOCK"] < model.max_sm_clock_mhz
    assert values(src, 1)["DCGM_FI_DEV_GPU_TEMP"] < model.slowdown_temp_c
    clock.t += 600.0
    assert values(src)["DCGM_FI_DEV_GPU_TEMP"] == 95  # holds until cleared
    src.clear_faults()
    clock.t += 300.0
    assert values(src)["DCGM_FI_DEV_GPU_TEMP"] == pytest.approx(start, abs=2)


@pytest.mark.timeout(30)
def test_hang_blocks_reads_until_cleared() -> None:
    src, _ = make()
    src.inject(parse_fault("hang:gpu=3"))
    results: list = []
    reader = threading.Thread(target=lambda: results.append(src.read(src.devices()[3])))
    reader.start()
    reader.join(timeout=0.2)
    assert reader.is_alive() and results == []
    assert values(src, 0)  # other GPUs are not held up
    src.clear_faults(gpu=3)
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert set(results[0].values) == set(SOURCE_FIELDS)


@pytest.mark.timeout(30)
def test_close_releases_a_hung_read() -> None:
    src, _ = make()
    src.inject(HangFault(0))
    errors: list = []

    def read() -> None:
        try:
            src.read(src.devices()[0])
        except RuntimeError as exc:
            errors.append(exc)

    reader = threading.Thread(target=read)
    reader.start()
    reader.join(timeout=0.2)
    src.close()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert "closed" in str(errors[0])


def test_field_error_drops_one_field() -> None:
    src, _ = make()
    src.inject(parse_fault("field-error:gpu=0:field=DCGM_FI_DEV_POWER_USAGE:reason=timeout"))
    reading = src.read(src.devices()[0])
    assert reading.errors == {"DCGM_FI_DEV_POWER_USAGE": "timeout"}
    assert set(reading.values) == set(SOURCE_FIELDS) - {"DCGM_FI_DEV_POWER_USAGE"}
    assert [f.spec() for f in src.active_faults()] == [
        "field-error:gpu=0:field=DCGM_FI_DEV_POWER_USAGE:reason=timeout"
    ]


def test_ecc_fault_counts_errors_and_leaves_a_remap_pending() -> None:
    src, _ = make()
    src.inject(parse_fault("ecc:gpu=1:sbe=5:dbe=1"))
    src.inject(parse_fault("ecc:gpu=1:sbe=2"))
    v = values(src, 1)
    assert v["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == 7
    assert v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 1
    assert v["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == 1
    assert v["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 1
    assert values(src, 0)["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 0


def test_faults_for_missing_gpus_are_refused() -> None:
    src, _ = make(gpus=2)
    with pytest.raises(ValueError, match=r"gpu=5 is out of range; this source has GPUs 0\.\.1"):
        src.inject(parse_fault("lost:gpu=5"))


# -- external load -----------------------------------------------------------------------------


def test_external_load_overrides_the_profile_per_gpu() -> None:
    src, clock = make("constant:0.1", gpus=2)
    src.set_external_load(1, 0.9)
    clock.t += 1.0
    assert values(src, 1)["DCGM_FI_DEV_GPU_UTIL"] == 90
    assert values(src, 0)["DCGM_FI_DEV_GPU_UTIL"] < 20
    src.set_external_load(1, None)
    clock.t += 1.0
    assert values(src, 1)["DCGM_FI_DEV_GPU_UTIL"] < 20
    with pytest.raises(ValueError, match="ratio"):
        src.set_external_load(0, 1.5)
    with pytest.raises(ValueError, match="out of range"):
        src.set_external_load(2, 0.5)
