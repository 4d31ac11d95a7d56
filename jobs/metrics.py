"""The job's Prometheus metrics: its progress, its concurrency and what the endpoint answered.

The label is ``job_name``, not ``job``: Prometheus sets ``job`` on every scraped series from
its scrape configuration, so a ``job`` label exported here would be renamed ``exported_job``.
Lines are counted when they become durable (committed), so the counters never run ahead of
what a resume would find.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
FAILURE_REASONS = ("connection", "timeout", "server_error")
OUTCOMES = ("ok", "invalid")
# why an open line is not in flight: held back by --max-rate before a send, or waiting out a
# Retry-After or a back-off before it is sent again
WAIT_REASONS = ("rate_limit", "retry")


class JobMetrics:
    """Children are resolved once, and every labelled series is exported from the start at 0."""

    def __init__(self, registry: CollectorRegistry, job_name: str) -> None:
        labels = {"job_name": job_name}
        lines = Counter(
            "autoglm_job_lines",
            "Input lines committed by this run, by outcome: ok (answered, in the output file) "
            "or invalid (malformed or refused as bad by the endpoint, in the errors file).",
            ["job_name", "outcome"],
            registry=registry,
        )
        self.lines = {o: lines.labels(job_name=job_name, outcome=o) for o in OUTCOMES}
        self.lines_in_shard = _gauge(
            registry,
            "autoglm_job_lines_in_shard",
            "Request lines of the input this process handles (its shard), done or not.",
        ).labels(**labels)
        self.lines_remaining = _gauge(
            registry,
            "autoglm_job_lines_remaining",
            "Request lines of this shard not yet committed, counting earlier runs' work as done.",
        ).labels(**labels)
        self.concurrency = _gauge(
            registry,
            "autoglm_job_concurrency",
            "Lines the job allows open now (AIMD limit): in flight, waiting for a send slot "
            "under --max-rate, or waiting to be sent again. It grows only on answers that came "
            "while that many requests were in flight.",
        ).labels(**labels)
        self.in_flight = _gauge(
            registry,
            "autoglm_job_in_flight_requests",
            "Requests sent and not yet answered. Lines held back by --max-rate or waiting to be "
            "sent again are autoglm_job_waiting_requests.",
        ).labels(**labels)
        waiting = Gauge(
            "autoglm_job_waiting_requests",
            "Open lines not in flight, by reason: rate_limit (held back by --max-rate before a "
            "send) or retry (waiting out a Retry-After or a back-off before a send again).",
            ["job_name", "reason"],
            registry=registry,
        )
        self.waiting = {r: waiting.labels(job_name=job_name, reason=r) for r in WAIT_REASONS}
        self.refusals = Counter(
            "autoglm_job_refusals",
            "Requests the endpoint refused for lack of capacity (HTTP 429 or 503).",
            ["job_name"],
            registry=registry,
        ).labels(**labels)
        failures = Counter(
            "autoglm_job_request_failures",
            "Requests that failed and will be tried again, by reason: connection, timeout, "
            "server_error (a 5xx other than 503).",
            ["job_name", "reason"],
            registry=registry,
        )
        self.failures = {r: failures.labels(job_name=job_name, reason=r) for r in FAILURE_REASONS}
        self.latency = Histogram(
            "autoglm_job_request_latency_seconds",
            "Time from sending a request to its answer, for answered requests.",
            ["job_name"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        ).labels(**labels)


def _gauge(registry: CollectorRegistry, name: str, documentation: str) -> Gauge:
    return Gauge(name, documentation, ["job_name"], registry=registry)
