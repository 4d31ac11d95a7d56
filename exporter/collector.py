"""The background collection loop: reads every device on a schedule into immutable snapshots.

Scrapes never touch the source; they are served from the last snapshot. Each device is read by its
own worker thread so that a hung driver call costs one device, not the whole collection: the
collection waits for its reads only until its deadline, reports the stragglers as failed with
reason ``timeout`` (their series are dropped, not served stale), and does not ask a device whose
previous read is still hung to read again, so hung calls never pile up.

Failures are logged as they start and end, not at every collection: one warning when a GPU
becomes unreadable, one of its fields starts failing or the source's Xid events cannot be drained
(the GPU, the field, the reason and the error), one more if the reason changes, and one info line
when it reads again. Their counts are in ``autoglm_exporter_collect_errors_total``, whose
whole-device children for the reasons known up front exist at 0 from the first collection.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from exporter.fields import CRITICAL_XIDS, XID_FIELD
from exporter.histogram import Histogram
from exporter.model import GPU_IS_LOST, WHOLE_DEVICE, DeviceInfo, DeviceReading, GPUSource

log = logging.getLogger(__name__)

TIMEOUT = "timeout"
XID_EVENTS = "xid_events"
"""``field`` of a failed drain of the source's Xid events; its ``gpu`` is empty, since one
event set serves every GPU."""
# Whole-device failure reasons every source can produce: the collector's own deadline and a GPU
# fallen off the bus. Their counters start at 0 on every device, so the first failure is an
# increase that rate() and alerts see; other reasons depend on the driver and appear when seen.
KNOWN_DEVICE_FAILURES = (TIMEOUT, GPU_IS_LOST)
# Collection wall time: from NVML reads of a few GPUs (milliseconds) to a collection that waited
# for the deadline of a long interval (seconds).
COLLECTION_SECONDS_BUCKETS = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


def device_key(info: DeviceInfo) -> str:
    """``gpu`` label of the exporter's own per-device metrics: ``0``, or ``0/3`` for MIG GI 3."""
    if info.mig_instance_id is None:
        return str(info.index)
    return f"{info.index}/{info.mig_instance_id}"


@dataclass(frozen=True)
class DeviceSnapshot:
    """One device as the last collection saw it."""

    info: DeviceInfo
    key: str
    up: bool  # the read finished in time and returned at least one value
    values: Mapping[str, float]  # DCGM field name -> value in DCGM units; failed fields absent
    xid_counts: Mapping[int, int]  # Xid code -> events since start; CRITICAL_XIDS always present
    last_xid: tuple[int, float] | None  # (code, unix time) of the most recent Xid


@dataclass(frozen=True)
class Snapshot:
    """The immutable result of one collection, plus the collector's running totals."""

    taken_at: float  # unix time the collection finished
    duration_seconds: float
    collection_seconds: Histogram  # every collection's duration since start, this one included
    devices: tuple[DeviceSnapshot, ...]
    collections_total: int
    overruns_total: int  # collections that hit their deadline with reads still pending
    last_success: float | None  # unix time of the last collection that read any device
    errors_total: Mapping[tuple[str, str, str], int]  # (gpu, field, reason) -> count
    hung_devices: tuple[str, ...] = ()  # keys of devices whose read outlived its deadline


class _DeviceReader:
    """A daemon thread that reads one device when asked; stays busy while a read hangs."""

    def __init__(self, source: GPUSource, info: DeviceInfo, finished: threading.Condition) -> None:
        self.info = info
        self.key = device_key(info)
        self._source = source
        self._finished = finished
        self._wake = threading.Event()
        self._closed = False
        self.busy = False  # guarded by ``finished``
        self.generation = 0  # which collection asked for the read in flight / last result
        self.result: DeviceReading | BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"gpu-reader-{self.key}", daemon=True
        )
        self._thread.start()

    def request(self, generation: int) -> None:
        """Start a read for collection ``generation``; the caller holds ``finished``."""
        self.busy = True
        self.generation = generation
        self.result = None
        self._wake.set()

    def close(self, timeout: float) -> None:
        self._closed = True
        self._wake.set()
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            try:
                outcome: DeviceReading | BaseException = self._source.read(self.info)
            except Exception as exc:
                outcome = exc
            with self._finished:
                self.result = outcome
                self.busy = False
                self._finished.notify_all()


def _failure_reason(exc: BaseException) -> str:
    reason = getattr(exc, "reason", None)
    return reason if isinstance(reason, str) and reason else "exception"


@dataclass(frozen=True)
class _Failure:
    """A GPU (``field`` :data:`WHOLE_DEVICE`), one of its fields, or the drain of Xid events
    (``field`` :data:`XID_EVENTS`) that failed."""

    reason: str
    since: float  # unix time of the first collection that saw it fail


class Collector:
    """Collects from ``source`` every ``interval`` seconds; hands each Snapshot to ``publish``.

    ``clock`` gives the unix times that are reported (snapshot time, Xid times, last success);
    the deadline is enforced in real time because the reads run on real threads.
    """

    def __init__(
        self,
        source: GPUSource,
        publish: Callable[[Snapshot], None],
        interval: float = 1.0,
        deadline: float = 0.8,
        xid_hold: float = 300.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 0 < deadline <= interval:
            raise ValueError("deadline must be > 0 and <= interval")
        self._source = source
        self._publish = publish
        self._interval = interval
        self._deadline = deadline
        self._xid_hold = xid_hold
        self._clock = clock
        self._finished = threading.Condition()
        self._readers = [_DeviceReader(source, d, self._finished) for d in source.devices()]
        self._by_identity = {_identity(r.info): r for r in self._readers}
        # An Xid may name a physical GPU that the source lists only as MIG instances: it goes to
        # the GPU's first instance (sources that list the GPU itself already have its identity).
        for reader in self._readers:
            self._by_identity.setdefault((reader.info.uuid, None), reader)
        self._generation = 0
        self._collections = 0
        self._overruns = 0
        self._last_success: float | None = None
        self._errors: dict[tuple[str, str, str], int] = {
            (r.key, WHOLE_DEVICE, reason): 0
            for r in self._readers
            for reason in KNOWN_DEVICE_FAILURES
        }
        self._collection_seconds = Histogram.empty(COLLECTION_SECONDS_BUCKETS)
        # Critical codes start at 0 so that their first event is a visible increase.
        self._xid_counts: dict[str, dict[int, int]] = {
            r.key: dict.fromkeys(CRITICAL_XIDS, 0) for r in self._readers
        }
        self._last_xid: dict[str, tuple[int, float]] = {}
        # (gpu key, field) -> the failure in force, to log its start and end only
        self._failing: dict[tuple[str, str], _Failure] = {}
        self._stop = threading.Event()
        self._loop: threading.Thread | None = None
        self.latest: Snapshot | None = None

    @property
    def devices(self) -> list[DeviceInfo]:
        return [r.info for r in self._readers]

    def in_flight(self) -> list[str]:
        """Keys of devices with a read still running (hung ones, between collections)."""
        with self._finished:
            return [r.key for r in self._readers if r.busy]

    def start(self) -> None:
        """Run the collection loop in a background thread (first collection immediately)."""
        self._loop = threading.Thread(target=self._run, name="collector", daemon=True)
        self._loop.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the loop and the device readers; a reader stuck in a hung call is left behind."""
        self._stop.set()
        if self._loop is not None:
            self._loop.join(timeout)
        for reader in self._readers:
            reader.close(timeout=0.5)

    def _run(self) -> None:
        next_tick = time.monotonic()
        while not self._stop.is_set():
            try:
                self.collect_once()
            except Exception:  # a bug here must not end collection for good
                log.exception("collection failed")
            next_tick += self._interval
            now = time.monotonic()
            if next_tick < now:  # slower than the interval: skip missed ticks, never queue them
                next_tick = now
            self._stop.wait(next_tick - now)

    def collect_once(self) -> Snapshot:
        """Read every device once (bounded by the deadline) and publish the Snapshot."""
        started = time.monotonic()
        self._generation += 1
        generation = self._generation
        outcomes: dict[str, DeviceReading | BaseException | None] = {}
        with self._finished:
            asked = []
            for reader in self._readers:
                if reader.busy:  # still stuck in an earlier read: do not pile another on top
                    outcomes[reader.key] = None
                else:
                    reader.request(generation)
                    asked.append(reader)
            end = started + self._deadline
            while any(r.busy for r in asked):
                remaining = end - time.monotonic()
                if remaining <= 0:
                    break
                self._finished.wait(remaining)
            overran = False
            for reader in asked:
                if reader.busy:
                    outcomes[reader.key] = None
                    overran = True
                else:
                    outcomes[reader.key] = reader.result
        now = self._clock()
        self._drain_xids(now)
        devices = tuple(self._device_snapshot(r, outcomes[r.key], now) for r in self._readers)
        self._collections += 1
        if overran:
            self._overruns += 1
        if any(d.up for d in devices) or not devices:
            self._last_success = now
        duration = time.monotonic() - started
        self._collection_seconds = self._collection_seconds.observe(duration)
        snapshot = Snapshot(
            taken_at=now,
            duration_seconds=duration,
            collection_seconds=self._collection_seconds,
            devices=devices,
            collections_total=self._collections,
            overruns_total=self._overruns,
            last_success=self._last_success,
            errors_total=MappingProxyType(dict(self._errors)),
            hung_devices=tuple(k for k, outcome in outcomes.items() if outcome is None),
        )
        self.latest = snapshot
        self._publish(snapshot)
        return snapshot

    def _device_snapshot(
        self, reader: _DeviceReader, outcome: DeviceReading | BaseException | None, now: float
    ) -> DeviceSnapshot:
        values: dict[str, float] = {}
        failed: dict[str, tuple[str, str]] = {}  # field -> (reason, error)
        if outcome is None:
            failed[WHOLE_DEVICE] = (TIMEOUT, self._timeout_error(reader))
        elif isinstance(outcome, BaseException):
            failed[WHOLE_DEVICE] = (_failure_reason(outcome), repr(outcome))
        else:
            values = dict(outcome.values)
            failed = {name: (reason, reason) for name, reason in outcome.errors.items()}
        for field_name, (reason, _) in failed.items():
            self._count_error(reader.key, field_name, reason)
        self._log_changes(reader, failed, now)
        up = bool(values)
        last = self._last_xid.get(reader.key)
        if up:
            # DCGM_FI_DEV_XID_ERRORS shows the last Xid for ``xid_hold`` seconds, then 0: an
            # alert on it resolves, and autoglm_gpu_xid_errors_total keeps the history.
            held = last is not None and now - last[1] <= self._xid_hold
            values[XID_FIELD] = float(last[0]) if held and last else 0.0
        return DeviceSnapshot(
            info=reader.info,
            key=reader.key,
            up=up,
            values=MappingProxyType(values),
            xid_counts=MappingProxyType(dict(self._xid_counts[reader.key])),
            last_xid=last,
        )

    def _timeout_error(self, reader: _DeviceReader) -> str:
        if reader.generation != self._generation:
            return "an earlier read is still hung; not asked again until it returns"
        return f"no answer within the collection deadline of {self._deadline:g} s"

    def _log_changes(
        self, reader: _DeviceReader, failed: Mapping[str, tuple[str, str]], now: float
    ) -> None:
        """Log the failures of ``reader``'s device that started (or changed reason) and those
        that ended with this collection. While the whole device fails, its fields cannot be
        read at all, so their earlier state is kept rather than taken as recovered."""
        gpu = reader.key
        device_down = WHOLE_DEVICE in failed
        for key in [k for k in self._failing if k[0] == gpu]:
            field_name = key[1]
            if field_name in failed or (device_down and field_name != WHOLE_DEVICE):
                continue
            self._failure_ended(
                key,
                now,
                "device read recovered" if field_name == WHOLE_DEVICE else "field read recovered",
                {"gpu": gpu, "uuid": reader.info.uuid, "field": field_name},
            )
        for field_name, (reason, error) in failed.items():
            self._failure_seen(
                (gpu, field_name),
                reason,
                error,
                now,
                "device read failed" if field_name == WHOLE_DEVICE else "field read failed",
                {"gpu": gpu, "uuid": reader.info.uuid, "field": field_name},
            )

    def _failure_seen(
        self,
        key: tuple[str, str],
        reason: str,
        error: str,
        now: float,
        message: str,
        context: Mapping[str, object],
    ) -> None:
        """Record that ``key`` (gpu, field) failed in this collection; warn only when its
        failure starts or its reason changes, so a lasting failure is one line, not one per
        collection."""
        known = self._failing.get(key)
        if known is not None and known.reason == reason:
            return
        self._failing[key] = _Failure(reason, known.since if known is not None else now)
        extra = {**context, "reason": reason, "error": error}
        if known is not None:
            extra["previous_reason"] = known.reason
        log.warning(message, extra=extra)

    def _failure_ended(
        self, key: tuple[str, str], now: float, message: str, context: Mapping[str, object]
    ) -> None:
        """Forget ``key``'s failure, if it had one, with one info line saying how long it
        lasted."""
        ended = self._failing.pop(key, None)
        if ended is None:
            return
        log.info(
            message,
            extra={
                **context,
                "reason": ended.reason,
                "failed_for_s": round(max(0.0, now - ended.since), 3),
            },
        )

    def _count_error(self, gpu: str, field_name: str, reason: str) -> None:
        key = (gpu, field_name, reason)
        self._errors[key] = self._errors.get(key, 0) + 1

    def _drain_xids(self, now: float) -> None:
        key = ("", XID_EVENTS)
        context = {"field": XID_EVENTS}
        try:
            events = self._source.drain_xid_events()
        except Exception as exc:
            reason = _failure_reason(exc)
            self._count_error(*key, reason)
            self._failure_seen(key, reason, repr(exc), now, "draining Xid events failed", context)
            return
        self._failure_ended(key, now, "draining Xid events recovered", context)
        for info, event in events:
            reader = self._by_identity.get(_identity(info))
            if reader is None:
                log.warning("Xid event for an unknown device", extra={"uuid": info.uuid})
                continue
            counts = self._xid_counts[reader.key]
            counts[event.xid] = counts.get(event.xid, 0) + 1
            previous = self._last_xid.get(reader.key)
            if previous is None or event.timestamp >= previous[1]:
                self._last_xid[reader.key] = (event.xid, event.timestamp)
            log.warning(
                "Xid error",
                extra={"gpu": reader.key, "uuid": info.uuid, "xid": event.xid},
            )


def _identity(info: DeviceInfo) -> tuple[str, str | None]:
    return (info.uuid, info.mig_uuid)
