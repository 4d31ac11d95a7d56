"""The embedded metrics window: parsing, rates, quantiles and the autoscaler's reads, no sockets."""

from __future__ import annotations

import math

import pytest
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from autoscaler.core import MetricInput
from autoscaler.core.replica_calculator import PodSample
from autoscaler.spec import MetricSpec
from stack.window import (
    MetricsWindow,
    Scrape,
    WindowMetricsSource,
    bucket_quantile,
    parse_exposition,
)

BUSY = "autoglm_batcher_device_busy_seconds_total"


def exposition(busy: float, latencies: list[float] = ()) -> str:
    """A real exposition from prometheus_client, as a batcher would serve it."""
    registry = CollectorRegistry()
    Counter("autoglm_batcher_device_busy_seconds", "busy", ["model"], registry=registry).labels(
        "demo"
    ).inc(busy)
    hist = Histogram(
        "autoglm_batcher_request_latency_seconds",
        "latency",
        buckets=(0.05, 0.1, 0.25, 1.0),
        registry=registry,
    )
    for value in latencies:
        hist.observe(value)
    return generate_latest(registry).decode()


def scrape(t: float, text: str) -> Scrape:
    return Scrape(t, True, parse_exposition(text))


def test_parse_keeps_sample_names_and_labels() -> None:
    samples = parse_exposition(exposition(2.5, [0.02, 0.3]))
    assert samples[BUSY] == {frozenset({("model", "demo")}): 2.5}
    buckets = samples["autoglm_batcher_request_latency_seconds_bucket"]
    assert buckets[frozenset({("le", "0.05")})] == 1.0
    assert buckets[frozenset({("le", "+Inf")})] == 2.0


def test_parse_rejects_garbage() -> None:
    with pytest.raises(ValueError):
        parse_exposition("this is { not an exposition\n")


def test_rate_over_window_and_across_a_counter_reset() -> None:
    window = MetricsWindow()
    for t, busy in [(0, 0.0), (1, 0.5), (2, 1.0), (3, 1.5), (4, 0.25), (5, 0.75)]:
        window.add("w", scrape(t, exposition(busy)))
    # 2..5: +0.5, reset to 0.25 (counted as 0.25), +0.5 -> 1.25 over 3 s
    assert window.rate("w", BUSY, 3.0, now=5.0) == pytest.approx(1.25 / 3)
    assert window.rate("w", BUSY, 1.0, now=3.0) == pytest.approx(0.5)
    assert window.rate("w", BUSY, 0.5, now=5.0) is None  # one point is no rate
    assert window.rate("other", BUSY, 3.0, now=5.0) is None


def test_failed_scrapes_are_not_data_and_mark_the_endpoint_down() -> None:
    window = MetricsWindow()
    window.add("w", scrape(0, exposition(1.0)))
    window.add("w", Scrape(1, False, {}))
    assert not window.up("w")
    assert window.latest("w", BUSY) == 1.0  # the last good value
    assert window.latest("w", BUSY, {"model": "other"}) is None


def test_old_scrapes_leave_the_window_and_forgotten_endpoints_vanish() -> None:
    window = MetricsWindow(keep_seconds=10)
    for t in range(30):
        window.add("w", scrape(t, exposition(float(t))))
    assert window.rate("w", BUSY, 100.0, now=29.0) == pytest.approx(1.0)
    assert window.latest("w", BUSY) == 29.0
    window.forget("w")
    assert window.endpoints() == []


def test_histogram_quantile_over_several_endpoints() -> None:
    window = MetricsWindow()
    window.add("a", scrape(0, exposition(0, [])))
    window.add("b", scrape(0, exposition(0, [0.01] * 10)))
    window.add("a", scrape(5, exposition(0, [0.01] * 90)))
    window.add("b", scrape(5, exposition(0, [0.01] * 10 + [0.5] * 10)))
    # in the window: 90 fast (a) + 10 slow (b); the 10 of b before it do not count
    p50 = window.histogram_quantile(
        ["a", "b"], "autoglm_batcher_request_latency_seconds_bucket", 0.5, 10, 5
    )
    p99 = window.histogram_quantile(
        ["a", "b"], "autoglm_batcher_request_latency_seconds_bucket", 0.99, 10, 5
    )
    assert p50 == pytest.approx(0.05 * 50 / 90)
    assert 0.25 < p99 <= 1.0


def test_bucket_quantile_edges() -> None:
    assert bucket_quantile(0.5, {}) is None
    assert bucket_quantile(0.5, {1.0: 0.0, math.inf: 0.0}) is None
    assert bucket_quantile(0.99, {1.0: 1.0, math.inf: 10.0}) == 1.0  # in +Inf: largest bound
    assert bucket_quantile(0.5, {1.0: 4.0, 2.0: 8.0, math.inf: 8.0}) == pytest.approx(1.0)


METRIC = MetricSpec("gpu_util", "avg by (pod) (DCGM_FI_DEV_GPU_UTIL)", "Pods", "Utilization", 70)


def test_source_fills_each_pod_and_leaves_unknown_pods_without_a_sample() -> None:
    window = MetricsWindow()
    values = {"w1": 80.0, "w2": None}
    source = WindowMetricsSource(
        window, {"gpu_util": lambda w, pod, now: values[pod]}, 5.0, clock=lambda: 100.0
    )
    errors: list[str] = []
    pods = [PodSample("w1", None), PodSample("w2", None)]
    reading = source.read(METRIC, pods, errors.append)
    assert isinstance(reading, MetricInput) and reading.error is None
    assert [(p.name, p.value) for p in reading.pods] == [("w1", 80.0), ("w2", None)]
    assert all(p.sampled_at == 100.0 and p.window_seconds == 5.0 for p in reading.pods)
    assert errors == []


def test_source_errors_are_named_and_counted() -> None:
    window = MetricsWindow()
    source = WindowMetricsSource(window, {"gpu_util": lambda w, pod, now: None}, 5.0)
    errors: list[str] = []
    empty = source.read(METRIC, [PodSample("w1", None)], errors.append)
    assert empty.error and "no worker" in empty.error
    other = MetricSpec("queue", "q", "Pods", "AverageValue", 4)
    unknown = source.read(other, [PodSample("w1", None)], errors.append)
    assert unknown.error and "gpu_util" in unknown.error
    no_pods = source.read(METRIC, None, errors.append)
    assert no_pods.error
    assert errors == ["metric_empty", "metric_unknown", "pods_unavailable"]
