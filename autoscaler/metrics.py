"""The autoscaler's own metrics (``autoglm_autoscaler_*``), for its dashboard and alerts.

Per autoscaler (labels ``namespace`` and ``autoscaler``): replicas (current, desired, min, max,
and the reactive and predictive proposals), each metric's observed value, forecast upper bound
and target, the HPA conditions, decisions by direction and driver, scale events, errors by kind
and the reconcile duration. Controller-wide: whether this replica is the leader.
"""

from __future__ import annotations

import math

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_AS = ("namespace", "autoscaler")


class AutoscalerMetrics:
    """All self-metrics on one registry (a fresh one per controller, so tests do not collide)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.current = Gauge(
            "autoglm_autoscaler_current_replicas", "Replicas of the target now.", _AS, registry=r
        )
        self.desired = Gauge(
            "autoglm_autoscaler_desired_replicas",
            "Replicas the last decision asked for (after behavior and limits).",
            _AS,
            registry=r,
        )
        self.min = Gauge("autoglm_autoscaler_min_replicas", "spec.minReplicas.", _AS, registry=r)
        self.max = Gauge("autoglm_autoscaler_max_replicas", "spec.maxReplicas.", _AS, registry=r)
        self.reactive = Gauge(
            "autoglm_autoscaler_reactive_proposal_replicas",
            "Replicas the observed metrics alone propose (the HPA's answer); NaN when none.",
            _AS,
            registry=r,
        )
        self.predictive = Gauge(
            "autoglm_autoscaler_predictive_proposal_replicas",
            "Replicas the forecasts propose; NaN when no forecast is available.",
            _AS,
            registry=r,
        )
        self.metric_value = Gauge(
            "autoglm_autoscaler_metric_value",
            "Observed value of a metric (per-pod average for Pods metrics).",
            (*_AS, "metric"),
            registry=r,
        )
        self.metric_forecast = Gauge(
            "autoglm_autoscaler_metric_forecast_upper",
            "Forecast upper bound of a metric at its prediction horizon; NaN when none.",
            (*_AS, "metric"),
            registry=r,
        )
        self.metric_target = Gauge(
            "autoglm_autoscaler_metric_target",
            "Target value of a metric (percent for Utilization targets).",
            (*_AS, "metric"),
            registry=r,
        )
        self.slo_seconds = Gauge(
            "autoglm_autoscaler_slo_seconds",
            "spec.slo.latencySeconds, the latency SLO the fleet is sized for; NaN without one.",
            _AS,
            registry=r,
        )
        self.modelled_p99 = Gauge(
            "autoglm_autoscaler_modelled_p99_seconds",
            "Modelled latency at spec.slo.quantile (p99 by default) with the replicas the SLO "
            "sizing chose, at the rate it sized for; NaN when not sized, +Inf when no count "
            "keeps up.",
            _AS,
            registry=r,
        )
        self.slo_proposal = Gauge(
            "autoglm_autoscaler_slo_proposal_replicas",
            "Replicas the SLO sizing proposes (after the tolerance); NaN when not sized.",
            _AS,
            registry=r,
        )
        self.slo_rate = Gauge(
            "autoglm_autoscaler_slo_sizing_rate_requests_per_second",
            "Request rate the SLO sizing used: the observed one or the forecast's upper bound, "
            "the larger; NaN when not sized.",
            _AS,
            registry=r,
        )
        self.slo_best_effort_reserve = Gauge(
            "autoglm_autoscaler_slo_best_effort_reserve_seconds",
            "Seconds of the latency SLO the sizing left for a best-effort slice an online "
            "request may wait for (the longest batcher quantum while best-effort work runs); "
            "0 when nothing is reserved, NaN when not sized.",
            _AS,
            registry=r,
        )
        self.sizing_mode = Gauge(
            "autoglm_autoscaler_sizing_mode",
            "1 for the rule that sized the fleet at the last reconcile: slo, hpa_fallback (the "
            "SLO's inputs are missing) or hpa (no spec.slo); 0 for the others.",
            (*_AS, "mode"),
            registry=r,
        )
        self.condition = Gauge(
            "autoglm_autoscaler_condition",
            "Condition status (1 true, 0 false): AbleToScale, ScalingActive, ScalingLimited, "
            "SizedForSLO.",
            (*_AS, "condition"),
            registry=r,
        )
        self.decisions = Counter(
            "autoglm_autoscaler_decisions_total",
            "Decisions by direction (up, down, none) and the input that drove them.",
            (*_AS, "direction", "driver"),
            registry=r,
        )
        self.scales = Counter(
            "autoglm_autoscaler_scale_events_total",
            "Successful changes of the target's replicas, by direction.",
            (*_AS, "direction"),
            registry=r,
        )
        self.conflicts = Counter(
            "autoglm_autoscaler_scale_conflicts_total",
            "Scale writes refused with 409 because another writer changed the scale after it "
            "was read; each drops its decision and decides again on the next reconcile.",
            _AS,
            registry=r,
        )
        self.errors = Counter(
            "autoglm_autoscaler_errors_total",
            "Errors by kind (prometheus_unreachable, metric_nan, get_scale, update_scale, ...).",
            (*_AS, "kind"),
            registry=r,
        )
        self.duration = Histogram(
            "autoglm_autoscaler_reconcile_duration_seconds",
            "Time one reconcile of one autoscaler took.",
            _AS,
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
            registry=r,
        )
        self.last_reconcile = Gauge(
            "autoglm_autoscaler_last_reconcile_timestamp_seconds",
            "Unix time of the last completed reconcile.",
            _AS,
            registry=r,
        )
        self.leader = Gauge(
            "autoglm_autoscaler_leader",
            "1 while this controller replica holds the leader lease (or runs without election).",
            registry=r,
        )

    def error_counter(self, namespace: str, autoscaler: str):
        """A ``count_error(kind)`` callable bound to one autoscaler."""
        return lambda kind: self.errors.labels(namespace, autoscaler, kind).inc()


def nan_if_none(value: float | None) -> float:
    return math.nan if value is None else float(value)
