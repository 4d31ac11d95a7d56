"""The embedded metrics default: scrape local /metrics endpoints into a short in-process window.

In a cluster Prometheus is the bus between components. On one machine ``autoglm up`` needs no
Prometheus server: a thread scrapes every local endpoint once a second, parses the exposition with
``prometheus_client.parser`` and keeps the last few minutes of samples per endpoint. The
autoscaler reads it through :class:`WindowMetricsSource` (its ``MetricsSource`` interface) and
the predictor is fed from it, so both see what Prometheus would have seen, rates included.

The window itself (:class:`MetricsWindow`) is pure: scrapes are handed to :meth:`add` with their
time, and every query takes ``now``; only :class:`Scraper` does I/O.
"""

from __future__ import annotations

import bisect
import itertools
import logging
import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import requests
from prometheus_client.parser import text_string_to_metric_families

from autoscaler.controller.metrics_source import ErrorCounter
from autoscaler.core import MetricInput
from autoscaler.core.replica_calculator import PodSample
from autoscaler.spec import MetricSpec

log = logging.getLogger(__name__)

Labels = frozenset[tuple[str, str]]


@dataclass(frozen=True)
class Scrape:
    """One scrape of one endpoint: when, whether it worked, and its samples by name and labels."""

    time: float
    ok: bool
    samples: Mapping[str, Mapping[Labels, float]]


def parse_exposition(text: str) -> dict[str, dict[Labels, float]]:
    """Samples of a Prometheus text exposition, keyed by sample name then label set.

    Sample names are as exposed (``..._total``, ``..._bucket``), so queries name what they see.
    ValueError when the text is not a valid exposition.
    """
    out: dict[str, dict[Labels, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, {})[frozenset(sample.labels.items())] = sample.value
    return out


def _matches(labels: Labels, wanted: Mapping[str, str]) -> bool:
    have = dict(labels)
    return all(have.get(k) == v for k, v in wanted.items())


class MetricsWindow:
    """The last ``keep_seconds`` of scrapes per endpoint, with the queries the stack needs."""

    def __init__(self, keep_seconds: float = 300.0) -> None:
        self.keep_seconds = keep_seconds
        self._scrapes: dict[str, deque[Scrape]] = {}
        self._lock = threading.Lock()

    def add(self, endpoint: str, scrape: Scrape) -> None:
        with self._lock:
            history = self._scrapes.setdefault(endpoint, deque())
            history.append(scrape)
            while history and history[0].time < scrape.time - self.keep_seconds:
                history.popleft()

    def forget(self, endpoint: str) -> None:
        """Drop an endpoint that no longer exists (a stopped worker)."""
        with self._lock:
            self._scrapes.pop(endpoint, None)

    def endpoints(self) -> list[str]:
        with self._lock:
            return list(self._scrapes)

    def _history(self, endpoint: str) -> list[Scrape]:
        with self._lock:
            return list(self._scrapes.get(endpoint, ()))

    def up(self, endpoint: str) -> bool:
        """Whether the endpoint's last scrape worked (Prometheus' ``up``)."""
        history = self._history(endpoint)
        return bool(history) and history[-1].ok

    def latest(
        self, endpoint: str, name: str, labels: Mapping[str, str] | None = None
    ) -> float | None:
        """Sum of the matching samples in the endpoint's last successful scrape, or None."""
        for scrape in reversed(self._history(endpoint)):
            if scrape.ok:
                return _sum(scrape, name, labels or {})
        return None

    def rate(
        self,
        endpoint: str,
        name: str,
        seconds: float,
        now: float,
        labels: Mapping[str, str] | None = None,
    ) -> float | None:
        """Per-second increase of a counter over about the last ``seconds`` (as PromQL's
        ``rate``, counter resets included); None with fewer than two usable scrapes."""
        points = [
            (s.time, v)
            for s in self._history(endpoint)
            if s.ok and now - seconds - 1e-9 <= s.time <= now
            for v in [_sum(s, name, labels or {})]
            if v is not None
        ]
        if len(points) < 2 or points[-1][0] <= points[0][0]:
            return None
        increase = 0.0
        for (_, before), (_, after) in itertools.pairwise(points):
            increase += after - before if after >= before else after
        return increase / (points[-1][0] - points[0][0])

    def histogram_quantile(
        self,
        endpoints: Sequence[str],
        name: str,
        quantile: float,
        seconds: float,
        now: float,
    ) -> float | None:
        """``histogram_quantile(q, sum by (le) (rate(name_bucket[seconds])))`` over endpoints;
        None when nothing was observed in the window."""
        increases: dict[float, float] = {}
        for endpoint in endpoints:
            history = [
                s for s in self._history(endpoint) if s.ok and now - seconds <= s.time <= now
            ]
            if len(history) < 2:
                continue
            first, last = history[0].samples.get(name, {}), history[-1].samples.get(name, {})
            for labels, value in last.items():
                le = float(dict(labels)["le"])
                before = first.get(labels, 0.0)
                increases[le] = increases.get(le, 0.0) + max(0.0, value - before)
        return bucket_quantile(quantile, increases)


def bucket_quantile(quantile: float, buckets: Mapping[float, float]) -> float | None:
    """The quantile of cumulative histogram buckets (upper bound -> count), interpolated within
    the bucket as Prometheus does; the largest finite bound when it falls in ``+Inf``."""
    if not buckets:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]]
    if total <= 0:
        return None
    rank = quantile * total
    counts = [buckets[b] for b in bounds]
    i = bisect.bisect_left(counts, rank)
    if math.isinf(bounds[i]):
        finite = [b for b in bounds if not math.isinf(b)]
        return finite[-1] if finite else None
    lower = bounds[i - 1] if i > 0 else 0.0
    below = counts[i - 1] if i > 0 else 0.0
    inside = counts[i] - below
    if inside <= 0:
        return bounds[i]
    return lower + (bounds[i] - lower) * (rank - below) / inside


def _sum(scrape: Scrape, name: str, labels: Mapping[str, str]) -> float | None:
    series = scrape.samples.get(name)
    if not series:
        return None
    values = [v for k, v in series.items() if _matches(k, labels)]
    return math.fsum(values) if values else None


class Scraper:
    """Scrapes the current endpoints into a window every ``interval`` seconds, on one thread."""

    def __init__(
        self,
        window: MetricsWindow,
        interval: float = 1.0,
        timeout: float = 0.8,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window, self.interval, self.timeout, self.clock = window, interval, timeout, clock
        self._targets: dict[str, str] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._session = requests.Session()
        self.after_scrape: list[Callable[[float], None]] = []

    def set_targets(self, targets: Mapping[str, str]) -> None:
        """Endpoint name -> /metrics URL; endpoints that left are dropped from the window."""
        with self._lock:
            gone = set(self._targets) - set(targets)
            self._targets = dict(targets)
        for name in gone:
            self.window.forget(name)

    def scrape_once(self) -> None:
        with self._lock:
            targets = dict(self._targets)
        for name, url in targets.items():
            now = self.clock()
            try:
                response = self._session.get(url, timeout=self.timeout)
                response.raise_for_status()
                scrape = Scrape(now, True, parse_exposition(response.text))
            except (requests.RequestException, ValueError) as exc:
                log.debug("scrape failed", extra={"endpoint": name, "error": str(exc)[:200]})
                scrape = Scrape(now, False, {})
            self.window.add(name, scrape)
        now = self.clock()
        for hook in self.after_scrape:
            try:
                hook(now)
            except Exception:  # one consumer's bug must not stop the window
                log.exception("after-scrape hook failed")

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="autoglm-up-scraper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
        self._session.close()

    def _run(self) -> None:
        next_at = time.monotonic()
        while not self._stop.is_set():
            self.scrape_once()
            next_at += self.interval
            self._stop.wait(max(0.0, next_at - time.monotonic()))


# --- what the autoscaler reads -----------------------------------------------------------------

PodValue = Callable[[MetricsWindow, str, float], float | None]


class WindowMetricsSource:
    """The autoscaler's ``MetricsSource`` over the window: per-pod values computed in Python.

    ``readers`` maps a metric's name to how its per-pod value is read (the window, the pod name,
    now); the metric's PromQL ``query`` is what the same reading is in Prometheus, for the record.
    A pod without a value has no sample, and the HPA's missing-pod rules apply to it.
    """

    def __init__(
        self,
        window: MetricsWindow,
        readers: Mapping[str, PodValue],
        window_seconds: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window, self.readers = window, dict(readers)
        self.window_seconds, self.clock = window_seconds, clock

    def read(
        self, metric: MetricSpec, pods: Sequence[PodSample] | None, count_error: ErrorCounter
    ) -> MetricInput:
        reader = self.readers.get(metric.name)
        if reader is None:
            count_error("metric_unknown")
            return MetricInput(
                spec=metric,
                pods=tuple(pods) if pods is not None else None,
                error=f"the embedded window has no reader for {metric.name!r}; "
                f"known: {', '.join(self.readers)}",
            )
        if pods is None:
            count_error("pods_unavailable")
            return MetricInput(spec=metric, error="the target's pods could not be listed")
        now = self.clock()
        filled = tuple(
            replace(
                p,
                value=reader(self.window, p.name, now),
                sampled_at=now,
                window_seconds=self.window_seconds,
            )
            for p in pods
        )
        if all(p.value is None for p in filled):
            count_error("metric_empty")
            return MetricInput(
                spec=metric, pods=filled, error=f"no worker has a {metric.name} sample yet"
            )
        return MetricInput(spec=metric, pods=filled)
