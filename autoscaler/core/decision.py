"""One autoscaling decision: the HPA's reconcile step plus a predictive candidate.

``decide`` follows ``reconcileAutoscaler`` and ``computeReplicasForMetrics``: a target scaled to
zero by hand is left alone; a count outside [min, max] is brought back inside; otherwise every
metric proposes a count, the largest wins, nothing scales down while any metric is unreadable
(nothing scales at all if none is readable), and the behavior rules (stabilization, policies,
min/max) turn the proposal into the desired count.

The predictive candidate adds one thing: for a metric with prediction enabled, the forecast's
upper bound at a horizon no shorter than a replica's warm-up goes through the same per-metric
maths as the live reading, and the metric's proposal is the larger of the two. Stabilization and
policies then treat it like any other proposal, so prediction can order replicas early but can
never make the autoscaler scale down faster than the HPA would.

Every decision names its ``driver``: the input that determined the desired count.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from autoscaler.core.behavior import (
    ScalingState,
    forget_outdated,
    limit_rate,
    limit_rate_legacy,
    record_initial_recommendation,
    stabilize,
    stabilize_legacy,
    with_downscale_window,
)
from autoscaler.core.replica_calculator import (
    DEFAULT_READINESS,
    MetricUnavailable,
    PodSample,
    Proposal,
    ReadinessTimes,
    Tolerances,
    average_value_metric_replicas,
    count_ready,
    pods_metric_replicas,
    resource_utilization_replicas,
    value_metric_replicas,
)
from autoscaler.core.slo_objective import sizing_quantile_for_objective
from autoscaler.core.slo_sizing import (
    ServiceModel,
    SloSizing,
    replicas_for_slo,
    slo_less_best_effort_slice,
)
from autoscaler.core.spec import GPUAutoscalerSpec, MetricSpec

Condition = tuple[bool, str, str]  # (status, reason, message) as the HPA writes a condition

DRIVER_SCALED_TO_ZERO = "scaled_to_zero_by_hand"
DRIVER_MIN_REPLICAS = "min_replicas"
DRIVER_MAX_REPLICAS = "max_replicas"
DRIVER_INVALID_METRICS = "invalid_metrics_no_scale_down"
DRIVER_ALL_INVALID = "all_metrics_invalid"
DRIVER_STABILIZATION = "stabilization"
DRIVER_SCALE_UP_LIMIT = "policy:scale_up_limit"
DRIVER_SCALE_DOWN_LIMIT = "policy:scale_down_limit"
DRIVER_SLO = "slo"

# The condition that says whether the fleet is sized for spec.slo, and why not.
SLO_CONDITION = "SizedForSLO"

# kube-controller-manager's --horizontal-pod-autoscaler-downscale-stabilization default: the
# scale-down window when the spec has no behavior or leaves the window unset.
DOWNSCALE_STABILIZATION_SECONDS = 300.0

_FAILED_REASON = {
    "Pods": "FailedGetPodsMetric",
    "Object": "FailedGetObjectMetric",
    "External": "FailedGetExternalMetric",
}


@dataclass(frozen=True)
class MetricInput:
    """What was read for one metric of the spec.

    * ``pods``: the target's pods with their samples (Pods metrics; also used to count ready pods).
    * ``value``: the query's value (Object/External metrics; for an AverageValue target, the total).
    * ``forecast_upper``: the forecast's upper bound, in the same units as the live reading: the
      per-pod average for Pods metrics (forecast of the total divided by the pods counted now),
      the value for Object/External metrics. None when there is no forecast.
    * ``error``: why the metric could not be read (Prometheus down, NaN, no series); the metric is
      then invalid and blocks any scale-down.
    """

    spec: MetricSpec
    pods: tuple[PodSample, ...] | None = None
    value: float | None = None
    forecast_upper: float | None = None
    error: str | None = None


@dataclass(frozen=True)
class MetricOutcome:
    """One metric's part in a decision, for status, logs and metrics."""

    name: str
    reactive: int | None
    predictive: int | None
    usage: float | None
    forecast_upper: float | None
    error: str | None = None


@dataclass(frozen=True)
class SloInput:
    """What was read for ``spec.slo``: the online request rate (and its forecast's upper bound),
    and the batcher's service model. ``error`` says why sizing is not possible this time (no
    service model yet, Prometheus down); the decision then falls back to the metrics.
    ``best_effort_quantum_seconds`` is the longest best-effort slice an online request may wait
    for (None: no best-effort work runs), reserved out of the SLO."""

    rate: float | None = None
    forecast_upper: float | None = None
    service_model: ServiceModel | None = None
    error: str | None = None
    best_effort_quantum_seconds: float | None = None


@dataclass(frozen=True)
class SloOutcome:
    """How the SLO sized the fleet (``sizing``), or why it could not (``error``)."""

    latency_seconds: float
    quantile: float
    rate: float | None
    forecast_upper: float | None
    service_model: ServiceModel | None
    sizing: SloSizing | None = None
    proposal: int | None = None  # after the tolerance, as an AverageValue of one per replica
    error: str | None = None
    best_effort_quantum_seconds: float | None = None
    sized_latency_seconds: float | None = None  # the SLO less the best-effort slice, as sized
    objective: float | None = None  # share of windows whose ``quantile`` must hold
    # the per-request quantile sized for: ``quantile``, or derived from ``objective``
    sizing_quantile: float | None = None

    @property
    def sizing_rate(self) -> float | None:
        """The rate sized for: the observed one or the forecast's upper bound, the larger."""
        if self.rate is None:
            return None
        return max(self.rate, self.forecast_upper or 0.0)


@dataclass(frozen=True)
class Decision:
    current_replicas: int
    desired_replicas: int
    reactive_proposal: int | None
    predictive_proposal: int | None
    driver: str
    reason: str
    per_metric: tuple[MetricOutcome, ...]
    conditions: dict[str, Condition]
    slo: SloOutcome | None = None

    @property
    def rescale(self) -> bool:
        return self.desired_replicas != self.current_replicas


def decide(
    spec: GPUAutoscalerSpec,
    current_replicas: int,
    inputs: Sequence[MetricInput],
    state: ScalingState,
    now: float,
    *,
    status_replicas: int | None = None,
    pods: Sequence[PodSample] | None = None,
    readiness: ReadinessTimes = DEFAULT_READINESS,
    downscale_stabilization: float = DOWNSCALE_STABILIZATION_SECONDS,
    slo: SloInput | None = None,
) -> Decision:
    """Decide the desired replica count and record the recommendation in ``state``.

    ``current_replicas`` is the scale's spec.replicas; ``status_replicas`` (default: the same) is
    what per-pod Object/External targets divide by; ``pods`` are the target's pods as listed
    (default: those of any Pods input), whose Running and Ready ones Value targets multiply, as
    the HPA counts them for every metric type. ``readiness`` and ``downscale_stabilization`` are
    the kube-controller-manager flags of the same names, with the same defaults.

    With ``spec.slo``, ``slo`` carries its inputs: when they allow sizing, the SLO's proposal
    replaces the metrics' (it is sized for the larger of the observed rate and the forecast's
    upper bound, then passes the tolerance as an AverageValue target of one replica per
    replica); otherwise the metrics decide as the HPA rule and the ``SizedForSLO`` condition
    says why. Stabilization, policies and min/max apply either way.
    After a successful scale the caller must call :func:`record_scale`.
    """
    record_initial_recommendation(state, current_replicas, now)
    if current_replicas == 0 and spec.min_replicas != 0:
        return Decision(
            current_replicas,
            0,
            None,
            None,
            DRIVER_SCALED_TO_ZERO,
            "scaling is disabled since the replica count of the target is zero",
            (),
            {
                "ScalingActive": (
                    False,
                    "ScalingDisabled",
                    "scaling is disabled since the replica count of the target is zero",
                )
            },
        )
    if current_replicas > spec.max_replicas:
        return _out_of_range(
            current_replicas,
            spec.max_replicas,
            DRIVER_MAX_REPLICAS,
            "Current number of replicas above Spec.MaxReplicas",
        )
    if current_replicas < spec.min_replicas:
        return _out_of_range(
            current_replicas,
            spec.min_replicas,
            DRIVER_MIN_REPLICAS,
            "Current number of replicas below Spec.MinReplicas",
        )

    by_name = {i.spec.name: i for i in inputs}
    tolerances = Tolerances(up=spec.tolerance_up, down=spec.tolerance_down)
    listed = pods if pods is not None else _listed_pods(inputs)
    counts = _PodCounts(
        current=current_replicas,
        status=current_replicas if status_replicas is None else status_replicas,
        ready=count_ready(listed) if listed else None,
        readiness=readiness,
    )
    outcomes: list[MetricOutcome] = []
    best: tuple[int, str] | None = None
    reactive_best: int | None = None
    predictive_best: int | None = None
    first_error: Condition | None = None
    invalid = 0
    for metric in spec.metrics:
        reading = by_name.get(metric.name) or MetricInput(metric, error="no input for this metric")
        try:
            live = _proposal(metric, reading, tolerances, counts, now)
        except MetricUnavailable as exc:
            invalid += 1
            if first_error is None:
                first_error = (
                    False,
                    exc.reason,
                    f"the HPA was unable to compute the replica "
                    f"count: {metric.name}: {exc.message}",
                )
            outcomes.append(
                MetricOutcome(metric.name, None, None, None, reading.forecast_upper, exc.message)
            )
            continue
        predicted = None
        if (
            metric.prediction is not None
            and metric.prediction.enabled
            and reading.forecast_upper is not None
        ):
            try:
                predicted = _proposal(
                    metric, reading, tolerances, counts, now, forecast=reading.forecast_upper
                )
            except MetricUnavailable:
                predicted = None
        outcomes.append(
            MetricOutcome(
                metric.name,
                live.replicas,
                predicted.replicas if predicted else None,
                live.usage,
                reading.forecast_upper,
            )
        )
        reactive_best = (
            live.replicas if reactive_best is None else max(reactive_best, live.replicas)
        )
        candidates = [(live.replicas, f"metric:{metric.name}/reactive")]
        if predicted is not None:
            predictive_best = (
                predicted.replicas
                if predictive_best is None
                else max(predictive_best, predicted.replicas)
            )
            candidates.append((predicted.replicas, f"metric:{metric.name}/predictive"))
        for replicas, driver in candidates:
            if best is None or replicas > best[0]:
                best = (replicas, driver)

    slo_outcome = None
    if spec.slo is not None:
        slo_outcome = _size_for_slo(
            spec, slo or SloInput(error="no SLO inputs were read"), counts, tolerances
        )
        if slo_outcome.proposal is not None:
            best, invalid = (slo_outcome.proposal, DRIVER_SLO), 0
        elif first_error is None and best is None:
            first_error = (False, "FailedGetSLOInputs", slo_outcome.error or "")
    if best is None or (invalid > 0 and best[0] < current_replicas):
        assert first_error is not None
        message = (
            f"invalid metrics ({invalid} invalid out of {len(spec.metrics)}), "
            f"first error is: {first_error[2]}"
        )
        return Decision(
            current_replicas,
            current_replicas,
            reactive_best,
            predictive_best,
            DRIVER_ALL_INVALID if best is None else DRIVER_INVALID_METRICS,
            message,
            tuple(outcomes),
            {"ScalingActive": first_error, **_slo_condition(slo_outcome)},
            slo_outcome,
        )

    proposal, driver = best
    conditions: dict[str, Condition] = {
        "ScalingActive": (
            True,
            "ValidMetricFound",
            f"the HPA was able to successfully calculate a replica count from {driver}",
        ),
        **_slo_condition(slo_outcome),
    }
    if spec.behavior is None:
        stabilized = stabilize_legacy(state, downscale_stabilization, proposal, now)
    else:
        behavior = with_downscale_window(spec.behavior, downscale_stabilization)
        forget_outdated(state, behavior, now)
        stabilized = stabilize(state, behavior, current_replicas, proposal, now)
    if stabilized.replicas != proposal:
        conditions["AbleToScale"] = (True, stabilized.reason, stabilized.message)
        driver = DRIVER_STABILIZATION
    else:
        conditions["AbleToScale"] = (
            True,
            "ReadyForNewScale",
            "recommended size matches current size",
        )
    if spec.behavior is None:
        limited = limit_rate_legacy(
            spec.min_replicas, spec.max_replicas, current_replicas, stabilized.replicas
        )
    else:
        limited = limit_rate(
            state,
            behavior,
            spec.min_replicas,
            spec.max_replicas,
            current_replicas,
            stabilized.replicas,
            now,
        )
    conditions["ScalingLimited"] = (limited.limited, limited.reason, limited.message)
    if limited.limited:
        driver = _LIMIT_DRIVER[limited.reason]
    desired = limited.replicas
    if best[1] == DRIVER_SLO:
        assert slo_outcome is not None and slo_outcome.sizing is not None
        reason = slo_outcome.sizing.reason
    elif desired > current_replicas:
        reason = f"{best[1]} above target"
    elif desired < current_replicas:
        reason = "All metrics below target"
    else:
        reason = "no change"
    return Decision(
        current_replicas,
        desired,
        reactive_best,
        predictive_best,
        driver,
        reason,
        tuple(outcomes),
        conditions,
        slo_outcome,
    )


def _size_for_slo(
    spec: GPUAutoscalerSpec, slo: SloInput, counts: _PodCounts, tolerances: Tolerances
) -> SloOutcome:
    assert spec.slo is not None
    outcome = SloOutcome(
        spec.slo.latency_seconds,
        spec.slo.quantile,
        slo.rate,
        slo.forecast_upper,
        slo.service_model,
        best_effort_quantum_seconds=slo.best_effort_quantum_seconds,
        objective=spec.slo.objective,
    )
    if slo.error is not None or slo.rate is None or slo.service_model is None:
        missing = "no request rate" if slo.rate is None else "no service model"
        return replace(outcome, error=slo.error or missing)
    rate = outcome.sizing_rate
    assert rate is not None
    quantum = slo.best_effort_quantum_seconds
    try:
        latency = slo_less_best_effort_slice(spec.slo.latency_seconds, quantum)
        quantile = spec.slo.quantile
        if spec.slo.objective is not None:
            quantile = sizing_quantile_for_objective(
                rate, quantile, spec.slo.objective, spec.slo.objective_window_seconds
            )
        sizing = replicas_for_slo(
            rate,
            latency,
            slo.service_model,
            min_replicas=max(1, spec.min_replicas),
            max_replicas=spec.max_replicas,
            quantile=quantile,
        )
    except ValueError as exc:  # a rate the model cannot take, a slice longer than the SLO
        return replace(outcome, error=str(exc))
    if quantum is not None:
        sizing = replace(
            sizing,
            reason=f"{sizing.reason} ({quantum:.3g} s of the {spec.slo.latency_seconds:g} s "
            "SLO reserved for a best-effort slice)",
        )
    # The sized count is one more proposal: an AverageValue of one replica per replica, so the
    # tolerance holds back changes as small as it would for any metric.
    proposal = average_value_metric_replicas(float(sizing.replicas), counts.status, 1.0, tolerances)
    return replace(
        outcome,
        sizing=sizing,
        proposal=proposal.replicas,
        sized_latency_seconds=latency,
        sizing_quantile=quantile,
    )


def _slo_condition(outcome: SloOutcome | None) -> dict[str, Condition]:
    if outcome is None:
        return {}
    if outcome.error is not None:
        return {
            SLO_CONDITION: (
                False,
                "FallbackToHPARule",
                f"cannot size for the latency SLO ({outcome.error}); the metrics decide as the "
                "HPA rule until the SLO inputs are back",
            )
        }
    assert outcome.sizing is not None
    if not outcome.sizing.feasible:
        return {SLO_CONDITION: (False, "SLOOutOfReach", outcome.sizing.reason)}
    return {SLO_CONDITION: (True, "SizedForSLO", outcome.sizing.reason)}


_LIMIT_DRIVER = {
    "ScaleUpLimit": DRIVER_SCALE_UP_LIMIT,
    "ScaleDownLimit": DRIVER_SCALE_DOWN_LIMIT,
    "TooManyReplicas": DRIVER_MAX_REPLICAS,
    "TooFewReplicas": DRIVER_MIN_REPLICAS,
}


@dataclass(frozen=True)
class _PodCounts:
    current: int
    status: int
    ready: int | None  # None: no pods listed, so Value targets cannot scale from a ratio
    readiness: ReadinessTimes


def _out_of_range(current: int, desired: int, driver: str, reason: str) -> Decision:
    return Decision(current, desired, None, None, driver, reason, (), {})


def _listed_pods(inputs: Sequence[MetricInput]) -> Sequence[PodSample] | None:
    for reading in inputs:
        if reading.pods is not None:
            return reading.pods
    return None


def _proposal(
    metric: MetricSpec,
    reading: MetricInput,
    tolerances: Tolerances,
    counts: _PodCounts,
    now: float,
    forecast: float | None = None,
) -> Proposal:
    """The per-metric maths for the live reading of ``metric``, or for ``forecast`` if given."""
    if reading.error is not None:
        raise MetricUnavailable(_failed_reason(metric), reading.error)
    if metric.source == "Pods":
        if reading.pods is None:
            raise MetricUnavailable(_failed_reason(metric), "no pod samples were read")
        pods = reading.pods
        if forecast is not None:
            # Every pod that has a sample is assumed to run at the forecast level.
            pods = tuple(p if p.value is None else replace(p, value=forecast) for p in pods)
        if metric.target_type == "Utilization":
            return resource_utilization_replicas(
                pods,
                counts.current,
                metric.target_value,
                metric.resource,
                tolerances,
                now,
                container=metric.container,
                readiness=counts.readiness,
            )
        return pods_metric_replicas(pods, counts.current, metric.target_value, tolerances, now)
    value = reading.value if forecast is None else forecast
    if value is None or math.isnan(value):
        raise MetricUnavailable(_failed_reason(metric), "the query returned no number")
    if metric.target_type == "Value":
        try:
            return value_metric_replicas(
                value, counts.current, metric.target_value, tolerances, counts.ready
            )
        except MetricUnavailable as exc:
            raise MetricUnavailable(_failed_reason(metric), exc.message) from exc
    return average_value_metric_replicas(value, counts.status, metric.target_value, tolerances)


def _failed_reason(metric: MetricSpec) -> str:
    """The HPA's condition reason for a metric that cannot be computed."""
    if metric.target_type == "Utilization":
        return "FailedGetResourceMetric"
    return _FAILED_REASON[metric.source]
