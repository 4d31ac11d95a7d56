"""The HTTP server's own request metrics, by route path and status code."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram

from autoglm.web.routes import OTHER_PATH


class RequestMetrics:
    """Requests served and their duration; children are resolved once per (path, code)."""

    def __init__(self, registry: CollectorRegistry, paths: Collection[str]) -> None:
        self.requests = Counter(
            "autoglm_http_requests",
            "HTTP requests served, by route path (other: unknown paths) and status code.",
            ["path", "code"],
            registry=registry,
        )
        self.duration = Histogram(
            "autoglm_http_request_duration_seconds",
            "Time from the end of a request's headers until its response is ready to send.",
            ["path"],
            registry=registry,
        )
        self._durations = {p: self.duration.labels(path=p) for p in [*paths, OTHER_PATH]}
        self._counts: dict[tuple[str, int], Any] = {}

    def observe(self, path: str, code: int, seconds: float) -> None:
        """Count one request; ``path`` is a routed path or :data:`OTHER_PATH`."""
        child = self._counts.get((path, code))
        if child is None:
            child = self._counts.setdefault((path, code), self.requests.labels(path, str(code)))
        child.inc()
        self._durations[path].observe(seconds)
