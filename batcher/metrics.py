"""The runtime's own metrics, ``autoglm_batcher_*`` in base units (seconds, bytes, items).

Latencies are histograms (not summaries) so they aggregate across replicas and feed SLO burn-rate
rules; the SLO itself is a bucket boundary and a gauge, so ``le`` the SLO is exact in PromQL.
Memory statistics are read from the allocator at scrape time and exist only where they apply
(CUDA); on CPU those series are absent, never zero.
"""

from __future__ import annotations

import itertools
import math
import threading
from bisect import bisect_left
from collections.abc import Callable, Collection, Iterable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

PREFIX = "autoglm_batcher"
OUTCOMES = (
    "ok",
    "model_error",
    "out_of_memory",
    "timeout",
    "rejected",
    "invalid",
    "cancelled",
    "shutdown",
)
# why a request was refused at admission (all counted as outcome "rejected" as well)
REJECTION_REASONS = ("queue_full", "past_deadline", "shutting_down")
REQUEST_CLASSES = ("online", "best_effort")
# why a best-effort request was refused at once (each is also a class_requests_total "rejected")
BEST_EFFORT_REFUSAL_REASONS = ("throttled", "queue_full", "shutting_down")
DISPATCH_GAP_CAUSES = ("turnaround", "filling")
# a GPU batch can take a millisecond or two: the idle between two is measured finer
DISPATCH_GAP_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1)
_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

# allocator statistic -> (metric suffix, help, is a counter)
_MEMORY_SERIES = {
    "allocated_bytes": ("memory_allocated_bytes", "Bytes held by live tensors.", False),
    "reserved_bytes": ("memory_reserved_bytes", "Bytes the caching allocator holds.", False),
    "reserved_unallocated_bytes": (
        "memory_reserved_unallocated_bytes",
        "Reserved bytes not used by any tensor (cache and fragmentation).",
        False,
    ),
    "inactive_split_bytes": (
        "memory_inactive_split_bytes",
        "Bytes in split blocks that are free but cannot be released (fragmentation).",
        False,
    ),
    "alloc_retries": (
        "memory_alloc_retries",
        "Allocations that succeeded only after flushing the cache.",
        True,
    ),
    "ooms": ("memory_allocator_ooms", "Out-of-memory errors the allocator raised.", True),
}


def _buckets_with(boundary: float) -> tuple[float, ...]:
    return tuple(sorted({*_LATENCY_BUCKETS, round(boundary, 6)}))


class _MemoryCollector(Collector):
    def __init__(self, model: str, read: Callable[[], dict[str, float]]) -> None:
        self._model = model
        self._read = read

    def collect(self) -> Iterable:
        stats = self._read()
        for key, (suffix, help_text, counter) in _MEMORY_SERIES.items():
            if key not in stats:
                continue
            family_cls = CounterMetricFamily if counter else GaugeMetricFamily
            family = family_cls(f"{PREFIX}_{suffix}", help_text, labels=["model"])
            family.add_metric([self._model], stats[key])
            yield family


def allocator_collector(model: str, read: Callable[[], dict[str, float]]) -> Collector:
    """The allocator statistics ``read`` returns, as series labelled ``model``: for a process
    serving several models, whose device statistics belong to none of them (``model=""``)."""
    return _MemoryCollector(model, read)


def _counter_by(
    registry: CollectorRegistry,
    model: str,
    name: str,
    documentation: str,
    label: str,
    values: Iterable[str],
) -> Counter:
    """A counter by ``label`` with every known value exported from the start: a series that
    appears only at its first increment makes ``rate()`` miss that increment."""
    counter = Counter(f"{PREFIX}_{name}", documentation, ["model", label], registry=registry)
    for value in values:
        counter.labels(model, value)
    return counter


class BatchHistogram(Collector):
    """A latency histogram of one model that a batch's requests are observed into at once.

    prometheus_client's histogram takes two locks and scans its buckets at each observation, a
    measurable part of a request's CPU on the loop that answers every request
    (docs/batcher-serving.md, "Metrics by the batch"). Here a batch's latencies are binned under
    one lock, and the series are built at scrape time, the same as a ``Histogram`` labelled
    ``model`` exposes them (less the ``_created`` sample).
    """

    def __init__(
        self,
        name: str,
        documentation: str,
        model: str,
        buckets: Iterable[float],
        registry: CollectorRegistry,
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._model = model
        self._bounds = tuple(sorted(buckets))  # the last bucket, +Inf, is implied
        self._counts = [0] * (len(self._bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()  # a scrape may come from another thread
        registry.register(self)

    def observe_many(self, values: Collection[float]) -> None:
        """Count each of ``values`` in the first bucket whose bound it does not exceed."""
        bounds, counts = self._bounds, self._counts
        with self._lock:
            for value in values:
                counts[bisect_left(bounds, value)] += 1
            self._sum += math.fsum(values)

    def describe(self) -> Iterable[HistogramMetricFamily]:
        yield HistogramMetricFamily(self._name, self._documentation, labels=["model"])

    def collect(self) -> Iterable[HistogramMetricFamily]:
        with self._lock:
            counts, total = list(self._counts), self._sum
        family = HistogramMetricFamily(self._name, self._documentation, labels=["model"])
        edges = [floatToGoString(bound) for bound in (*self._bounds, math.inf)]
        cumulative = [float(count) for count in itertools.accumulate(counts)]
        family.add_metric([self._model], list(zip(edges, cumulative, strict=True)), total)
        yield family


class _Children:
    """A labelled metric's children for one model, looked up once per label values: ``labels()``
    validates its arguments and takes a lock at every call, which on the request path costs more
    than the increment it leads to."""

    def __init__(self, metric: Counter | Histogram, model: str) -> None:
        self._metric = metric
        self._model = model
        self._found: dict[tuple[str, ...], Any] = {}

    def __call__(self, *values: str) -> Any:
        child = self._found.get(values)
        if child is None:
            child = self._found[values] = self._metric.labels(self._model, *values)
        return child


class BatcherMetrics:
    """Every series the runtime exports, registered on one registry."""

    def __init__(
        self,
        registry: CollectorRegistry,
        model: str,
        slo_seconds: float,
        max_batch_size: int,
    ) -> None:
        self.registry = registry
        self.model = model
        label = ["model"]
        self.requests = _counter_by(
            registry,
            model,
            "requests",
            "Requests answered, by outcome (ok, model_error, out_of_memory, timeout, rejected, "
            "invalid, cancelled, shutdown).",
            "outcome",
            OUTCOMES,
        )
        self.rejections = _counter_by(
            registry,
            model,
            "rejections",
            "Requests refused at admission, by reason: queue_full (the queue bound), "
            "past_deadline (predicted to finish past the latency SLO or not to start within "
            "its timeout), shutting_down (draining). Each is also a requests_total "
            'outcome="rejected".',
            "reason",
            REJECTION_REASONS,
        )
        self.slo_misses = Counter(
            f"{PREFIX}_slo_misses",
            "Requests answered after the latency SLO or not answered successfully.",
            label,
            registry=registry,
        ).labels(model)
        self.queue_items = Gauge(
            f"{PREFIX}_queue_items", "Items waiting for a batch.", label, registry=registry
        ).labels(model)
        self.queue_requests = Gauge(
            f"{PREFIX}_queue_requests", "Requests waiting for a batch.", label, registry=registry
        ).labels(model)
        self.in_flight_requests = Gauge(
            f"{PREFIX}_in_flight_requests",
            "Requests in the batch running now.",
            label,
            registry=registry,
        ).labels(model)
        size_buckets = sorted({1 << k for k in range(max_batch_size.bit_length() + 1)})
        self.batch_size = Histogram(
            f"{PREFIX}_batch_size_items",
            "Items per executed batch (before padding).",
            label,
            buckets=[float(b) for b in size_buckets],
            registry=registry,
        ).labels(model)
        latency_buckets = _buckets_with(slo_seconds)
        self.queue_latency = BatchHistogram(
            f"{PREFIX}_queue_latency_seconds",
            "Time from arrival to the start of the request's batch.",
            model,
            latency_buckets,
            registry,
        )
        self.compute_latency = Histogram(
            f"{PREFIX}_compute_latency_seconds",
            "Device time per executed batch.",
            label,
            buckets=latency_buckets,
            registry=registry,
        ).labels(model)
        self.dispatch_gap = Histogram(
            f"{PREFIX}_dispatch_gap_seconds",
            "Device idle before a batch whose requests were already waiting when the device "
            "freed, by cause: turnaround (the serving path handing the last outcome back, "
            "deciding and sending) or filling (the dispatch policy waited for a fuller batch).",
            ["model", "cause"],
            buckets=DISPATCH_GAP_BUCKETS,
            registry=registry,
        )
        for cause in DISPATCH_GAP_CAUSES:
            self.dispatch_gap.labels(model, cause)
        self.request_latency = BatchHistogram(
            f"{PREFIX}_request_latency_seconds",
            "Time from arrival to the answer, for requests that got a result.",
            model,
            latency_buckets,
            registry,
        )
        self.cap = Gauge(
            f"{PREFIX}_batch_cap_items",
            "Current adaptive cap on batch size.",
            label,
            registry=registry,
        ).labels(model)
        self.memory_cap = Gauge(
            f"{PREFIX}_memory_cap_items",
            "Largest batch the device's free memory (less a margin) holds, by the footprint "
            "learned from the batches that ran; the maximum batch size while unlearned.",
            label,
            registry=registry,
        ).labels(model)
        self.memory_cap_reason = Gauge(
            f"{PREFIX}_memory_cap_reason",
            "1 for why the memory cap is what it is: unlearned (no device memory measured), "
            "fits (the maximum batch fits), memory (free memory bounds the batch).",
            [*label, "reason"],
            registry=registry,
        )
        self.max_batch = Gauge(
            f"{PREFIX}_max_batch_size_items",
            "Configured largest batch.",
            label,
            registry=registry,
        ).labels(model)
        self.max_batch.set(max_batch_size)
        self.slo = Gauge(
            f"{PREFIX}_slo_seconds",
            "Latency SLO the batches are sized to.",
            label,
            registry=registry,
        ).labels(model)
        self.slo.set(slo_seconds)
        self.busy_seconds = Counter(
            f"{PREFIX}_device_busy_seconds",
            "Time the device spent executing batches; rate() is the busy fraction.",
            label,
            registry=registry,
        ).labels(model)
        self.busy_ratio = Gauge(
            f"{PREFIX}_device_busy_ratio",
            "Busy fraction of the device over the last minute.",
            label,
            registry=registry,
        ).labels(model)
        self.cost_fixed = Gauge(
            f"{PREFIX}_cost_fixed_seconds",
            "Fitted fixed cost c of t(b) = c + a*b.",
            label,
            registry=registry,
        ).labels(model)
        self.cost_per_item = Gauge(
            f"{PREFIX}_cost_per_item_seconds",
            "Fitted per-item cost a of t(b) = c + a*b.",
            label,
            registry=registry,
        ).labels(model)
        self.service_scv = Gauge(
            f"{PREFIX}_service_time_scv",
            "Squared coefficient of variation of one online request's service time (its size "
            "under the fitted cost and the jitter of batch times); 0 until measured. SLO "
            "sizing reads it beside the two cost terms.",
            label,
            registry=registry,
        ).labels(model)
        self.ooms = Counter(
            f"{PREFIX}_oom_events",
            "Batches that ran out of device memory (each is split and retried).",
            label,
            registry=registry,
        ).labels(model)
        self.splits = Counter(
            f"{PREFIX}_batch_splits",
            "Batches split in two after running out of memory.",
            label,
            registry=registry,
        ).labels(model)
        self.releases = Counter(
            f"{PREFIX}_memory_releases",
            "Times cached device memory was released after an idle period.",
            label,
            registry=registry,
        ).labels(model)
        self.class_busy_seconds = _counter_by(
            registry,
            model,
            "class_busy_seconds",
            "Time the device spent executing batches, by request class (online, best_effort); "
            "their sum is device_busy_seconds_total.",
            "class",
            REQUEST_CLASSES,
        )
        self.class_requests = Counter(
            f"{PREFIX}_class_requests",
            "Requests answered, by request class and outcome. The online class is what "
            "requests_total counts; best-effort requests appear only here.",
            ["model", "class", "outcome"],
            registry=registry,
        )
        for request_class in REQUEST_CLASSES:
            for outcome in OUTCOMES:
                self.class_requests.labels(model, request_class, outcome)
        self.class_batch_size = Histogram(
            f"{PREFIX}_class_batch_size",
            "Items per executed batch (before padding), by request class.",
            ["model", "class"],
            buckets=[float(b) for b in size_buckets],
            registry=registry,
        )
        for request_class in REQUEST_CLASSES:
            self.class_batch_size.labels(model, request_class)
        self.best_effort_share = Gauge(
            f"{PREFIX}_best_effort_share",
            "Fraction of device time best-effort batches may use now (the slack controller's "
            "share, 0..1).",
            label,
            registry=registry,
        ).labels(model)
        self.online_latency_slack = Gauge(
            f"{PREFIX}_online_latency_slack_seconds",
            "Latency SLO minus the p99 of recent online requests (the SLO itself when none).",
            label,
            registry=registry,
        ).labels(model)
        self.online_latency_slack.set(slo_seconds)
        self.best_effort_quantum = Gauge(
            f"{PREFIX}_best_effort_quantum_seconds",
            "Longest predicted run of one best-effort batch: about the most an arriving online "
            "request waits for best-effort work.",
            label,
            registry=registry,
        ).labels(model)
        self.best_effort_refusals = _counter_by(
            registry,
            model,
            "best_effort_refusals",
            "Best-effort requests refused at once, by reason: throttled (the slack controller "
            "holds the share at 0), queue_full (the best-effort queue bound), shutting_down.",
            "reason",
            BEST_EFFORT_REFUSAL_REASONS,
        )
        self.best_effort_queue_items = Gauge(
            f"{PREFIX}_best_effort_queue_items",
            "Best-effort items waiting for idle capacity (not in queue_items, which is online).",
            label,
            registry=registry,
        ).labels(model)
        self.best_effort_throttled = Gauge(
            f"{PREFIX}_best_effort_throttled",
            "1 while the slack controller holds best-effort work at a share of 0.",
            label,
            registry=registry,
        ).labels(model)
        self.ready = Gauge(
            f"{PREFIX}_ready",
            "1 while accepting requests, 0 while starting or draining.",
            label,
            registry=registry,
        ).labels(model)
        self._requests = _Children(self.requests, model)
        self._rejections = _Children(self.rejections, model)
        self._class_requests = _Children(self.class_requests, model)
        self._class_busy_seconds = _Children(self.class_busy_seconds, model)
        self._class_batch_size = _Children(self.class_batch_size, model)
        self._dispatch_gap = _Children(self.dispatch_gap, model)
        self._best_effort_refusals = _Children(self.best_effort_refusals, model)

    def memory_capped(self, cap: int, reason: str) -> None:
        """Export the memory cap in force and its reason (one of MEMORY_CAP_REASONS)."""
        self.memory_cap.set(cap)
        for known in ("unlearned", "fits", "memory"):
            self.memory_cap_reason.labels(self.model, known).set(1 if known == reason else 0)

    def follow_engine(
        self,
        *,
        queue_items: Callable[[], float],
        queue_requests: Callable[[], float],
        best_effort_queue_items: Callable[[], float],
        in_flight_requests: Callable[[], float],
        cap: Callable[[], float],
    ) -> None:
        """Read the engine's live gauges at each scrape instead of setting them as they move:
        they change at every request and every batch, and a scrape is rare next to those."""
        self.queue_items.set_function(queue_items)
        self.queue_requests.set_function(queue_requests)
        self.best_effort_queue_items.set_function(best_effort_queue_items)
        self.in_flight_requests.set_function(in_flight_requests)
        self.cap.set_function(cap)

    def watch_memory(self, read: Callable[[], dict[str, float]]) -> None:
        """Export allocator statistics from ``read`` at each scrape."""
        self.registry.register(_MemoryCollector(self.model, read))

    def rejected(self, reason: str, slo_seconds: float) -> None:
        """Count one online request refused at admission for ``reason`` (of REJECTION_REASONS)."""
        self._rejections(reason).inc()
        self.answered("rejected", slo_seconds)

    def refused_best_effort(self, reason: str) -> None:
        """Count one best-effort request refused at once (one of BEST_EFFORT_REFUSAL_REASONS)."""
        self._best_effort_refusals(reason).inc()
        self.answered_best_effort("rejected")

    def answered_best_effort(self, outcome: str) -> None:
        """Count one answered best-effort request: never in the online series or SLO misses."""
        self._class_requests("best_effort", outcome).inc()

    def batch_ran(self, request_class: str, items: int) -> None:
        """Count one executed batch of ``items`` items in its class's size histogram."""
        self._class_batch_size(request_class).observe(items)

    def device_idled(self, cause: str, seconds: float) -> None:
        """Count the device's idle before a batch whose requests waited (one of
        DISPATCH_GAP_CAUSES)."""
        self._dispatch_gap(cause).observe(seconds)

    def busy(self, request_class: str, seconds: float) -> None:
        """Count ``seconds`` of device time spent on a batch of ``request_class``."""
        self.busy_seconds.inc(seconds)
        self._class_busy_seconds(request_class).inc(seconds)

    def answered_with_results(self, latencies: Collection[float], slo_seconds: float) -> None:
        """Count online requests answered with a result (outcome ``ok``), a batch at a time;
        ``latencies`` from each one's arrival to its answer."""
        if not latencies:
            return
        self._requests("ok").inc(len(latencies))
        self._class_requests("online", "ok").inc(len(latencies))
        self.request_latency.observe_many(latencies)
        late = sum(1 for seconds in latencies if seconds > slo_seconds)
        if late:
            self.slo_misses.inc(late)

    def answered(self, outcome: str, slo_seconds: float) -> None:
        """Count one online request answered without a result (refused, failed, cancelled);
        those with a result are counted a batch at a time (:meth:`answered_with_results`)."""
        self._requests(outcome).inc()
        self._class_requests("online", outcome).inc()
        if outcome in ("invalid", "cancelled"):
            return  # the client's doing, not the service's
        self.slo_misses.inc()
