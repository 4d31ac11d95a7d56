"""The collection loop against a scripted source and a fake clock: hangs, errors, Xids."""

from __future__ import annotations

import threading

import pytest

from exporter.collector import Collector, Snapshot, device_key
from exporter.fields import CRITICAL_XIDS, XID_FIELD
from exporter.model import XidEvent
from tests.exporter.fakes import ScriptedSource, device
from tests.waiting import wait_until

# Reads that do not hang finish in microseconds; this deadline only bounds the hung ones.
DEADLINE = 0.5
ZERO_CRITICAL = dict.fromkeys(CRITICAL_XIDS, 0)


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


def failures(snap: Snapshot) -> dict[tuple[str, str, str], int]:
    """The error counts that are not 0 (the known whole-device children exist from the start)."""
    return {key: count for key, count in snap.errors_total.items() if count}


def make(source: ScriptedSource, clock: FakeClock, **kwargs: float) -> Collector:
    kwargs.setdefault("interval", DEADLINE)
    kwargs.setdefault("deadline", DEADLINE)
    return Collector(source, lambda _: None, clock=clock, **kwargs)


@pytest.fixture
def cleanup() -> list[tuple[Collector, ScriptedSource]]:
    made: list[tuple[Collector, ScriptedSource]] = []
    yield made
    for collector, source in made:
        source.close()  # releases hung reads so reader threads can end
        collector.stop()


def test_reads_every_device_into_an_immutable_snapshot(clock, cleanup):
    source = ScriptedSource([device(0), device(1)])
    collector = make(source, clock)
    cleanup.append((collector, source))

    snap = collector.collect_once()

    assert snap.taken_at == clock.now
    assert snap.last_success == clock.now
    assert [d.up for d in snap.devices] == [True, True]
    assert snap.devices[1].values["DCGM_FI_DEV_GPU_UTIL"] == 51.0
    assert snap.devices[0].values[XID_FIELD] == 0.0
    assert snap.errors_total == {
        (gpu, "all", reason): 0 for gpu in ("0", "1") for reason in ("timeout", "gpu_is_lost")
    }
    assert (snap.collections_total, snap.overruns_total) == (1, 0)
    with pytest.raises(TypeError):
        snap.devices[0].values["DCGM_FI_DEV_GPU_UTIL"] = 0.0  # type: ignore[index]


def test_failed_field_is_counted_and_dropped_while_the_rest_is_served(clock, cleanup):
    source = ScriptedSource(
        [device(0)], {"DCGM_FI_DEV_GPU_UTIL": 40.0, "DCGM_FI_DEV_POWER_USAGE": 300.0}
    )
    source.values[0].pop("DCGM_FI_DEV_POWER_USAGE")
    source.errors[0] = {"DCGM_FI_DEV_POWER_USAGE": "unknown_error"}
    collector = make(source, clock)
    cleanup.append((collector, source))

    collector.collect_once()
    snap = collector.collect_once()

    dev = snap.devices[0]
    assert dev.up
    assert "DCGM_FI_DEV_POWER_USAGE" not in dev.values
    assert dev.values["DCGM_FI_DEV_GPU_UTIL"] == 40.0
    assert failures(snap) == {("0", "DCGM_FI_DEV_POWER_USAGE", "unknown_error"): 2}


def test_hung_read_times_out_without_blocking_others_or_piling_up(clock, cleanup):
    source = ScriptedSource([device(0), device(1), device(2)])
    source.hang(1)
    collector = make(source, clock)
    cleanup.append((collector, source))

    first = collector.collect_once()
    assert source.entered_hang.is_set()
    assert [d.up for d in first.devices] == [True, False, True]
    assert first.devices[1].values == {}  # dropped, not served stale
    assert failures(first) == {("1", "all", "timeout"): 1}
    assert first.overruns_total == 1

    second = collector.collect_once()
    assert source.reads[1] == 1  # the hung device was not asked again
    assert source.reads[0] == 2
    assert failures(second) == {("1", "all", "timeout"): 2}
    assert second.devices[0].up and not second.devices[1].up

    assert second.hung_devices == ("1",)
    source.release(1)
    wait_until(lambda: not collector.in_flight(), timeout=20, what="the released read to return")
    third = collector.collect_once()
    # The late result of the hung read was discarded; GPU 1 is read afresh.
    assert third.devices[1].up
    assert third.hung_devices == ()
    assert source.reads[1] == 2
    assert third.devices[1].values["DCGM_FI_DEV_GPU_UTIL"] == 51.0


def test_a_read_that_raises_counts_its_reason_and_marks_the_gpu_down(clock, cleanup):
    class GpuLost(RuntimeError):
        reason = "gpu_is_lost"

    source = ScriptedSource([device(0), device(1)])
    source.raises[0] = GpuLost("fell off the bus")
    source.raises[1] = OSError("boom")
    collector = make(source, clock)
    cleanup.append((collector, source))

    snap = collector.collect_once()

    assert [d.up for d in snap.devices] == [False, False]
    assert failures(snap) == {("0", "all", "gpu_is_lost"): 1, ("1", "all", "exception"): 1}
    assert snap.last_success is None  # no device read: not a success


def test_last_success_keeps_the_time_of_the_last_good_collection(clock, cleanup):
    source = ScriptedSource([device(0)])
    collector = make(source, clock)
    cleanup.append((collector, source))
    good = collector.collect_once().taken_at
    source.raises[0] = RuntimeError("driver gone")
    clock.now += 10
    snap = collector.collect_once()
    assert snap.last_success == good
    assert snap.taken_at == good + 10


def test_xids_are_counted_per_code_and_the_dcgm_field_is_not_sticky(clock, cleanup):
    source = ScriptedSource([device(0), device(1)])
    collector = make(source, clock, xid_hold=300.0)
    cleanup.append((collector, source))
    source.add_xid(1, 79, clock.now - 5)
    source.add_xid(1, 13, clock.now - 2)
    source.add_xid(1, 13, clock.now - 1)

    snap = collector.collect_once()
    gpu1 = snap.devices[1]
    assert gpu1.xid_counts == {**ZERO_CRITICAL, 79: 1, 13: 2}
    assert gpu1.last_xid == (13, clock.now - 1)
    assert gpu1.values[XID_FIELD] == 13.0
    assert snap.devices[0].values[XID_FIELD] == 0.0

    clock.now += 301  # past the hold: the DCGM field returns to 0, the history stays
    later = collector.collect_once().devices[1]
    assert later.values[XID_FIELD] == 0.0
    assert later.xid_counts == {**ZERO_CRITICAL, 79: 1, 13: 2}
    assert later.last_xid == (13, clock.now - 302)


def test_critical_xid_counters_start_at_zero_on_every_gpu(clock, cleanup):
    mig = device(1, mig_profile="1g.10gb", mig_instance_id=2, mig_uuid="MIG-2")
    source = ScriptedSource([device(0), mig])
    collector = make(source, clock)
    cleanup.append((collector, source))

    first = collector.collect_once()
    assert [d.xid_counts for d in first.devices] == [ZERO_CRITICAL, ZERO_CRITICAL]
    assert ZERO_CRITICAL.keys() == {48, 63, 64, 74, 79, 94, 95}
    assert all(d.last_xid is None for d in first.devices)

    source.add_xid(0, 79, clock.now)  # the first event of a code is an increase from 0
    assert collector.collect_once().devices[0].xid_counts == {**ZERO_CRITICAL, 79: 1}


def test_xid_on_a_physical_gpu_goes_to_its_first_mig_instance(clock, cleanup):
    first = device(0, mig_profile="1g.10gb", mig_instance_id=7, mig_uuid="MIG-abc")
    second = device(0, mig_profile="1g.10gb", mig_instance_id=9, mig_uuid="MIG-def")
    source = ScriptedSource([first, second])
    collector = make(source, clock)
    cleanup.append((collector, source))
    source.add_xid_for(device(0), XidEvent(48, clock.now))
    source.add_xid_for(second, XidEvent(13, clock.now))

    devs = collector.collect_once().devices

    assert [d.key for d in devs] == ["0/7", "0/9"] == [device_key(first), device_key(second)]
    assert devs[0].xid_counts == {**ZERO_CRITICAL, 48: 1}
    assert devs[1].xid_counts == {**ZERO_CRITICAL, 13: 1}


def test_background_loop_publishes_snapshots_and_stops(clock):
    source = ScriptedSource([device(0)])
    published: list[Snapshot] = []
    two = threading.Event()

    def publish(snap: Snapshot) -> None:
        published.append(snap)
        if len(published) >= 2:
            two.set()

    collector = Collector(source, publish, interval=0.05, deadline=0.05, clock=clock)
    collector.start()
    try:
        assert two.wait(timeout=10)
    finally:
        collector.stop()
        source.close()
    count = len(published)
    assert [s.collections_total for s in published] == list(range(1, count + 1))
    assert collector.latest is published[-1]


def test_deadline_longer_than_interval_is_refused():
    with pytest.raises(ValueError, match="deadline"):
        Collector(ScriptedSource([device(0)]), lambda _: None, interval=1.0, deadline=2.0)


def _fault_lines(caplog: pytest.LogCaptureFixture) -> list[tuple[str, str, str, str]]:
    """(level, message, gpu, field) of the collector's lines about read failures."""
    return [
        (r.levelname, r.getMessage(), r.__dict__["gpu"], r.__dict__["field"])
        for r in caplog.records
        if r.name == "exporter.collector" and "read" in r.getMessage()
    ]


def test_faults_of_the_simulated_source_are_logged_once_each_and_their_recovery_too(caplog):
    from exporter.sources import SimulatedSource, load_profile, parse_fault

    clock = FakeClock()
    source = SimulatedSource(4, "H100", 7, load_profile("constant:0.5"), clock=clock)
    for spec in ("lost:gpu=1", "hang:gpu=3", "field-error:gpu=0:field=DCGM_FI_DEV_POWER_USAGE"):
        source.inject(parse_fault(spec))
    collector = Collector(source, lambda _: None, interval=0.2, deadline=0.2, clock=clock)
    try:
        with caplog.at_level("INFO", logger="exporter.collector"):
            for _ in range(4):
                clock.now += 1
                snap = collector.collect_once()
            assert [d.up for d in snap.devices] == [True, False, True, False]
            assert snap.errors_total[("1", "all", "gpu_is_lost")] == 4
            assert sorted(_fault_lines(caplog)) == [
                ("WARNING", "device read failed", "1", "all"),
                ("WARNING", "device read failed", "3", "all"),
                ("WARNING", "field read failed", "0", "DCGM_FI_DEV_POWER_USAGE"),
            ]
            by_gpu = {r.__dict__["gpu"]: r.__dict__ for r in caplog.records}
            assert (by_gpu["1"]["reason"], by_gpu["1"]["error"]) == ("gpu_is_lost", "gpu_is_lost")
            assert by_gpu["3"]["reason"] == "timeout" and "deadline" in by_gpu["3"]["error"]
            assert by_gpu["0"]["reason"] == "unknown"
            assert by_gpu["1"]["uuid"] == source.devices()[1].uuid

            caplog.clear()
            source.clear_faults()
            wait_until(lambda: not collector.in_flight(), timeout=20, what="the hung read")
            for _ in range(3):
                clock.now += 1
                snap = collector.collect_once()
            assert all(d.up for d in snap.devices)
            lines = _fault_lines(caplog)
            assert sorted(lines) == [
                ("INFO", "device read recovered", "1", "all"),
                ("INFO", "device read recovered", "3", "all"),
                ("INFO", "field read recovered", "0", "DCGM_FI_DEV_POWER_USAGE"),
            ]
            recovered = {r.__dict__["gpu"]: r.__dict__ for r in caplog.records}
            assert recovered["1"]["failed_for_s"] == 4.0
    finally:
        source.close()
        collector.stop()


def test_a_read_that_keeps_raising_is_logged_once_and_again_when_its_reason_changes(
    clock, cleanup, caplog
):
    class GpuLost(RuntimeError):
        reason = "gpu_is_lost"

    source = ScriptedSource(
        [device(0)], {"DCGM_FI_DEV_GPU_UTIL": 40.0, "DCGM_FI_DEV_POWER_USAGE": 1.0}
    )
    source.errors[0] = {"DCGM_FI_DEV_POWER_USAGE": "unknown_error"}
    collector = make(source, clock)
    cleanup.append((collector, source))

    with caplog.at_level("INFO", logger="exporter.collector"):
        collector.collect_once()
        source.raises[0] = OSError("boom")
        for _ in range(3):
            collector.collect_once()
        source.raises[0] = GpuLost("fell off the bus")
        for _ in range(3):
            collector.collect_once()
        del source.raises[0]
        collector.collect_once()

    assert _fault_lines(caplog) == [
        ("WARNING", "field read failed", "0", "DCGM_FI_DEV_POWER_USAGE"),
        ("WARNING", "device read failed", "0", "all"),
        ("WARNING", "device read failed", "0", "all"),
        ("INFO", "device read recovered", "0", "all"),
    ]  # the field failed all along: while the GPU was unreadable it was not taken as recovered
    failed = [r.__dict__ for r in caplog.records if r.getMessage() == "device read failed"]
    assert (failed[0]["reason"], failed[0]["error"]) == ("exception", "OSError('boom')")
    assert (failed[1]["reason"], failed[1]["previous_reason"]) == ("gpu_is_lost", "exception")


def test_a_failing_xid_drain_is_logged_once_again_when_its_reason_changes_and_on_recovery(
    clock, cleanup, caplog
):
    class NvmlUnknown(RuntimeError):
        reason = "unknown"

    source = ScriptedSource([device(0)])
    collector = make(source, clock)
    cleanup.append((collector, source))

    with caplog.at_level("INFO", logger="exporter.collector"):
        source.drain_raises = OSError("event set gone")
        for _ in range(3):
            clock.now += 1
            collector.collect_once()
        source.drain_raises = NvmlUnknown("event set wait failed")
        for _ in range(2):
            clock.now += 1
            collector.collect_once()
        source.drain_raises = None
        source.add_xid(0, 79, clock.now)
        clock.now += 1
        snap = collector.collect_once()
        clock.now += 1
        collector.collect_once()

    drain = [r for r in caplog.records if "Xid events" in r.getMessage()]
    assert [(r.levelname, r.getMessage()) for r in drain] == [
        ("WARNING", "draining Xid events failed"),
        ("WARNING", "draining Xid events failed"),
        ("INFO", "draining Xid events recovered"),
    ]
    first, changed, recovered = (r.__dict__ for r in drain)
    assert (first["field"], first["reason"]) == ("xid_events", "exception")
    assert first["error"] == "OSError('event set gone')"
    assert (changed["reason"], changed["previous_reason"]) == ("unknown", "exception")
    assert (recovered["reason"], recovered["failed_for_s"]) == ("unknown", 5.0)
    # Every failed drain still counts, and the events kept by the source arrive afterwards.
    drain_failures = {k: v for k, v in failures(snap).items() if k[1] == "xid_events"}
    assert drain_failures == {("", "xid_events", "exception"): 3, ("", "xid_events", "unknown"): 2}
    assert snap.devices[0].xid_counts[79] == 1


def test_every_collection_is_observed_in_the_duration_histogram(clock, cleanup):
    source = ScriptedSource([device(0), device(1)])
    source.hang(1)  # one collection waits for its deadline: a slow one among fast ones
    collector = make(source, clock)
    cleanup.append((collector, source))

    snaps = [collector.collect_once() for _ in range(4)]

    histogram = snaps[-1].collection_seconds
    durations = [s.duration_seconds for s in snaps]
    assert histogram.count == snaps[-1].collections_total == 4
    assert histogram.sum == pytest.approx(sum(durations))
    for le, count in histogram.cumulative():
        assert count == sum(d <= le for d in durations), le
    assert [s.collection_seconds.count for s in snaps] == [1, 2, 3, 4]  # each its own value
