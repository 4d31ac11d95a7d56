"""The running exporter: a collector, the latest rendered exposition, and the HTTP routes.

The collector thread renders each snapshot as soon as it is taken (with the pod attribution the
pod-resources watcher holds at that moment) and swaps it in with one reference assignment; a
scrape reads that reference and returns bytes, so scrapes never wait on a collection, on NVML or
on the kubelet.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import gzip_accepted

from autoglm.httpserver import Handler, HTTPServer, Request, Response
from autoglm.webconfig import WebConfig
from exporter.collector import Collector, Snapshot
from exporter.model import GPUSource
from exporter.render import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Exposition,
    Naming,
    PodRefLike,
    render,
    wants_openmetrics,
)
from exporter.sources.faults import Fault, parse_fault

log = logging.getLogger(__name__)


class AttributionSource(Protocol):
    """What the service needs of the pod-resources watcher."""

    @property
    def healthy(self) -> bool: ...

    @property
    def last_success(self) -> float | None: ...

    def attribution(self) -> Mapping[str, Sequence[PodRefLike]]: ...


class FaultTarget(Protocol):
    """A source that takes injected faults (the simulated one)."""

    def inject(self, fault: Fault) -> None: ...

    def clear_faults(self) -> None: ...


class ExporterService:
    """Wire a source to ``/metrics``; ``start``/``stop`` own every thread it runs."""

    def __init__(
        self,
        source: GPUSource,
        *,
        listen: str = ":9400",
        naming: Naming = "dcgm",
        hostname: str = "localhost",
        interval: float = 1.0,
        deadline: float = 0.8,
        xid_hold: float = 300.0,
        web_config: WebConfig | None = None,
        pods: AttributionSource | None = None,
        fault_target: FaultTarget | None = None,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._naming = naming
        self._hostname = hostname
        self._pods = pods
        self._fault_target = fault_target
        self._clock = clock
        self._exposition: Exposition | None = None
        self._ready = False
        # Metrics of the exporter's other parts (HTTP server, pod-resources watcher); rendered
        # with each snapshot, so a scrape never walks them.
        self.registry = registry or CollectorRegistry()
        self.collector = Collector(
            source,
            self._publish,
            interval=interval,
            deadline=deadline,
            xid_hold=xid_hold,
            clock=clock,
        )
        self.server = HTTPServer(
            listen,
            self._routes(),
            web_config=web_config,
            component="autoglm-exporter",
            registry=self.registry,
            open_paths=("/healthz", "/readyz"),
        )

    def _routes(self) -> dict[str, Handler]:
        routes: dict[str, Handler] = {
            "/metrics": self.serve_metrics,
            "/healthz": lambda _: Response.text("ok"),
            "/readyz": self.serve_ready,
        }
        if self._fault_target is not None:
            routes["POST /debug/faults"] = self.inject_fault
            routes["DELETE /debug/faults"] = self.clear_faults
        return routes

    def start(self) -> None:
        """Serve HTTP (a taken port raises ConfigError), then start collecting."""
        try:
            self.server.start()
        except Exception:
            self.collector.stop()  # its device readers already run
            raise
        self.collector.start()

    def stop(self) -> None:
        self.server.stop()
        self.collector.stop()

    @property
    def exposition(self) -> Exposition | None:
        return self._exposition

    def _publish(self, snapshot: Snapshot) -> None:
        attribution = self._pods.attribution() if self._pods is not None else {}
        self._exposition = render(
            snapshot,
            self._naming,
            self._hostname,
            attribution=attribution,
            pod_resources=self._pods,
            registries=(self.registry,),
        )
        if snapshot.last_success is not None:
            self._ready = True

    def serve_metrics(self, request: Request) -> Response:
        exposition = self._exposition
        if exposition is None:
            return Response.text("no collection has completed yet", HTTPStatus.SERVICE_UNAVAILABLE)
        fmt = "openmetrics" if wants_openmetrics(request.headers.get("Accept")) else "text"
        compressed = gzip_accepted(request.headers.get("Accept-Encoding", ""))
        response = Response(
            body=exposition.body(fmt, self._clock(), compressed),
            content_type=OPENMETRICS_CONTENT_TYPE if fmt == "openmetrics" else TEXT_CONTENT_TYPE,
        )
        if compressed:
            response.headers["Content-Encoding"] = "gzip"
        return response

    def serve_ready(self, _: Request) -> Response:
        if not self._ready:
            return Response.text(
                "not ready: no collection has read a GPU yet", HTTPStatus.SERVICE_UNAVAILABLE
            )
        return Response.text("ready")

    def inject_fault(self, request: Request) -> Response:
        assert self._fault_target is not None
        spec = request.body.decode("utf-8", errors="replace").strip()
        try:
            fault = parse_fault(spec)
            self._fault_target.inject(fault)
        except ValueError as exc:
            return Response.text(str(exc), HTTPStatus.BAD_REQUEST)
        log.info("fault injected", extra={"fault": spec})
        return Response.text(f"injected {spec}")

    def clear_faults(self, _: Request) -> Response:
        assert self._fault_target is not None
        self._fault_target.clear_faults()
        log.info("faults cleared")
        return Response.text("faults cleared")
