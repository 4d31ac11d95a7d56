"""NVMLSource against a patched NVML (tests/exporter/fake_pynvml.py) that raises the binding's
real error classes, plus one test against the real library on whatever machine runs the suite."""

from __future__ import annotations

import threading
import time

import pynvml
import pytest

from exporter.collector import Collector
from exporter.fields import PROFILING_FIELDS, SOURCE_FIELDS
from exporter.model import WHOLE_DEVICE
from exporter.sources import NoDriverError, NVMLSource
from exporter.sources.nvml import error_reason
from exporter.sources.nvml.xid import XidWaitError
from tests.exporter.fake_pynvml import FakeGPU, FakeMIG, FakeNVML
from tests.waiting import wait_until

MIB = 1024 * 1024
GPM_FULL = {
    pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 80.0,
    pynvml.NVML_GPM_METRIC_SM_UTIL: 62.5,
    pynvml.NVML_GPM_METRIC_SM_OCCUPANCY: 30.0,
    pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 25.0,
    pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL: 45.0,
    pynvml.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 100.0,
    pynvml.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 250.0,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 1000.0,
    pynvml.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 2000.0,
}


def two_gpus() -> list[FakeGPU]:
    return [
        FakeGPU(0, "GPU-aaaaaaaa-0000-0000-0000-000000000000", minor=0, gpm=dict(GPM_FULL)),
        FakeGPU(1, "GPU-bbbbbbbb-1111-1111-1111-111111111111", pci_bus_id="00000000:2A:00.0",
                minor=3, gpm=dict(GPM_FULL)),
    ]  # fmt: skip


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeNVML:
    nvml = FakeNVML(two_gpus())
    nvml.install(monkeypatch)
    return nvml


@pytest.fixture
def source(fake: FakeNVML):
    src = NVMLSource.open(event_timeout_ms=20)
    yield src
    src.close()


def test_enumerates_gpus_with_dcgm_labels(source: NVMLSource) -> None:
    first, second = source.devices()
    assert first.uuid == "GPU-aaaaaaaa-0000-0000-0000-000000000000"
    assert first.model_name == "NVIDIA H100 80GB HBM3"
    assert first.pci_bus_id == "00000000:18:00.0"
    assert first.driver_version == "570.124.06"
    assert (first.device, second.device) == ("nvidia0", "nvidia3")  # from the minor number
    assert second.mig_instance_id is None and second.mig_profile is None


def test_every_field_is_read_and_converted_to_dcgm_units(
    fake: FakeNVML, source: NVMLSource
) -> None:
    gpu0 = source.devices()[0]
    first = source.read(gpu0)
    assert not first.errors
    # GPM needs two samples: the first read only primes it, profiling fields stay absent.
    assert not set(PROFILING_FIELDS) & first.values.keys()

    reading = source.read(gpu0)
    assert not reading.errors
    assert set(reading.values) == set(SOURCE_FIELDS)
    v = reading.values
    assert v["DCGM_FI_DEV_GPU_UTIL"] == 87
    assert v["DCGM_FI_DEV_MEM_COPY_UTIL"] == 41
    assert v["DCGM_FI_DEV_FB_TOTAL"] == 81559
    assert v["DCGM_FI_DEV_FB_RESERVED"] == 527
    assert v["DCGM_FI_DEV_FB_USED"] == 40000
    assert v["DCGM_FI_DEV_FB_FREE"] == 81559 - 527 - 40000
    assert v["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(512.345)
    assert v["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == 9_876_543_210
    assert v["DCGM_FI_DEV_POWER_MGMT_LIMIT"] == 700.0
    assert v["DCGM_FI_DEV_GPU_TEMP"] == 63
    assert v["DCGM_FI_DEV_MEMORY_TEMP"] == 70
    assert v["DCGM_FI_DEV_SLOWDOWN_TEMP"] == 89
    assert v["DCGM_FI_DEV_SHUTDOWN_TEMP"] == 92
    assert v["DCGM_FI_DEV_SM_CLOCK"] == 1980
    assert v["DCGM_FI_DEV_MEM_CLOCK"] == 2619
    assert v["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] == pynvml.nvmlClocksEventReasonSwPowerCap
    assert v["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == 3
    assert v["DCGM_FI_DEV_ENC_UTIL"] == 0
    assert v["DCGM_FI_DEV_DEC_UTIL"] == 5
    assert v["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] == 12
    assert v["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] == 1
    assert v["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] == 2
    assert v["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] == 1
    assert v["DCGM_FI_DEV_ROW_REMAP_PENDING"] == 1
    assert v["DCGM_FI_DEV_ROW_REMAP_FAILURE"] == 0
    assert v["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] == 4_000_000
    assert v["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.80)
    assert v["DCGM_FI_PROF_SM_ACTIVE"] == pytest.approx(0.625)
    assert v["DCGM_FI_PROF_SM_OCCUPANCY"] == pytest.approx(0.30)
    assert v["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] == pytest.approx(0.25)
    assert v["DCGM_FI_PROF_DRAM_ACTIVE"] == pytest.approx(0.45)
    assert v["DCGM_FI_PROF_PCIE_TX_BYTES"] == 100 * MIB
    assert v["DCGM_FI_PROF_PCIE_RX_BYTES"] == 250 * MIB
    assert v["DCGM_FI_PROF_NVLINK_TX_BYTES"] == 1000 * MIB
    assert v["DCGM_FI_PROF_NVLINK_RX_BYTES"] == 2000 * MIB


def test_each_read_takes_exactly_one_new_gpm_sample(fake: FakeNVML, source: NVMLSource) -> None:
    gpu0 = source.devices()[0]
    for _ in range(5):
        source.read(gpu0)
    assert fake.calls.count("nvmlGpmSampleGet") == 5
    assert fake.calls.count("nvmlGpmMetricsGet") == 4  # every read after the first
    assert fake.calls.count("nvmlGpmSampleAlloc") == 4  # two per GPU, once, at open


def test_not_supported_leaves_the_field_absent_not_zero(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].mem_temp_c = None  # GDDR part: the field value reports NOT_SUPPORTED
    gpus[0].nvlink_kib = None
    gpus[0].gpm = {pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL: 50.0}  # a GPU with only some metrics
    fake = FakeNVML(gpus)
    fake.install(monkeypatch)
    fake.fail("nvmlDeviceGetPowerUsage", pynvml.NVML_ERROR_NOT_SUPPORTED, gpu=0)
    fake.fail("nvmlDeviceGetRemappedRows", pynvml.NVML_ERROR_NOT_SUPPORTED)
    src = NVMLSource.open(event_timeout_ms=20)
    try:
        gpu0, gpu1 = src.devices()
        src.read(gpu0)
        reading = src.read(gpu0)
        absent = {
            "DCGM_FI_DEV_POWER_USAGE",
            "DCGM_FI_DEV_MEMORY_TEMP",
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "DCGM_FI_DEV_ROW_REMAP_PENDING",
            "DCGM_FI_DEV_ROW_REMAP_FAILURE",
            *(f for f in PROFILING_FIELDS if f != "DCGM_FI_PROF_GR_ENGINE_ACTIVE"),
        }
        assert not reading.errors
        assert set(reading.values) == set(SOURCE_FIELDS) - absent
        assert reading.values["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] == pytest.approx(0.5)
        assert "DCGM_FI_DEV_POWER_USAGE" in src.read(gpu1).values  # only GPU 0 lacks it
    finally:
        src.close()


def test_gpu_without_gpm_never_reports_profiling_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[1].gpm = None
    fake = FakeNVML(gpus)
    fake.install(monkeypatch)
    src = NVMLSource.open(event_timeout_ms=20)
    try:
        gpu1 = src.devices()[1]
        readings = [src.read(gpu1) for _ in range(3)]
        for reading in readings:
            assert not set(PROFILING_FIELDS) & reading.values.keys()
            assert not reading.errors
        assert "nvmlGpmSampleGet" not in fake.calls
        assert fake.calls.count("nvmlGpmSampleAlloc") == 2  # GPU 0 only
    finally:
        src.close()


def test_other_nvml_errors_are_reported_per_field_in_snake_case(
    fake: FakeNVML, source: NVMLSource
) -> None:
    fake.fail("nvmlDeviceGetTemperature", pynvml.NVML_ERROR_NO_PERMISSION, gpu=1)
    fake.fail("nvmlDeviceGetRemappedRows", pynvml.NVML_ERROR_UNKNOWN, gpu=1)
    fake.fail("nvmlDeviceGetClockInfo", pynvml.NVML_ERROR_TIMEOUT, gpu=1)
    gpu0, gpu1 = source.devices()
    reading = source.read(gpu1)
    assert reading.errors == {
        "DCGM_FI_DEV_GPU_TEMP": "no_permission",
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS": "unknown",
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS": "unknown",
        "DCGM_FI_DEV_ROW_REMAP_PENDING": "unknown",
        "DCGM_FI_DEV_ROW_REMAP_FAILURE": "unknown",
        "DCGM_FI_DEV_SM_CLOCK": "timeout",
        "DCGM_FI_DEV_MEM_CLOCK": "timeout",
    }
    assert not reading.errors.keys() & reading.values.keys()
    assert reading.values["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(512.345)
    assert not source.read(gpu0).errors


def test_gpm_sampling_error_is_reported_for_the_profiling_fields(
    fake: FakeNVML, source: NVMLSource
) -> None:
    gpu0 = source.devices()[0]
    source.read(gpu0)
    fake.fail("nvmlGpmMetricsGet", pynvml.NVML_ERROR_INSUFFICIENT_SIZE)
    reading = source.read(gpu0)
    assert reading.errors == dict.fromkeys(PROFILING_FIELDS, "insufficient_size")


def test_gpu_is_lost_fails_the_whole_device_only(fake: FakeNVML, source: NVMLSource) -> None:
    fake.fail("nvmlDeviceGetMemoryInfo", pynvml.NVML_ERROR_GPU_IS_LOST, gpu=1)
    gpu0, gpu1 = source.devices()
    lost = source.read(gpu1)
    assert lost.values == {}
    assert lost.errors == {WHOLE_DEVICE: "gpu_is_lost"}
    assert set(source.read(gpu0).values) >= set(SOURCE_FIELDS) - set(PROFILING_FIELDS)


def test_init_failure_raises_no_driver_error_with_the_way_out(fake: FakeNVML) -> None:
    fake.init_error = pynvml.NVML_ERROR_DRIVER_NOT_LOADED
    with pytest.raises(NoDriverError) as caught:
        NVMLSource.open()
    message = str(caught.value)
    assert "no NVIDIA driver was found" in message
    assert "--source simulated" in message
    assert "Driver Not Loaded" in message


def test_real_library_either_opens_or_says_no_driver() -> None:
    """Unpatched: on a machine without a GPU the real binding must fail cleanly; with one, open."""
    try:
        src = NVMLSource.open(event_timeout_ms=100)
    except NoDriverError as exc:
        assert "--source simulated" in str(exc)
        return
    try:
        devices = src.devices()
        assert devices
        assert src.read(devices[0]).values
    finally:
        src.close()


def test_mig_instances_are_enumerated_and_read(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[0].migs = [
        FakeMIG(1, "MIG-11111111-aaaa-bbbb-cccc-000000000001", "3g.40gb",
                memory_used=10 * 1024 * MIB, memory_total=40 * 1024 * MIB, gpm=dict(GPM_FULL)),
        FakeMIG(5, "MIG-11111111-aaaa-bbbb-cccc-000000000005", "1g.10gb",
                memory_used=1024 * MIB, memory_total=10 * 1024 * MIB),
    ]  # fmt: skip
    gpus[1].migs = []  # MIG capable but disabled
    fake = FakeNVML(gpus)
    fake.install(monkeypatch)
    src = NVMLSource.open(event_timeout_ms=20)
    try:
        devices = src.devices()
        assert [(d.index, d.mig_instance_id, d.mig_profile) for d in devices] == [
            (0, None, None),
            (0, 1, "3g.40gb"),
            (0, 5, "1g.10gb"),
            (1, None, None),
        ]
        mig = devices[1]
        assert mig.uuid == gpus[0].uuid  # the parent GPU's UUID, as dcgm-exporter labels it
        assert mig.mig_uuid == "MIG-11111111-aaaa-bbbb-cccc-000000000001"
        src.read(mig)
        reading = src.read(mig)
        assert reading.values["DCGM_FI_DEV_FB_USED"] == 10 * 1024
        assert reading.values["DCGM_FI_DEV_FB_TOTAL"] == 40 * 1024
        # Per instance: memory and profiling; power, clocks, temperature are the parent GPU's.
        fb = {"DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_RESERVED",
              "DCGM_FI_DEV_FB_TOTAL"}  # fmt: skip
        assert set(reading.values) == fb | set(PROFILING_FIELDS)
        assert reading.values["DCGM_FI_PROF_SM_ACTIVE"] == pytest.approx(0.625)
        assert "nvmlGpmMigSampleGet" in fake.calls
        assert not reading.errors
        src.read(devices[2])
        small = src.read(devices[2])  # this instance's GPM is unsupported: no profiling fields
        assert set(small.values) == fb and not small.errors
        assert small.values["DCGM_FI_DEV_FB_USED"] == 1024
    finally:
        src.close()


def wait_for_xids(src: NVMLSource, count: int) -> list:
    events: list = []
    deadline = time.monotonic() + 10
    while len(events) < count and time.monotonic() < deadline:
        events += src.drain_xid_events()
        time.sleep(0.01)
    return events


@pytest.mark.timeout(30)
def test_xid_events_arrive_through_the_event_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = two_gpus()
    gpus[1].migs = [FakeMIG(2, "MIG-2", "1g.10gb", memory_used=0, memory_total=10 * 1024 * MIB)]
    fake = FakeNVML(gpus)
    fake.install(monkeypatch)
    src = NVMLSource.open(event_timeout_ms=20, clock=lambda: 1234.5)
    try:
        assert fake.registered == {
            0: pynvml.nvmlEventTypeXidCriticalError,
            1: pynvml.nvmlEventTypeXidCriticalError,
        }
        fake.emit_xid(gpus[1], 79)
        fake.emit_xid(gpus[1], 43, gpu_instance_id=2)
        events = wait_for_xids(src, 2)
        assert [(d.index, d.mig_instance_id, e.xid, e.timestamp) for d, e in events] == [
            (1, None, 79, 1234.5),
            (1, 2, 43, 1234.5),
        ]
        assert src.drain_xid_events() == []
    finally:
        src.close()
    threads = [t for t in threading.enumerate() if t.name == "nvml-xid-events"]
    assert threads == []
    assert fake.event_sets_freed == 1
    assert fake.freed_samples == fake.calls.count("nvmlGpmSampleAlloc") > 0
    assert fake.shutdowns == 1


def drain_fails(src: NVMLSource) -> bool:
    try:
        src.drain_xid_events()
    except XidWaitError:
        return True
    return False


@pytest.mark.timeout(30)
def test_a_failing_event_wait_is_counted_and_logged_once_by_the_collector(
    fake: FakeNVML, source: NVMLSource, caplog: pytest.LogCaptureFixture
) -> None:
    now = [1000.0]
    collector = Collector(source, lambda _: None, interval=1.0, deadline=1.0, clock=lambda: now[0])
    try:
        with caplog.at_level("INFO", logger="exporter"):
            fake.fail("nvmlEventSetWait_v2", pynvml.NVML_ERROR_UNKNOWN)
            wait_until(lambda: drain_fails(source), timeout=10, what="the event wait to fail")
            for _ in range(3):
                now[0] += 1
                snap = collector.collect_once()
            fake.heal("nvmlEventSetWait_v2")
            wait_until(lambda: not drain_fails(source), timeout=10, what="the wait to recover")
            fake.emit_xid(fake.gpus[0], 79)
            wait_until(
                lambda: collector.collect_once().devices[0].xid_counts[79] == 1,
                timeout=10,
                what="an Xid after the recovery",
            )
    finally:
        collector.stop()
    assert snap.errors_total[("", "xid_events", "unknown")] == 3
    lines = [
        (r.levelname, r.getMessage()) for r in caplog.records if "Xid events" in r.getMessage()
    ]
    assert lines == [
        ("WARNING", "draining Xid events failed"),
        ("INFO", "draining Xid events recovered"),
    ]


@pytest.mark.timeout(30)
def test_a_hung_call_blocks_its_read_but_not_close(fake: FakeNVML, source: NVMLSource) -> None:
    release = fake.hang("nvmlDeviceGetPowerUsage")
    outcome: list = []
    reader = threading.Thread(target=lambda: outcome.append(source.read(source.devices()[0])))
    reader.start()
    assert fake.hung.wait(timeout=10)
    source.close()  # returns although a read is stuck inside NVML
    assert fake.shutdowns == 0  # NVML is not shut down under a call in flight
    with pytest.raises(RuntimeError, match="closed"):
        source.read(source.devices()[1])
    release.set()
    reader.join(timeout=10)
    assert not reader.is_alive()
    assert outcome[0].values["DCGM_FI_DEV_POWER_USAGE"] == pytest.approx(512.345)
    assert fake.shutdowns == 1  # ...and is shut down once that call returns


def test_error_reason_uses_nvml_names() -> None:
    assert error_reason(pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)) == "gpu_is_lost"
    assert error_reason(pynvml.NVMLError(pynvml.NVML_ERROR_NO_PERMISSION)) == "no_permission"
    assert error_reason(pynvml.NVMLError(pynvml.NVML_ERROR_TIMEOUT)) == "timeout"
