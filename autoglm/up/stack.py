"""The whole loop on one machine: exporter, batcher workers, predictor, autoscaler and load.

What runs where:

* the exporter (in-process) serves simulated GPUs -- one per worker slot -- or the real ones when
  NVML finds a driver;
* batcher workers are subprocesses, started and stopped by the autoscaler's
  :class:`~autoscaler.local.LocalProcessGroup` (one worker = one replica = one GPU);
* a scraper fills the embedded metrics window from every /metrics endpoint each second; after
  each scrape the GPU link pushes each worker's busy fraction into its simulated GPU, the
  predictor is fed the fleet's total GPU work, and the load generator learns which workers are
  ready;
* the autoscaler (in-process, the same reconciler as in a cluster) decides every ``interval``
  seconds on ``DCGM_FI_DEV_GPU_UTIL`` per worker, read from the window, and the predictor's
  forecast of the total;
* the load generator replays the profile against the ready workers.

:meth:`Stack.close` stops everything in the reverse order and is safe after a partial start, so a
failed start, Ctrl-C and the end of ``--duration`` all leave no process behind.
"""

from __future__ import annotations

import logging
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from autoglm.config import ConfigError
from autoglm.httpserver import HTTPServer, Response, registry_route
from autoglm.ports import free_port
from autoglm.up import config as ports
from autoglm.up.config import UpConfig
from autoglm.up.gpu_link import BUSY_COUNTER, GPULink
from autoglm.up.loadgen import LoadGenerator, LoadGenMetrics, RequestLog
from autoglm.up.profiles import profile_from_config
from autoglm.up.prometheus import PrometheusServer, grafana_hint
from autoglm.up.report import Sample, ScaleEvent, Summary, summarize
from autoglm.up.view import View
from autoglm.up.window import MetricsWindow, Scraper, WindowMetricsSource
from autoscaler.controller.controllers import LocalController
from autoscaler.controller.forecasts import ProviderForecasts
from autoscaler.controller.reconciler import Reconciler
from autoscaler.core.replica_calculator import PodSample
from autoscaler.local import LocalProcessGroup, TargetScale
from autoscaler.metrics import AutoscalerMetrics
from autoscaler.spec import GPUAutoscalerSpec, parse_spec
from exporter.service import ExporterService
from predictor.config import TargetConfig
from predictor.metrics import PredictorMetrics
from predictor.service import PredictorService

log = logging.getLogger(__name__)

HOST = "127.0.0.1"
EXPORTER = "exporter"
MODEL_NAME = "demo"
METRIC = "gpu_util"
GPU_MODEL = "NVIDIA H100 80GB HBM3"
UTIL_SERIES = "DCGM_FI_DEV_GPU_UTIL"
# Seconds a sample needs after a worker turns ready before it counts: the busy rate's window
# plus an exporter collection and a scrape (the HPA's readiness rule, window_seconds).
SAMPLE_WINDOW_SECONDS = 5.0
BUSY_RATE_SECONDS = 3.0
WORKERS_READY_TIMEOUT_SECONDS = 180.0
P99_WINDOW_SECONDS = 10.0
RATE_WINDOW_SECONDS = 3.0
PREDICTOR_STEP_SECONDS = 2.0


class Stopped(Exception):
    """The user asked to stop while the stack was still starting."""


def plan_ports(cfg: UpConfig) -> dict[str, int]:
    """Role -> port; 0 everywhere when ``--port-base 0`` (pick free ports)."""
    base = cfg.port_base
    if base == 0:
        return {"exporter": 0, "predictor": 0, "autoscaler": 0, "loadgen": 0, "prometheus": 0}
    planned = {
        "exporter": base + ports.EXPORTER_OFFSET,
        "predictor": base + ports.PREDICTOR_OFFSET,
        "autoscaler": base + ports.AUTOSCALER_OFFSET,
        "loadgen": base + ports.LOADGEN_OFFSET,
        "prometheus": base + ports.PROMETHEUS_OFFSET,
    }
    for i in range(cfg.max_workers):
        planned[f"worker {i}"] = base + ports.WORKERS_OFFSET + i
    return planned


def check_ports(planned: dict[str, int], skip: Sequence[str] = ()) -> None:
    """ConfigError naming the first taken port and how to move every port at once."""
    for role, port in planned.items():
        if port == 0 or role in skip:
            continue
        with socket.socket() as sock:
            # As the servers do: a port whose old connections linger in TIME_WAIT is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError:
                raise ConfigError(
                    f"port {port} ({role}) on {HOST} is taken; stop what uses it or move every "
                    f"port with --port-base, e.g. --port-base {planned['exporter'] + 10000}"
                ) from None


def build_spec(cfg: UpConfig, query: str) -> GPUAutoscalerSpec:
    """The GPUAutoscaler the local stack runs: the cluster's example, on wall-clock seconds
    that suit workers starting in seconds."""
    metric: dict[str, Any] = {
        "name": METRIC,
        "type": "Pods",
        "query": query,
        "target": {"type": "Utilization", "averageUtilization": cfg.target_utilization},
    }
    if cfg.prediction:
        horizon = max(cfg.warmup_seconds, cfg.interval)
        metric["prediction"] = {
            "query": f'sum({UTIL_SERIES}{{namespace="local"}})',
            "horizonSeconds": horizon,
            "quantile": 0.9,
            "warmupSeconds": cfg.warmup_seconds,
        }
    period = max(1, round(cfg.interval))
    return parse_spec(
        {
            "scaleTargetRef": {"apiVersion": "autoglm.io/v1", "kind": "Local", "name": "batcher"},
            "minReplicas": cfg.min_workers,
            "maxReplicas": cfg.max_workers,
            "metrics": [metric],
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {
                    "stabilizationWindowSeconds": round(cfg.scale_down_stabilization),
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": period}],
                },
            },
        }
    )


class RoutedGroup:
    """The worker group as the autoscaler's target, taking doomed workers out of the load
    balancer before they are stopped (as Kubernetes removes a terminating pod from its
    Service's endpoints), so no request is sent to a worker that is draining."""

    def __init__(self, group: LocalProcessGroup, on_doomed: Callable[[set[str]], None]) -> None:
        self.group = group
        self.on_doomed = on_doomed
        self.description = group.description

    def get_scale(self) -> TargetScale:
        return self.group.get_scale()

    def set_replicas(self, replicas: int) -> None:
        doomed = {f"{HOST}:{p}" for p in self.group.ports()[replicas:]}
        if doomed:
            self.on_doomed(doomed)
        self.group.set_replicas(replicas)

    def pods(self) -> list[PodSample]:
        return self.group.pods()

    def supervise(self) -> int:
        return self.group.supervise()

    def endpoints(self) -> list[str]:
        return [f"{HOST}:{p}" for p in self.group.ports()]


def open_gpus(cfg: UpConfig) -> tuple[Any, Any, str]:
    """``(source, simulated source or None, notice)``: NVML when asked and present, else
    ``max_workers`` simulated GPUs whose load the GPU link sets."""
    if cfg.gpus == "auto":
        from exporter.sources import NoDriverError, NVMLSource

        try:
            source = NVMLSource.open()
        except NoDriverError as exc:
            log.info("no NVIDIA driver", extra={"error": str(exc)})
            reason = "no NVIDIA GPU found"
        else:
            return (
                source,
                None,
                (
                    f"NVIDIA GPUs found: the exporter reads {len(source.devices())} real GPU(s); "
                    "workers are scaled on their own measured busy time"
                ),
            )
    else:
        reason = "--gpus simulated"
    from exporter.sources import SimulatedSource, load_profile

    simulated = SimulatedSource(
        gpus=cfg.max_workers, model=GPU_MODEL, seed=0, profile=load_profile("constant:0")
    )
    notice = (
        f"{reason}: simulating {cfg.max_workers} {GPU_MODEL} GPUs, one per worker slot; "
        "each follows its worker's real batches"
    )
    return simulated, simulated, notice


class Stack:
    """Start, run and stop the local stack; every part it starts, :meth:`close` stops."""

    def __init__(self, cfg: UpConfig, view_factory: Callable[[list[str]], View]) -> None:
        self.cfg = cfg
        self.view_factory = view_factory
        self.view: View | None = None
        self.notices: list[str] = []
        self.samples: list[Sample] = []
        self.events: list[ScaleEvent] = []
        self.window = MetricsWindow(keep_seconds=120.0)
        self.scraper = Scraper(self.window)
        self.request_log = RequestLog(cfg.slo_seconds)
        self._lock = threading.Lock()
        self._doomed: set[str] = set()
        self._known_workers: list[str] = []
        self._desired = cfg.min_workers
        self._stop = threading.Event()
        self._autoscaler_thread: threading.Thread | None = None
        self._servers: list[HTTPServer] = []
        self.exporter: ExporterService | None = None
        self.source: Any = None
        self.simulated: Any = None
        self.gpu_link: GPULink | None = None
        self.group: LocalProcessGroup | None = None
        self.routed: RoutedGroup | None = None
        self.predictor: PredictorService | None = None
        self.controller: LocalController | None = None
        self.loadgen: LoadGenerator | None = None
        self.prometheus: PrometheusServer | None = None
        self._reader: Callable[[MetricsWindow, str, float], float | None] = lambda *_: None

    # -- start ---------------------------------------------------------------------------------

    def start(self, stop_requested: threading.Event) -> None:
        """Start every part; ConfigError for a taken port or bad setting, :class:`Stopped` when
        ``stop_requested`` is set meanwhile. On any failure what was started is stopped."""
        try:
            self._start(stop_requested)
        except BaseException:
            self.close()
            raise

    def _start(self, stop_requested: threading.Event) -> None:
        cfg = self.cfg
        planned = plan_ports(cfg)
        check_ports(planned, skip=() if cfg.prometheus else ("prometheus",))
        profile = profile_from_config(cfg)
        if cfg.prometheus:  # fail on a missing binary before anything starts
            from autoglm.up.prometheus import find_binary, find_rules

            find_binary()
            find_rules()

        self.source, self.simulated, notice = open_gpus(cfg)
        self._notice(notice)

        self.group = LocalProcessGroup(
            self._worker_command(),
            base_port=planned.get("worker 0", 0),
            host=HOST,
            env={"OMP_NUM_THREADS": "1"},
            stop_timeout=15.0,
        )
        self.routed = RoutedGroup(self.group, self._take_out_of_rotation)
        if self.simulated is not None:
            uuids = [d.uuid for d in self.simulated.devices()]
            self.gpu_link = GPULink(
                self.simulated, uuids, self.window, self.routed.endpoints, BUSY_RATE_SECONDS
            )
        self.exporter = ExporterService(
            self.source,
            listen=f"{HOST}:{planned['exporter']}",
            hostname=socket.gethostname(),
            interval=1.0,
            pods=self.gpu_link,
            simulation=self.simulated,
        )
        self.exporter.start()

        day = cfg.day_seconds
        self.predictor = PredictorService(
            [
                TargetConfig(
                    name=METRIC,
                    step=PREDICTOR_STEP_SECONDS,
                    lookback=max(3 * day, 60 * PREDICTOR_STEP_SECONDS),
                    horizons=(1, 2, 3, 5, 8, 12),
                    quantile=0.9,
                    seasons=(day,),
                    aggregate="mean",
                    models=("ets_log",),
                )
            ],
            metrics=PredictorMetrics(),
        )
        predictor_server = self._serve("predictor", planned, self.predictor.metrics.registry)

        autoscaler_metrics = AutoscalerMetrics()
        self._reader = reader = self._utilization_reader()
        spec = build_spec(
            cfg,
            f'avg by (pod) ({UTIL_SERIES}{{namespace="local"}})'
            if self.simulated is not None
            else f"100 * rate({BUSY_COUNTER}[{BUSY_RATE_SECONDS:g}s])",
        )
        forecasts = (
            ProviderForecasts(self.predictor, max_age_seconds=60.0) if cfg.prediction else None
        )
        reconciler = Reconciler(
            WindowMetricsSource(self.window, {METRIC: reader}, SAMPLE_WINDOW_SECONDS),
            forecasts,
            autoscaler_metrics,
        )
        self.controller = LocalController(spec, self.routed, reconciler)  # type: ignore[arg-type]
        autoscaler_server = self._serve(
            "autoscaler",
            planned,
            autoscaler_metrics.registry,
            {"/status": lambda _: Response.json(self.controller.status if self.controller else {})},
        )

        loadgen_registry = CollectorRegistry()
        self.loadgen = LoadGenerator(
            profile,
            MODEL_NAME,
            self.request_log,
            LoadGenMetrics(loadgen_registry, cfg.slo_seconds),
            max_in_flight=cfg.max_in_flight,
        )
        loadgen_server = self._serve("loadgen", planned, loadgen_registry)

        if cfg.prometheus:
            port = planned["prometheus"] or free_port(HOST)
            self.prometheus = PrometheusServer(
                Path(cfg.report_dir).resolve() / "prometheus",
                port,
                {
                    "autoglm-exporter": [f"{HOST}:{self.exporter.server.port}"],
                    "autoglm-predictor": [f"{HOST}:{predictor_server.port}"],
                    "autoglm-autoscaler": [f"{HOST}:{autoscaler_server.port}"],
                    "autoglm-loadgen": [f"{HOST}:{loadgen_server.port}"],
                },
            )
            self.prometheus.start()
            for hint in grafana_hint(self.prometheus.url):
                self._notice(hint)

        self.group.set_replicas(cfg.min_workers)
        self._update_targets()
        self.scraper.after_scrape.append(self._after_scrape)
        self.scraper.start()
        self._wait_for_workers(stop_requested)

        self.view = self.view_factory(self.notices)
        self.view.start()
        self.predictor.start(
            refit_seconds=max(30.0, day / 4), update_seconds=PREDICTOR_STEP_SECONDS
        )
        self.loadgen.start()
        self._autoscaler_thread = threading.Thread(
            target=self._autoscale, name="autoglm-up-autoscaler", daemon=True
        )
        self._autoscaler_thread.start()
        log.info(
            "stack started",
            extra={
                "exporter": self.exporter.server.url,
                "workers": self.routed.endpoints(),
                "profile": profile.name,
                "day_seconds": round(day, 1),
            },
        )

    def _notice(self, text: str) -> None:
        """Something the user must know: shown in the live view, logged without it."""
        self.notices.append(text)
        log.info("notice", extra={"notice": text})

    def _worker_command(self) -> list[str]:
        cfg = self.cfg
        return [
            sys.executable,
            "-m",
            "batcher.cli",
            "--model",
            cfg.worker_model,
            "--model-name",
            MODEL_NAME,
            "--listen",
            f"{HOST}:{{port}}",
            "--slo-seconds",
            f"{cfg.slo_seconds:g}",
            "--torch-threads",
            "1",
            "--drain-timeout-seconds",
            "10",
            "--exit-with-parent",
            "--log-level",
            "debug" if cfg.log_level == "debug" else "warning",
            "--log-format",
            cfg.log_format,
        ]

    def _serve(
        self,
        role: str,
        planned: dict[str, int],
        registry: CollectorRegistry,
        extra: dict[str, Any] | None = None,
    ) -> HTTPServer:
        server = HTTPServer(
            f"{HOST}:{planned[role]}",
            {
                "/metrics": registry_route(registry),
                "/healthz": lambda _: Response.text("ok"),
                **(extra or {}),
            },
            component=f"autoglm-{role}",
        )
        server.start()
        self._servers.append(server)
        return server

    def _utilization_reader(self) -> Callable[[MetricsWindow, str, float], float | None]:
        """How one worker's GPU utilization (percent) is read from the window."""
        if self.gpu_link is not None:
            link = self.gpu_link

            def simulated_gpu(window: MetricsWindow, pod: str, now: float) -> float | None:
                slots = link.slots()
                if pod not in slots or not window.up(EXPORTER):
                    return None
                return window.latest(EXPORTER, UTIL_SERIES, {"gpu": str(slots.index(pod))})

            return simulated_gpu

        def measured_busy(window: MetricsWindow, pod: str, now: float) -> float | None:
            rate = window.rate(pod, BUSY_COUNTER, BUSY_RATE_SECONDS, now)
            return None if rate is None else 100.0 * min(1.0, rate)

        return measured_busy

    def _wait_for_workers(self, stop_requested: threading.Event) -> None:
        assert self.routed is not None
        deadline = time.monotonic() + WORKERS_READY_TIMEOUT_SECONDS
        log.info("waiting for workers", extra={"workers": self.cfg.min_workers})
        while len(self._ready_workers()) < self.cfg.min_workers:
            if stop_requested.wait(0.2):
                raise Stopped()
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"workers were not ready after {WORKERS_READY_TIMEOUT_SECONDS:g} s; "
                    "run with --log-level debug to see their output"
                )

    # -- running -------------------------------------------------------------------------------

    def _take_out_of_rotation(self, doomed: set[str]) -> None:
        with self._lock:
            self._doomed |= doomed
        if self.loadgen is not None:
            self.loadgen.set_endpoints(self._ready_workers())

    def _ready_workers(self) -> list[str]:
        assert self.routed is not None
        with self._lock:
            doomed = set(self._doomed)
        return [
            w
            for w in self.routed.endpoints()
            if w not in doomed
            and self.window.up(w)
            and self.window.latest(w, "autoglm_batcher_ready") == 1.0
        ]

    def _update_targets(self) -> None:
        assert self.routed is not None and self.exporter is not None
        workers = self.routed.endpoints()
        with self._lock:
            self._doomed &= set(workers)
        targets = {EXPORTER: f"{self.exporter.server.url}/metrics"}
        targets.update({w: f"http://{w}/metrics" for w in workers})
        self.scraper.set_targets(targets)
        if workers != self._known_workers:
            self._known_workers = workers
            if self.prometheus is not None:
                self.prometheus.set_workers(workers)

    def _after_scrape(self, now: float) -> None:
        """Once a second, after the window has fresh scrapes: drive the rest of the stack."""
        assert self.routed is not None and self.predictor is not None
        if self._stop.is_set():
            return  # shutting down: workers are being stopped, nothing left to drive
        self._update_targets()
        if self.gpu_link is not None:
            self.gpu_link.update(now)
        ready = self._ready_workers()
        if self.loadgen is not None:
            self.loadgen.set_endpoints(ready)
        values = {w: self._reader(self.window, w, now) for w in self.routed.endpoints()}
        known = [v for v in values.values() if v is not None]
        total = sum(known) if known else None
        ready_values = [values[w] for w in ready if values.get(w) is not None]
        if total is not None:
            self.predictor.observe(METRIC, now, total)
        if self.loadgen is None or self.loadgen.started_at is None:
            return
        self._record(now, ready, ready_values, total)

    def _record(
        self, now: float, ready: list[str], ready_values: list[float], total: float | None
    ) -> None:
        assert self.loadgen is not None and self.predictor is not None and self.routed
        elapsed = self.loadgen.elapsed()
        now_mono = self.loadgen.clock()
        recent = self.request_log.window(now_mono, P99_WINDOW_SECONDS)
        sent_rps = self.request_log.window(now_mono, RATE_WINDOW_SECONDS).rate_rps
        horizon = max(self.cfg.warmup_seconds, self.cfg.interval)
        forecast = self.predictor.forecast(METRIC, horizon, 0.9)
        sample = Sample(
            elapsed=elapsed,
            target_rps=self.loadgen.profile.rate(elapsed),
            sent_rps=sent_rps,
            workers=len(self.routed.endpoints()),
            ready_workers=len(ready),
            desired_workers=self._desired,
            mean_utilization=sum(ready_values) / len(ready_values) if ready_values else None,
            total_busy=total,
            forecast_upper=forecast.upper if forecast else None,
            forecast_for=elapsed + forecast.horizon_seconds if forecast else None,
            p99_seconds=recent.p99_seconds,
        )
        self.samples.append(sample)
        if self.view is not None:
            self.view.show(sample)

    def _autoscale(self) -> None:
        assert self.controller is not None and self.loadgen is not None
        while not self._stop.wait(self.cfg.interval):
            try:
                results = self.controller.reconcile_all()
            except Exception:  # one failing tick must not end the autoscaler
                log.exception("autoscaler tick failed")
                continue
            for result in results.values():
                decision = result.decision
                if decision is None:
                    continue
                self._desired = decision.desired_replicas
                if result.scaled:
                    event = ScaleEvent(
                        elapsed=self.loadgen.elapsed(),
                        from_workers=decision.current_replicas,
                        to_workers=decision.desired_replicas,
                        driver=decision.driver,
                        reason=decision.reason,
                    )
                    self.events.append(event)
                    if self.view is not None:
                        self.view.event(event)

    def run(self, stop_requested: threading.Event) -> None:
        """Block until ``stop_requested`` is set or ``--duration`` has passed since the load
        started."""
        assert self.loadgen is not None
        while not stop_requested.is_set():
            if self.cfg.duration and self.loadgen.elapsed() >= self.cfg.duration:
                return
            stop_requested.wait(0.2)

    def summary(self) -> Summary:
        recent = self.request_log.window(
            time.monotonic(), max(1.0, self.samples[-1].elapsed + 1) if self.samples else 1.0
        )
        return summarize(
            self.samples,
            self.events,
            self.request_log.totals,
            self.cfg.slo_seconds,
            self.cfg.target_utilization,
            recent.p99_seconds,
        )

    # -- stop ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every part that was started, newest first; each step runs even if one fails."""
        self._stop.set()
        steps: list[tuple[str, Callable[[], None] | None]] = [
            ("load generator", self.loadgen.stop if self.loadgen else None),
            ("autoscaler", self._join_autoscaler),
            ("view", self.view.stop if self.view else None),
            ("predictor", self.predictor.stop if self.predictor else None),
            ("workers", self.group.close if self.group else None),
            ("scraper", self.scraper.stop),
            ("prometheus", self.prometheus.stop if self.prometheus else None),
            ("exporter", self.exporter.stop if self.exporter else None),
            ("gpus", self.source.close if self.source is not None else None),
        ]
        steps += [("http server", s.stop) for s in self._servers]
        for name, step in steps:
            if step is None:
                continue
            try:
                step()
            except Exception:
                log.exception("stopping failed", extra={"part": name})
        self._servers.clear()
        self.loadgen = None
        self.view = None
        self.predictor = None
        self.group = None
        self.prometheus = None
        self.exporter = None
        self.source = None

    def _join_autoscaler(self) -> None:
        if self._autoscaler_thread is not None:
            self._autoscaler_thread.join(timeout=30.0)
