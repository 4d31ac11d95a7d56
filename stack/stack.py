"""The whole loop on one machine: exporter, batcher workers, predictor, autoscaler and load.

What runs where:

* the exporter (in-process) serves simulated GPUs -- one per worker slot -- or the real ones when
  NVML finds a driver;
* batcher workers are subprocesses, started and stopped by the autoscaler's
  :class:`~autoscaler.local.LocalProcessGroup` (one worker = one replica = one GPU);
* a local Prometheus scrapes every component each second, as in a cluster. The predictor reads
  the fleet's online work from it with a range query and publishes ``autoglm_forecast_upper``;
  the autoscaler (the cluster's reconciler and decision core) asks it the same PromQL a
  GPUAutoscaler holds: each worker's share of GPU time spent on online requests, and the
  forecast. It scales on online work only, so best-effort work filling the idle time never
  makes it add workers. Without a ``prometheus`` binary the stack says so and reads an embedded
  window instead (:mod:`stack.window`: the same values computed in Python);
* a scraper fills the embedded metrics window from every /metrics endpoint each second; after
  each scrape the GPU link pushes each worker's busy fraction (online and best-effort) into its
  simulated GPU, and the load generator and the job learn which workers are ready;
* the load generator replays the profile's online requests against the ready workers, and a
  best-effort job (:mod:`stack.job`) sends its backlog through the job runner on the
  capacity they leave idle.

:meth:`Stack.close` stops everything in the reverse order and is safe after a partial start, so a
failed start, Ctrl-C and the end of ``--duration`` all leave no process behind.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.utils import floatToGoString

from autoglm.config import ConfigError
from autoglm.ports import free_port
from autoglm.prometheus_api import PrometheusClient, PrometheusError
from autoglm.web.exchange import Response
from autoglm.web.exposition import registry_route
from autoglm.web.server import HTTPServer
from autoscaler.controller.controllers import LocalController
from autoscaler.controller.forecasts import PrometheusForecasts, ProviderForecasts
from autoscaler.controller.metrics_source import PrometheusMetricsSource
from autoscaler.controller.reconciler import Reconciler
from autoscaler.controller.service_model import PrometheusServiceModels
from autoscaler.core.replica_calculator import PodSample
from autoscaler.local import LocalProcessGroup
from autoscaler.metrics import AutoscalerMetrics
from autoscaler.scale_target import TargetScale
from autoscaler.spec import BATCHER_REQUESTS, GPUAutoscalerSpec, MetricSpec, parse_spec
from exporter.service import ExporterService
from predictor.api import Forecast
from predictor.config import TargetConfig
from predictor.metrics import PredictorMetrics
from predictor.service import PredictorService
from stack.config import DEMO_MODEL, UpConfig
from stack.cpu_wait import CpuWaitLedger
from stack.gpu_link import BEST_EFFORT, CLASS_BUSY_COUNTER, ONLINE, GPULink
from stack.job import BestEffortJob
from stack.kernel import largest_batch_within
from stack.loadgen import LoadGenerator, LoadGenMetrics, RequestLog
from stack.port_plan import HOST, check_ports
from stack.profiles import profile_from_config
from stack.prometheus import WORKERS_JOB, PrometheusServer, grafana_hint
from stack.report import Sample, ScaleEvent, Summary, summarize
from stack.service import LocalService
from stack.view import View
from stack.window import MetricsWindow, Scraper, WindowMetricsSource

log = logging.getLogger(__name__)

EXPORTER = "exporter"
MODEL_NAME = "demo"
METRIC = "online_busy"
GPU_MODEL = "NVIDIA H100 80GB HBM3"
# Seconds a sample needs after a worker turns ready before it counts: the busy rate's window
# plus a scrape (the HPA's readiness rule, window_seconds).
SAMPLE_WINDOW_SECONDS = 5.0
BUSY_RATE_SECONDS = 3.0
PROMQL_RATE_WINDOW = "5s"  # five scrapes at the stack's 1 s scrape interval
WORKERS_READY_TIMEOUT_SECONDS = 180.0
P99_WINDOW_SECONDS = 10.0
RATE_WINDOW_SECONDS = 3.0
PROMETHEUS_TIMEOUT_SECONDS = 2.0
BEST_EFFORT_QUEUE_ITEMS = 16
# The workers' window of online latencies whose p99 drives their best-effort throttle (the
# batcher's default is 10 s). The demo's day passes in minutes, so a ramp's or a stall's slow
# latencies are over within seconds; a 10 s window kept best-effort work throttled, then its
# share growing back, for twice as long as the cause lasted. Five seconds still hold a hundred
# online latencies at the profile's floor.
BEST_EFFORT_WINDOW_SECONDS = 5.0
# The demo model's kernel is a sleep of known length, so two timings of each batch size seed
# its cost model as well as the batcher's default five, and each new worker is ready sooner.
DEMO_WARMUP_REPEATS = 2
SHARE_GAUGE = "autoglm_batcher_best_effort_share"  # the batcher's slack controller, 0..1
# The predictor's series: one point a second; horizons (in steps) up to the default warm-up,
# as few as cover it, because the history a refit needs grows with the deepest horizon
# (predictor.selection.minimum_history) and the demo's first ramp comes within a minute.
PREDICTOR_STEP_SECONDS = 1.0
PREDICTOR_REFIT_SECONDS = 20.0


def online_busy_query(by_pod: bool) -> str:
    """PromQL for the online share of the workers' GPU time, in percent (100 = one GPU busy):
    per worker, labelled ``pod`` (the worker's HOST:PORT, Prometheus' ``instance``), or summed
    over the fleet (what the predictor forecasts)."""
    rate = (
        f'rate({CLASS_BUSY_COUNTER}{{job="{WORKERS_JOB}",class="{ONLINE}"}}[{PROMQL_RATE_WINDOW}])'
    )
    if by_pod:
        return f'100 * sum by (pod) (label_replace({rate}, "pod", "$1", "instance", "(.*)"))'
    return f"100 * sum({rate})"


def request_rate_query() -> str:
    """PromQL for the fleet's online request rate, what ``--sizing slo`` sizes for."""
    return f'sum(rate({BATCHER_REQUESTS}{{job="{WORKERS_JOB}"}}[{PROMQL_RATE_WINDOW}]))'


def batcher_slo_queries(slo_seconds: float, window_seconds: float) -> tuple[str, str, str]:
    """PromQL for the batchers' own count, over the run, of online requests answered within the
    SLO, answered at all, and refused at admission (the SLO is a bucket bound of their latency
    histogram, so the first is exact)."""
    job = f'job="{WORKERS_JOB}"'
    window = f"[{math.ceil(window_seconds)}s]"
    within = (
        f"sum(increase(autoglm_batcher_request_latency_seconds_bucket"
        f'{{{job},le="{floatToGoString(round(slo_seconds, 6))}"}}{window}))'
    )
    answered = f'sum(increase({BATCHER_REQUESTS}{{{job},outcome="ok"}}{window}))'
    refused = f"sum(increase(autoglm_batcher_rejections_total{{{job}}}{window}))"
    return within, answered, refused


def predictor_horizons(warmup_seconds: float, interval: float) -> tuple[int, ...]:
    """Steps ahead the predictor forecasts: doubling up to the one that covers the warm-up (the
    horizon the autoscaler asks for) and one step more, since a forecast counts from its last
    point, which is up to a step old."""
    needed = max(1, math.ceil(max(warmup_seconds, interval) / PREDICTOR_STEP_SECONDS)) + 1
    steps = [1]
    while steps[-1] < needed:
        steps.append(min(needed, steps[-1] * 2))
    return tuple(steps)


def class_percent(
    window: MetricsWindow, worker: str, request_class: str, now: float
) -> float | None:
    """The share of the worker's GPU time spent on one request class over the last seconds, in
    percent (100 = its GPU busy); None before it has two scrapes."""
    rate = window.rate(worker, CLASS_BUSY_COUNTER, BUSY_RATE_SECONDS, now, {"class": request_class})
    return None if rate is None else 100.0 * min(1.0, max(0.0, rate))


def online_percent(window: MetricsWindow, worker: str, now: float) -> float | None:
    """What :func:`online_busy_query` asks Prometheus for one worker, read from the window."""
    return class_percent(window, worker, ONLINE, now)


def idle_held_back(
    ready: dict[str, tuple[float | None, float | None, float | None]],
) -> tuple[float, float]:
    """``(throttled, share cut)``: the ready workers' idle GPU time, in percent of one GPU,
    on those whose batcher holds best-effort work at zero and on those where it allows it only
    part of the device's time. ``ready`` maps each ready worker to its online and best-effort
    percent and its best-effort share (0..1); a worker with any of them unknown counts in
    neither."""
    throttled = share_cut = 0.0
    for online, best_effort, share in ready.values():
        if online is None or best_effort is None or share is None:
            continue
        idle = max(0.0, 100.0 - online - best_effort)
        if share <= 0.0:
            throttled += idle
        elif share < 1.0:
            share_cut += idle
    return throttled, share_cut


class Stopped(Exception):
    """The user asked to stop while the stack was still starting."""


def build_spec(cfg: UpConfig) -> GPUAutoscalerSpec:
    """The GPUAutoscaler the local stack runs: online GPU time per worker against the target,
    with the forecast of the fleet's online work, on wall-clock seconds that suit workers
    starting in seconds."""
    metric: dict[str, Any] = {
        "name": METRIC,
        "type": "Pods",
        "query": online_busy_query(by_pod=True),
        "target": {
            "type": "Utilization",
            "averageUtilization": round(100 * cfg.target_utilization, 3),
        },
    }
    if cfg.prediction:
        horizon = max(cfg.warmup_seconds, cfg.interval)
        metric["prediction"] = {
            "query": online_busy_query(by_pod=False),
            "horizonSeconds": horizon,
            "quantile": 0.9,
            "warmupSeconds": cfg.warmup_seconds,
        }
    period = max(1, round(cfg.interval))
    slo: dict[str, Any] | None = None
    if cfg.sizing == "slo":
        # The online metric stays as the HPA rule the SLO falls back on (no service model yet,
        # Prometheus down); the forecast then belongs to the rate the SLO is sized on.
        slo = {
            "latencySeconds": cfg.slo_seconds,
            "quantile": 0.99,
            "selector": f'{{job="{WORKERS_JOB}"}}',
            "rateQuery": request_rate_query(),
        }
        if "prediction" in metric:
            slo["prediction"] = {**metric.pop("prediction"), "query": request_rate_query()}
    return parse_spec(
        {
            "scaleTargetRef": {"apiVersion": "autoglm.io/v1", "kind": "Local", "name": "batcher"},
            "minReplicas": cfg.min_workers,
            "maxReplicas": cfg.max_workers,
            "metrics": [metric],
            **({"slo": slo} if slo is not None else {}),
            "behavior": {
                "scaleUp": {"stabilizationWindowSeconds": 0},
                "scaleDown": {
                    "stabilizationWindowSeconds": round(cfg.scale_down_stabilization),
                    "policies": [{"type": "Pods", "value": 1, "periodSeconds": period}],
                },
            },
        }
    )


def forecast_metric(spec: GPUAutoscalerSpec) -> MetricSpec:
    """What the predictor forecasts for this spec: the request rate the SLO is sized on, or the
    online work the utilization target is held on."""
    return spec.slo.rate_metric if spec.slo is not None else spec.metrics[0]


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

    def all_exited(self) -> list[int] | None:
        """The exit statuses when every worker has exited (none is left to become ready), else
        None. Nothing restarts them before the stack starts its autoscaler."""
        scale = self.group.get_scale()
        if scale.replicas == 0 or scale.status_replicas > 0:
            return None
        return self.group.exit_statuses()


def open_gpus(cfg: UpConfig) -> tuple[Any, Any, str]:
    """``(source, simulated source or None, notice)``: NVML when asked and present, else
    ``max_workers`` simulated GPUs whose load the GPU link sets."""
    if cfg.gpus == "auto":
        from exporter.sources import NoDriverError, NVMLSource

        try:
            source = NVMLSource.open()
        except NoDriverError as exc:
            # NVML's own words: the exporter's advice in the message names its flags, not ours
            log.info("no NVIDIA driver", extra={"error": str(exc.__cause__ or exc)})
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
        self.cpu = CpuWaitLedger()
        self.batcher_slo_attainment: float | None = None
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
        self.job: BestEffortJob | None = None
        self.forecast_target = METRIC
        self.service: LocalService | None = None

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
        prometheus_binary = self._prometheus_binary()
        planned = check_ports(cfg, with_prometheus=prometheus_binary is not None)
        profile = profile_from_config(cfg)

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

        prometheus_port = (planned["prometheus"] or free_port(HOST)) if prometheus_binary else 0
        client = (
            PrometheusClient(f"http://{HOST}:{prometheus_port}", timeout=PROMETHEUS_TIMEOUT_SECONDS)
            if prometheus_binary
            else None
        )
        spec = build_spec(cfg)
        forecast = forecast_metric(spec)
        self.forecast_target = forecast.name
        day = cfg.day_seconds
        self.predictor = PredictorService(
            [
                TargetConfig(
                    name=forecast.name,
                    query=forecast.prediction_query if client is not None else "",
                    step=PREDICTOR_STEP_SECONDS,
                    lookback=max(2 * day, 120 * PREDICTOR_STEP_SECONDS),
                    horizons=predictor_horizons(cfg.warmup_seconds, cfg.interval),
                    quantile=0.9,
                    seasons=(day,),
                    aggregate="mean",
                    models=("ets_log",),
                )
            ],
            source=client,
            metrics=PredictorMetrics(),
        )
        predictor_server = self._serve("predictor", planned, self.predictor.metrics.registry)

        autoscaler_metrics = AutoscalerMetrics()
        autoscaler_metrics.leader.set(1)  # the one autoscaler here acts without an election
        if client is not None:
            reconciler = Reconciler(
                PrometheusMetricsSource(client),
                PrometheusForecasts(client) if cfg.prediction else None,
                autoscaler_metrics,
                service_models=PrometheusServiceModels(client),
            )
        else:
            reconciler = Reconciler(
                WindowMetricsSource(self.window, {METRIC: online_percent}, SAMPLE_WINDOW_SECONDS),
                ProviderForecasts(self.predictor, max_age_seconds=60.0) if cfg.prediction else None,
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
        jobs_to_scrape = {"autoglm-loadgen": [f"{HOST}:{loadgen_server.port}"]}
        if cfg.job:
            self.service = LocalService(HOST, planned["service"])
            self.service.start()
            self.job = BestEffortJob(
                Path(cfg.report_dir).resolve() / "job", self.service.url, MODEL_NAME
            )
            self.job.prepare()
            job_server = self._serve("job", planned, self.job.registry)
            jobs_to_scrape["autoglm-job"] = [f"{HOST}:{job_server.port}"]

        if prometheus_binary:
            self.prometheus = PrometheusServer(
                Path(cfg.report_dir).resolve() / "prometheus",
                prometheus_port,
                {
                    "autoglm-exporter": [f"{HOST}:{self.exporter.server.port}"],
                    "autoglm-predictor": [f"{HOST}:{predictor_server.port}"],
                    "autoglm-autoscaler": [f"{HOST}:{autoscaler_server.port}"],
                    **jobs_to_scrape,
                },
            )
            self.prometheus.start()
            self._notice(
                f"the autoscaler and the predictor read Prometheus at {self.prometheus.url} "
                "with the PromQL of a cluster's GPUAutoscaler"
            )
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
            refit_seconds=PREDICTOR_REFIT_SECONDS, update_seconds=PREDICTOR_STEP_SECONDS
        )
        self.loadgen.start()
        if self.job is not None:
            self.job.start()
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
                "prometheus": self.prometheus.url if self.prometheus else None,
            },
        )

    def _prometheus_binary(self) -> str | None:
        """The prometheus binary when the stack should start one; a notice when it cannot."""
        if not self.cfg.prometheus:
            self._notice(
                "--no-prometheus: the autoscaler reads an embedded metrics window instead of "
                "Prometheus (the same values, computed in Python)"
            )
            return None
        from stack.prometheus import find_binary, find_rules

        try:
            binary = find_binary()
        except ConfigError:
            if self.cfg.sizing == "slo":
                raise ConfigError(
                    "--sizing slo reads the batchers' measured batch cost from Prometheus, and no "
                    "'prometheus' binary is on PATH; install it (Debian: apt-get install "
                    "prometheus) or use --sizing utilization"
                ) from None
            self._notice(
                "no 'prometheus' binary on PATH (Debian: apt-get install prometheus): the "
                "autoscaler reads an embedded metrics window instead of Prometheus"
            )
            return None
        find_rules()
        return binary

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
            *self._batch_limit(),
            # The job halves its concurrency on every burst of refusals (AIMD); a deeper queue
            # of waiting best-effort items keeps each worker supplied through the halvings,
            # while online requests still go first and wait at most one quantum for them.
            "--best-effort-max-queue",
            str(BEST_EFFORT_QUEUE_ITEMS),
            "--best-effort-window-seconds",
            f"{BEST_EFFORT_WINDOW_SECONDS:g}",
            # One torch thread a worker, where the model is a torch module: the demo model is
            # numpy (one BLAS thread through OMP_NUM_THREADS) and never loads torch.
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

    def _batch_limit(self) -> list[str]:
        """The demo model's largest batch: the largest whose kernel fits inside the SLO (a
        longer one only makes its requests late, and timing it at start-up delays every new
        worker), and its shorter warm-up. Another model keeps the batcher's defaults."""
        if self.cfg.worker_model != DEMO_MODEL:
            return []
        return [
            "--max-batch-size",
            str(largest_batch_within(self.cfg.slo_seconds)),
            "--warmup-repeats",
            str(DEMO_WARMUP_REPEATS),
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
            registry=registry,  # the server's own request metrics beside the component's
        )
        server.start()
        self._servers.append(server)
        return server

    def _wait_for_workers(self, stop_requested: threading.Event) -> None:
        assert self.routed is not None
        deadline = time.monotonic() + WORKERS_READY_TIMEOUT_SECONDS
        log.info("waiting for workers", extra={"workers": self.cfg.min_workers})
        while len(self._ready_workers()) < self.cfg.min_workers:
            if stop_requested.wait(0.2):
                raise Stopped()
            codes = self.routed.all_exited()
            if codes is not None:
                status = ", ".join(str(c) for c in sorted(set(codes))) or "unknown"
                raise RuntimeError(
                    f"every worker exited before it was ready (exit status {status}); their "
                    f"error is in autoglm-up.log under --report-dir {self.cfg.report_dir} "
                    "(on stderr with --no-tui); run with --log-level debug to see all their "
                    "output"
                )
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
        self.cpu.observe([os.getpid(), *self.routed.group.pids()])
        if self.gpu_link is not None:
            self.gpu_link.update(now)
        ready = self._ready_workers()
        if self.loadgen is not None:
            self.loadgen.set_endpoints(ready)
        if self.service is not None:
            self.service.set_endpoints(ready)
        workers = self.routed.endpoints()
        online = {w: online_percent(self.window, w, now) for w in workers}
        known = [v for v in online.values() if v is not None]
        online_total = sum(known) if known else None
        target = self.predictor.targets[self.forecast_target].config
        if online_total is not None and target.query == "":
            self.predictor.observe(target.name, now, online_total)  # embedded mode: pushed
        if self.loadgen is None or self.loadgen.started_at is None:
            return
        ready_online = [v for w in ready if (v := online.get(w)) is not None]
        best_effort = {w: class_percent(self.window, w, BEST_EFFORT, now) for w in workers}
        best_effort_known = [v for v in best_effort.values() if v is not None]
        self._record(
            now,
            ready,
            sum(ready_online) / len(ready_online) if ready_online else None,
            online_total,
            sum(best_effort_known) if best_effort_known else None,
            idle_held_back(
                {
                    w: (online.get(w), best_effort.get(w), self.window.latest(w, SHARE_GAUGE))
                    for w in ready
                }
            ),
        )

    def _record(
        self,
        now: float,
        ready: list[str],
        online_utilization: float | None,
        online_work: float | None,
        best_effort_work: float | None,
        held_back: tuple[float, float],
    ) -> None:
        assert self.loadgen is not None and self.predictor is not None and self.routed
        elapsed = self.loadgen.elapsed()
        now_mono = self.loadgen.clock()
        recent = self.request_log.window(now_mono, P99_WINDOW_SECONDS)
        sent_rps = self.request_log.window(now_mono, RATE_WINDOW_SECONDS).rate_rps
        forecast = self._forecast()
        sample = Sample(
            elapsed=elapsed,
            target_rps=self.loadgen.profile.rate(elapsed),
            sent_rps=sent_rps,
            workers=len(self.routed.endpoints()),
            ready_workers=len(ready),
            desired_workers=self._desired,
            online_utilization=online_utilization,
            online_work=online_work,
            best_effort_work=best_effort_work,
            best_effort_done=self.job.done() if self.job is not None else 0,
            forecast_upper=forecast.upper if forecast else None,
            forecast_for=elapsed + forecast.horizon_seconds if forecast else None,
            p99_seconds=recent.p99_seconds,
            idle_throttled_work=held_back[0],
            idle_share_cut_work=held_back[1],
        )
        self.samples.append(sample)
        if self.view is not None:
            self.view.show(sample)

    def _forecast(self) -> Forecast | None:
        """The forecast the autoscaler reads: of those published, the nearest at or beyond the
        warm-up horizon (the rule of autoscaler.controller.forecasts.PrometheusForecasts)."""
        assert self.predictor is not None
        horizon = max(self.cfg.warmup_seconds, self.cfg.interval)
        ahead = [
            f
            for f in self.predictor.forecasts(self.forecast_target)
            if f.horizon_seconds >= horizon
        ]
        return min(ahead, key=lambda f: f.horizon_seconds, default=None)

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
            os.getloadavg(),
            self.cfg.sizing,
            cpu.wait_per_run if (cpu := self.cpu.totals()) is not None else None,
            self.batcher_slo_attainment,
            self.loadgen.max_behind_seconds if self.loadgen is not None else None,
        )

    # -- stop ----------------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every part that was started, newest first; each step runs even if one fails."""
        self._stop.set()
        steps: list[tuple[str, Callable[[], None] | None]] = [
            ("best-effort job", self.job.stop if self.job else None),
            ("load generator", self.loadgen.stop if self.loadgen else None),
            ("autoscaler", self._join_autoscaler),
            ("view", self.view.stop if self.view else None),
            ("batchers' SLO count", self._count_batcher_slo),
            ("predictor", self.predictor.stop if self.predictor else None),
            ("workers", self.group.close if self.group else None),
            ("service", self.service.stop if self.service else None),
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
        self.service = None
        self.view = None
        self.predictor = None
        self.group = None
        self.prometheus = None
        self.exporter = None
        self.source = None

    def _count_batcher_slo(self) -> None:
        """The batchers' own share of online requests within the SLO, read from Prometheus
        before it stops: what the product did, without the load generator's own delays (on a
        busy machine its HTTP client is late too). None without Prometheus."""
        if self.prometheus is None or self.loadgen is None or self.loadgen.started_at is None:
            return
        client = PrometheusClient(self.prometheus.url, timeout=PROMETHEUS_TIMEOUT_SECONDS)
        queries = batcher_slo_queries(self.cfg.slo_seconds, self.loadgen.elapsed() + 2.0)
        try:
            within, answered, refused = (
                sum(s.value for s in client.query(q).samples) for q in queries
            )
        except PrometheusError:
            log.warning("the batchers' SLO count could not be read", exc_info=True)
            return
        if answered + refused > 0:
            self.batcher_slo_attainment = min(1.0, within / (answered + refused))

    def _join_autoscaler(self) -> None:
        if self._autoscaler_thread is not None:
            self._autoscaler_thread.join(timeout=30.0)
