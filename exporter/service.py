"""The running exporter: a collector, the latest rendered exposition, and the HTTP routes.

The collector thread renders each snapshot as soon as it is taken (with the pod attribution the
pod-resources watcher holds at that moment) and swaps it in with one reference assignment; a
scrape reads that reference and returns bytes, so scrapes never wait on a collection, on NVML or
on the kubelet.

With the simulated source the service also serves its controls: ``POST``/``DELETE /debug/faults``
(inject and clear faults) and ``PUT /debug/load`` (drive a GPU with a measured load).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from http import HTTPStatus
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import gzip_accepted

from autoglm.web.exchange import Handler, Request, Response
from autoglm.web.server import HTTPServer
from autoglm.webconfig import WebConfig
from exporter.collector import Collector, Snapshot
from exporter.fields import FIELDS, FieldSpec
from exporter.model import GPUSource
from exporter.render import (
    OPENMETRICS_CONTENT_TYPE,
    TEXT_CONTENT_TYPE,
    Exposition,
    Format,
    Naming,
    PodRefLike,
    PodResourcesStatus,
    render,
    wants_openmetrics,
)
from exporter.sources.faults import Fault, parse_fault

log = logging.getLogger(__name__)


class AttributionSource(PodResourcesStatus, Protocol):
    """What the service needs of the pod-resources watcher: its health and its attribution."""

    def attribution(self) -> Mapping[str, Sequence[PodRefLike]]: ...


class SimulationControls(Protocol):
    """The run-time controls of the simulated source, served under ``/debug/``."""

    def inject(self, fault: Fault) -> None: ...

    def clear_faults(self) -> None: ...

    def set_external_load(self, index: int, utilization: float | None) -> None: ...


LOAD_BODY_EXAMPLE = '{"gpu": 0, "utilization": 0.7}'


def parse_load_request(body: bytes) -> tuple[int, float | None]:
    """``(gpu, utilization)`` from a ``PUT /debug/load`` body; ValueError says what is wrong.

    The source checks the rest (the GPU exists, the ratio is within 0..1).

    ``utilization`` is a ratio 0..1, or ``null`` to hand the GPU back to the load profile. It
    must be given explicitly, so a typo (``"util"``) is an error rather than a silent reset.
    """
    try:
        data = json.loads(body)
    except ValueError:
        raise ValueError(f"body must be JSON like {LOAD_BODY_EXAMPLE}") from None
    if not isinstance(data, dict):
        raise ValueError(f"body must be a JSON object like {LOAD_BODY_EXAMPLE}")
    unknown = sorted(set(data) - {"gpu", "utilization"})
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(unknown)}; expected {LOAD_BODY_EXAMPLE}")
    if "gpu" not in data or "utilization" not in data:
        raise ValueError(
            f"both 'gpu' and 'utilization' are required, e.g. {LOAD_BODY_EXAMPLE}; "
            'use "utilization": null to return the GPU to the load profile'
        )
    gpu, utilization = data["gpu"], data["utilization"]
    if isinstance(gpu, bool) or not isinstance(gpu, int):
        raise ValueError(f"'gpu' must be a GPU index (an integer), not {json.dumps(gpu)}")
    if utilization is None:
        return gpu, None
    if isinstance(utilization, bool) or not isinstance(utilization, int | float):
        raise ValueError(
            f"'utilization' must be a ratio 0..1 or null, not {json.dumps(utilization)}"
        )
    return gpu, float(utilization)  # the source checks the range (and refuses NaN)


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
        simulation: SimulationControls | None = None,
        registry: CollectorRegistry | None = None,
        fields: Sequence[FieldSpec] = FIELDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._source = source
        self._fields = tuple(fields)
        self._naming = naming
        self._hostname = hostname
        self._pods = pods
        self._simulation = simulation
        self._clock = clock
        self._exposition: Exposition | None = None
        self._ready = False
        # Metrics of the exporter's other parts (HTTP server, pod-resources watcher); rendered
        # with each snapshot, so a scrape never walks them.
        self.registry = registry if registry is not None else CollectorRegistry()
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
        if self._simulation is not None:
            routes["POST /debug/faults"] = self.inject_fault
            routes["DELETE /debug/faults"] = self.clear_faults
            routes["PUT /debug/load"] = self.set_load
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
            fields=self._fields,
        )
        if snapshot.last_success is not None:
            self._ready = True

    def serve_metrics(self, request: Request) -> Response:
        exposition = self._exposition
        if exposition is None:
            return Response.text("no collection has completed yet", HTTPStatus.SERVICE_UNAVAILABLE)
        fmt: Format = "openmetrics" if wants_openmetrics(request.headers.get("Accept")) else "text"
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
        """``POST /debug/faults``: the body is one fault spec, e.g. ``xid:gpu=2:code=79``."""
        assert self._simulation is not None
        spec = request.body.decode("utf-8", errors="replace").strip()
        try:
            fault = parse_fault(spec)
            self._simulation.inject(fault)
        except ValueError as exc:
            return Response.text(str(exc), HTTPStatus.BAD_REQUEST)
        log.info("fault injected", extra={"fault": spec})
        return Response.text(f"injected {spec}")

    def clear_faults(self, _: Request) -> Response:
        """``DELETE /debug/faults``: end every lasting fault."""
        assert self._simulation is not None
        self._simulation.clear_faults()
        log.info("faults cleared")
        return Response.text("faults cleared")

    def set_load(self, request: Request) -> Response:
        """``PUT /debug/load``: drive one simulated GPU with a measured utilization.

        This is how a process outside the exporter (the batcher, under ``autoglm up``) feeds its
        real load into the simulated GPUs; ``"utilization": null`` returns the GPU to the profile.
        Logged at debug level, since a driver calls it every few seconds per GPU.
        """
        assert self._simulation is not None
        try:
            gpu, utilization = parse_load_request(request.body)
            self._simulation.set_external_load(gpu, utilization)
        except ValueError as exc:
            return Response.text(str(exc), HTTPStatus.BAD_REQUEST)
        log.debug("external load set", extra={"gpu": gpu, "utilization": utilization})
        return Response.json({"gpu": gpu, "utilization": utilization})
