"""Replay a trace through the fleet model with a scaling policy driving the real decision core.

Every ``tick`` seconds (15 s, the HPA's sync period) the autoscaler reads the request rate of the
last ``metric_window`` seconds, as ``rate(requests[1m])`` would, and calls
:func:`autoscaler.core.decide` with it as an External metric with an AverageValue target: the
rate one replica should carry at the utilization target (``target_utilization`` of the rate a
replica serves at full batches). With ``queue_target`` set, the number of waiting requests is a
second External AverageValue metric (waiting requests per replica), and the larger proposal wins
as in the HPA. ``hpa`` uses the live readings alone; ``predictive`` adds the predictor's upper
bound, the highest over the next warm-up (a cold start plus one tick); ``static`` keeps enough
replicas for the trace's peak rate at the same target and never scales.

With ``sizing="slo"`` the utilization target is not used: every tick the fleet is sized for the
latency SLO by :func:`autoscaler.core.slo_sizing.replicas_for_slo` at the larger of the observed
rate and (``predictive``) the forecast's upper bound (with ``slo_backlog``, also for a request
arriving behind the queue waiting then), and that count goes through the same
decision core as an External AverageValue metric with a target of one replica, so the HPA's
tolerance, stabilization windows, policies and min/max apply to it unchanged. With
``slo_objective`` the per-request quantile sized for is derived at each rate from the share of
minutes that must hold ``slo_quantile`` (:mod:`autoscaler.core.slo_objective`).

With ``backfill`` set, best-effort work fills the replicas the online load leaves idle
(:mod:`autoscaler.simulator.backfill`): every tick the online p99 of the last
``backfill.window_seconds`` (a request still waiting counts with its age so far) sets the
best-effort share through the slack controller.

Why the request rate and not the GPU busy fraction: the busy fraction saturates at 100% when the
fleet is overloaded, so it under-reports how far behind the fleet is, and it depends on the
replica count, so it cannot be forecast independently of the autoscaler's own actions. The rate is
the load itself; every policy sees exactly the same signal and target.
"""

from __future__ import annotations

import functools
import math
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np

from autoscaler.core import MetricInput, ScalingState, decide, record_scale
from autoscaler.core.slo_objective import sizing_quantile_for_objective
from autoscaler.core.slo_sizing import ServiceModel, replicas_for_slo, slo_less_best_effort_slice
from autoscaler.simulator.backfill import BackfillConfig, SlackController
from autoscaler.simulator.fleet import Fleet
from autoscaler.simulator.forecast import LoadForecaster, PredictorForecaster
from autoscaler.simulator.trace import Trace
from autoscaler.spec import GPUAutoscalerSpec, parse_spec
from predictor.api import model_names

Policy = Literal["static", "hpa", "predictive"]
POLICIES: tuple[str, ...] = ("static", "hpa", "predictive")
Sizing = Literal["target", "slo"]


@dataclass(frozen=True)
class SimulationConfig:
    service: ServiceModel
    cold_start: float = 120.0
    tick: float = 15.0
    metric_window: float = 60.0
    target_utilization: float = 0.7
    slo_seconds: float = 10.0
    slo_on: Literal["latency", "queueing"] = "latency"
    min_replicas: int = 1
    max_replicas: int = 64
    queue_target: float | None = None  # waiting requests per replica, a second metric if set
    forecast_step: float = 60.0
    forecast_quantile: float = 0.9
    forecast_seasons: tuple[float, ...] = (86400.0, 604800.0)  # in simulated seconds
    forecast_models: tuple[str, ...] = ()  # restrict the predictor's candidates (empty: all)
    forecast_refit_seconds: float = 86400.0
    forecast_lookback_seconds: float = 14 * 86400.0  # history the predictor fits and calibrates on
    forecast_series: Literal["peak", "mean"] = "mean"  # per step: mean or peak of the rate
    static_window: float = 300.0  # static provisioning covers the peak rate over this window
    behavior: dict[str, Any] | None = None  # the spec's behavior section, camelCase
    static_replicas: int | None = None  # default: peak provisioning at the target
    drain_limit: float = 3600.0  # seconds after the last arrival to finish the queue
    score_from: float = 0.0  # requests arriving earlier are replayed but not scored
    sizing: Sizing = "target"  # "slo": size for the latency SLO instead of the target
    slo_quantile: float = 0.99  # the latency quantile SLO sizing holds inside slo_seconds
    slo_service_scv: float = 0.0  # SLO sizing: squared coefficient of variation of service times
    # SLO sizing: the share of minutes whose slo_quantile must hold; the per-request quantile
    # sized for is then derived from it at each rate (None: size for slo_quantile itself)
    slo_objective: float | None = None
    # SLO sizing: also for a request arriving behind the queue waiting now (the controller does
    # not read the batchers' queues yet, so off by default)
    slo_backlog: bool = False
    backfill: BackfillConfig | None = None  # best-effort work on idle replicas

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value!r}")
        if not 0 < self.target_utilization <= 1:
            raise ValueError("target_utilization must be in (0, 1], e.g. 0.7")
        if not 0 < self.forecast_quantile < 1:
            raise ValueError(
                f"forecast_quantile must be in (0, 1), e.g. 0.9, got {self.forecast_quantile!r}"
            )
        if not 0 < self.slo_quantile < 1:
            raise ValueError(
                f"slo_quantile must be in (0, 1), e.g. 0.99, got {self.slo_quantile!r}"
            )
        if self.slo_objective is not None and not 0 < self.slo_objective < 1:
            raise ValueError(
                f"slo_objective must be in (0, 1), e.g. 0.995, or None, got {self.slo_objective!r}"
            )
        if self.slo_service_scv < 0:
            raise ValueError(f"slo_service_scv must be >= 0, got {self.slo_service_scv!r}")
        if self.sizing not in ("target", "slo"):
            raise ValueError(f"sizing must be 'target' or 'slo', got {self.sizing!r}")
        if self.backfill is not None and self.backfill.reserve_quantum:
            slo_less_best_effort_slice(
                self.slo_seconds, self.backfill.quantum(self.service, self.slo_seconds)
            )
        if self.sizing == "slo" and (self.slo_on != "latency" or self.slo_seconds <= 0):
            raise ValueError("SLO sizing needs an end-to-end latency SLO: slo_on='latency', > 0 s")
        if self.backfill is not None and self.slo_seconds <= 0:
            raise ValueError("backfill needs an SLO > 0 seconds to measure the online slack by")
        if self.tick <= 0:
            raise ValueError("tick must be > 0 seconds")
        for name in ("cold_start", "metric_window", "slo_seconds", "drain_limit", "score_from"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        if min(self.tick, self.forecast_step, self.forecast_refit_seconds) <= 0 or (
            self.forecast_lookback_seconds <= 0
        ):
            raise ValueError(
                "tick, forecast_step, forecast_refit_seconds and forecast_lookback_seconds "
                "must be > 0 seconds"
            )
        if not 1 <= self.min_replicas <= self.max_replicas:
            raise ValueError("need 1 <= min_replicas <= max_replicas")
        if self.queue_target is not None and self.queue_target <= 0:
            raise ValueError("queue_target must be > 0 waiting requests per replica, or None")
        known = model_names(self.forecast_seasons)
        unknown = [m for m in self.forecast_models if m not in known]
        if unknown:
            raise ValueError(
                f"unknown forecast model {unknown[0]!r}; choose from: {', '.join(known)}"
            )

    @property
    def target_rate_per_replica(self) -> float:
        return self.target_utilization * self.service.capacity_rps

    @property
    def warmup_seconds(self) -> float:
        """How far ahead capacity must be ordered: a cold start, plus the wait for the next
        decision, since a replica ordered at the next tick is the earliest alternative."""
        return self.cold_start + self.tick


@dataclass
class Timeline:
    """Per-tick samples for reports and plots."""

    t: list[float] = field(default_factory=list)
    rate: list[float] = field(default_factory=list)
    replicas: list[int] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    forecast: list[float] = field(default_factory=list)
    queue: list[int] = field(default_factory=list)
    backfill_share: list[float] = field(default_factory=list)


@dataclass
class SimulationResult:
    policy: str
    config: SimulationConfig
    trace: Trace
    latency: np.ndarray
    queueing: np.ndarray
    billed_seconds: float
    busy_seconds: float
    end_time: float
    timeline: Timeline
    scale_ups: int
    scale_downs: int
    drivers: Counter
    forecast_models: Counter  # ticks on which each model's forecast was the one consumed
    unfinished: int
    backfill_seconds: float = 0.0  # replica-seconds of best-effort work done
    starting_seconds: float = 0.0  # replica-seconds paid for before replicas were ready
    backfill_quantum: float | None = None


def policy_spec(config: SimulationConfig, policy: Policy) -> GPUAutoscalerSpec:
    """The GPUAutoscaler spec each policy runs with (the same target for all).

    Under SLO sizing the first metric is the sized replica count itself, whose forecast is
    already folded in, so it carries no prediction section.
    """
    metric: dict[str, Any] = {
        "name": "request_rate",
        "type": "External",
        "query": "sum(rate(requests_total[1m]))",
        "target": {"type": "AverageValue", "averageValue": config.target_rate_per_replica},
    }
    if config.sizing == "slo":
        metric = {
            "name": "slo_replicas",
            "type": "External",
            "query": "replicas for the latency SLO",
            "target": {"type": "AverageValue", "averageValue": 1},
        }
    elif policy == "predictive":
        metric["prediction"] = {
            "horizonSeconds": config.warmup_seconds,
            "warmupSeconds": config.cold_start,
            "quantile": config.forecast_quantile,
        }
    metrics = [metric]
    if config.queue_target is not None:
        metrics.append(
            {
                "name": "queue_length",
                "type": "External",
                "query": "sum(requests_waiting)",
                "target": {"type": "AverageValue", "averageValue": config.queue_target},
            }
        )
    raw: dict[str, Any] = {
        "scaleTargetRef": {"kind": "Deployment", "name": "simulated"},
        "minReplicas": config.min_replicas,
        "maxReplicas": config.max_replicas,
        "metrics": metrics,
        # Always a behavior section (the API defaults where unset): without one the HPA's
        # legacy rules would apply, and the policies compared here are the behavior path's.
        "behavior": config.behavior or {},
    }
    return parse_spec(raw)


def peak_replicas(trace: Trace, config: SimulationConfig) -> int:
    """Static peak provisioning: the replicas the busiest ``static_window`` needs at target."""
    window = max(config.static_window, config.tick)
    ends = np.arange(window, trace.duration + window, config.tick)
    counts = np.searchsorted(trace.arrivals, ends, side="right") - np.searchsorted(
        trace.arrivals, ends - window, side="right"
    )
    peak_rate = float(counts.max()) / window if len(counts) else 0.0
    needed = math.ceil(peak_rate / config.target_rate_per_replica - 1e-9)
    return min(config.max_replicas, max(config.min_replicas, needed))


def warm_start_replicas(trace: Trace, config: SimulationConfig) -> int:
    """Replicas a running service would have when the trace starts: enough for its first window.

    A trace is a slice of a service that was already running; starting every dynamic policy
    from minReplicas would charge them all a cold ramp that production never sees.
    """
    window = max(config.metric_window, config.tick)
    first = np.searchsorted(trace.arrivals, window, side="right") / window
    if config.sizing == "slo":
        return sized_replicas(config, first)
    needed = math.ceil(first / config.target_rate_per_replica - 1e-9)
    return min(config.max_replicas, max(config.min_replicas, needed))


def predictor_forecaster(config: SimulationConfig) -> PredictorForecaster:
    """The predictor service as the predictive policy consumes it, set up from ``config``."""
    return PredictorForecaster(
        config.forecast_step,
        config.warmup_seconds,
        quantile=config.forecast_quantile,
        seasons_seconds=config.forecast_seasons,
        models=config.forecast_models,
        refit_seconds=config.forecast_refit_seconds,
        lookback_seconds=config.forecast_lookback_seconds,
        series=config.forecast_series,
    )


def simulate(
    trace: Trace,
    config: SimulationConfig,
    policy: Policy,
    forecaster: LoadForecaster | None = None,
) -> SimulationResult:
    """Run one policy over the whole trace and until its queue drains (or ``drain_limit``)."""
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    spec = policy_spec(config, policy)
    rate_metric = spec.metrics[0]
    queue_metric = spec.metrics[1] if len(spec.metrics) > 1 else None
    static = policy == "static"
    initial = (
        config.static_replicas or peak_replicas(trace, config)
        if static
        else warm_start_replicas(trace, config)
    )
    if policy != "predictive":
        forecaster = None
    elif forecaster is None:
        forecaster = predictor_forecaster(config)
    backfill = config.backfill
    quantum = None if backfill is None else backfill.quantum(config.service, config.slo_seconds)
    fleet = Fleet(
        trace.arrivals,
        trace.work,
        config.service,
        config.cold_start,
        initial,
        backfill_quantum=quantum,
        backfill_work=0.0 if backfill is None else backfill.work_seconds,
    )
    slack = None if backfill is None else SlackController(backfill, config.slo_seconds)
    state = ScalingState()
    timeline = Timeline()
    drivers: Counter = Counter()
    forecast_models: Counter = Counter()
    ups = downs = 0
    arrivals = trace.arrivals
    t = 0.0
    limit = trace.duration + config.drain_limit
    while t < limit:
        t += config.tick
        fleet.advance(t)
        hi = np.searchsorted(arrivals, t, side="right")
        lo = np.searchsorted(arrivals, t - config.metric_window, side="right")
        rate = (hi - lo) / config.metric_window if config.metric_window > 0 else 0.0
        forecast_value: float | None = None
        if forecaster is not None:
            forecaster.observe(t, rate)
            forecast_value = forecaster.upper(t, config.warmup_seconds)
            if forecast_value is not None:
                forecast_models[forecaster.name] += 1
        timeline.t.append(t)
        timeline.rate.append(rate)
        timeline.forecast.append(math.nan if forecast_value is None else forecast_value)
        timeline.queue.append(fleet.queue_length)
        if not static:
            if config.sizing == "slo":
                sizing_rate = max(rate, forecast_value or 0.0)
                backlog = fleet.queue_length if config.slo_backlog else 0
                value = float(sized_replicas(config, sizing_rate, backlog))
                inputs = [MetricInput(rate_metric, value=value)]
            else:
                inputs = [MetricInput(rate_metric, value=rate, forecast_upper=forecast_value)]
            if queue_metric is not None:
                inputs.append(MetricInput(queue_metric, value=float(fleet.queue_length)))
            current = fleet.replica_count
            decision = decide(spec, current, inputs, state, t)
            if decision.rescale:
                fleet.scale_to(decision.desired_replicas)
                record_scale(state, t, current, decision.desired_replicas)
                drivers[decision.driver] += 1
                if decision.desired_replicas > current:
                    ups += 1
                else:
                    downs += 1
        if slack is not None:
            slack.update(recent_online_p99(fleet, t, slack.config.window_seconds))
            fleet.set_backfill_cap(slack.allowed_replicas(fleet.ready_count))
            timeline.backfill_share.append(slack.share)
        timeline.replicas.append(fleet.replica_count)
        timeline.ready.append(fleet.ready_count)
        if t >= trace.duration and not np.isnan(fleet.finished).any() and fleet.queue_length == 0:
            break
    fleet.advance(t)
    finished = fleet.finished
    return SimulationResult(
        policy=policy,
        config=config,
        trace=trace,
        latency=finished - arrivals,
        queueing=fleet.started - arrivals,
        billed_seconds=fleet.billed_seconds(t),
        busy_seconds=fleet.busy_seconds,
        end_time=t,
        timeline=timeline,
        scale_ups=ups,
        scale_downs=downs,
        drivers=drivers,
        forecast_models=forecast_models,
        unfinished=int(np.isnan(finished).sum()),
        backfill_seconds=fleet.backfill_seconds,
        starting_seconds=fleet.starting_seconds(t),
        backfill_quantum=quantum,
    )


def sized_latency(config: SimulationConfig) -> float:
    """The latency SLO sizing holds: the SLO, less one best-effort slice when it is reserved."""
    quantum = None
    if config.backfill is not None and config.backfill.reserve_quantum:
        quantum = config.backfill.quantum(config.service, config.slo_seconds)
    return slo_less_best_effort_slice(config.slo_seconds, quantum)


def sized_replicas(config: SimulationConfig, rate: float, backlog: int = 0) -> int:
    """The replicas SLO sizing asks for at ``rate`` with ``backlog`` requests waiting (its best
    effort when the SLO is out of reach)."""
    quantile = config.slo_quantile
    if config.slo_objective is not None:
        quantile = sizing_quantile_for_objective(rate, quantile, config.slo_objective)
    return _sized_replicas(
        rate,
        backlog,
        sized_latency(config),
        replace(config.service, service_scv=config.slo_service_scv),
        config.min_replicas,
        config.max_replicas,
        quantile,
    )


@functools.lru_cache(maxsize=65536)
def _sized_replicas(
    rate: float,
    backlog: int,
    slo: float,
    service: ServiceModel,
    low: int,
    high: int,
    quantile: float,
) -> int:
    # A replay asks for the same measured rates (whole requests per window) over and over.
    sizing = replicas_for_slo(
        rate,
        slo,
        service,
        min_replicas=low,
        max_replicas=high,
        quantile=quantile,
        backlog_requests=float(backlog),
    )
    return sizing.replicas


def recent_online_p99(fleet: Fleet, now: float, window: float) -> float | None:
    """p99 latency of the online requests that arrived in the last ``window`` seconds; one still
    waiting or in service counts with its age so far (its latency is at least that)."""
    arrivals = fleet.arrivals
    lo = np.searchsorted(arrivals, now - window, side="right")
    hi = np.searchsorted(arrivals, now, side="right")
    if hi <= lo:
        return None
    finished = fleet.finished[lo:hi]
    done = np.isfinite(finished) & (finished <= now)
    latency = np.where(done, finished, now) - arrivals[lo:hi]
    return float(np.percentile(latency, 99))
