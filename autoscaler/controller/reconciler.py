"""One reconcile of one autoscaler: read the inputs, decide, scale (or only log), report.

The same step serves a Deployment in a cluster and worker processes on a laptop, because the
target, the metrics and the forecasts come in behind small interfaces. The decision is the pure
core's; this module only does the I/O around it and keeps the safety rules at the boundary:

* an input that cannot be read (Prometheus down, an API error, a NaN) becomes an invalid metric,
  which the core never lets shrink the fleet; it is counted by kind and shows in the conditions;
* when the target cannot be read, nothing is decided and ``AbleToScale`` turns false;
* the scale is written with the version the decision read; when someone changed it in between,
  the decision (and its recommendation) is dropped, reported as ``ScaleConflict`` and made
  again from the new count on the next reconcile, never replayed;
* with ``spec.slo`` the rate, its forecast and the batchers' service model are read too; when
  they are missing the metrics decide and ``SizedForSLO`` says why;
* with ``dry_run`` the decision is logged, reported in status and events, and never applied;
* ``may_act`` (the leader check) is asked right before the scale is written, so a replica that
  lost its lease mid-reconcile does not act on it.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from autoscaler.controller.forecasts import ForecastSource
from autoscaler.controller.kube import KubeError
from autoscaler.controller.metrics_source import MetricsSource
from autoscaler.controller.service_model import ServiceModelSource, ServiceModelUnavailable
from autoscaler.core import Decision, MetricInput, ScalingState, decide, record_scale
from autoscaler.core.decision import (
    DOWNSCALE_STABILIZATION_SECONDS,
    SLO_CONDITION,
    SloInput,
    SloOutcome,
)
from autoscaler.core.replica_calculator import DEFAULT_READINESS, PodSample, ReadinessTimes
from autoscaler.metrics import AutoscalerMetrics, nan_if_none
from autoscaler.scale_target import ScaleTarget
from autoscaler.spec import GPUAutoscalerSpec, MetricSpec

log = logging.getLogger(__name__)

BUDGET_CONDITION = "BudgetLimited"
CONDITION_TYPES = (
    "AbleToScale",
    "ScalingActive",
    "ScalingLimited",
    SLO_CONDITION,
    BUDGET_CONDITION,
)
# Which rule sized the fleet: the SLO, the metrics because the SLO's inputs are missing, or the
# metrics because the spec has no SLO.
SIZING_MODES = ("slo", "hpa_fallback", "hpa")

# (type, reason, message) -> recorded as a core/v1 Event on the autoscaler
Notify = Callable[[str, str, str], None]


@dataclass(frozen=True)
class Admission:
    """What the budget lets one autoscaler have now; ``reason`` is set when it was cut."""

    replicas: int
    reason: str | None
    message: str


class BudgetGate(Protocol):
    """The GPU budgets' say on one decision (autoscaler/controller/budget.py); None: ungoverned."""

    def admit(
        self, name: str, state: ScalingState, current: int, desired: int, now: float
    ) -> Admission | None: ...


@dataclass
class ReconcileResult:
    """What one reconcile did, and the ``status`` to write on the autoscaler."""

    status: dict[str, Any]
    decision: Decision | None = None
    scaled: bool = False
    errors: list[str] = field(default_factory=list)


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Reconciler:
    """Decides and acts for any number of autoscalers; holds no per-autoscaler state itself."""

    def __init__(
        self,
        metrics_source: MetricsSource,
        forecasts: ForecastSource | None,
        self_metrics: AutoscalerMetrics,
        *,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
        may_act: Callable[[], bool] = lambda: True,
        readiness: ReadinessTimes = DEFAULT_READINESS,
        downscale_stabilization: float = DOWNSCALE_STABILIZATION_SECONDS,
        service_models: ServiceModelSource | None = None,
    ) -> None:
        self.service_models = service_models
        self.readiness = readiness
        self.downscale_stabilization = downscale_stabilization
        self.metrics_source = metrics_source
        self.forecasts = forecasts
        self.m = self_metrics
        self.dry_run = dry_run
        self.clock = clock
        self.may_act = may_act
        self.budget: BudgetGate | None = None
        # Per autoscaler, the (current, desired, driver) last logged at info: a decision that
        # repeats it (every tick of a steady load) goes to debug.
        self._last_decision: dict[tuple[str, str], tuple[int, int, str]] = {}

    def reconcile(
        self,
        namespace: str,
        name: str,
        spec: GPUAutoscalerSpec,
        target: ScaleTarget,
        state: ScalingState,
        previous_status: Mapping[str, Any],
        notify: Notify,
    ) -> ReconcileResult:
        started = time.perf_counter()
        labels = (namespace, name)
        try:
            return self._reconcile(labels, spec, target, state, previous_status, notify)
        finally:
            self.m.duration.labels(*labels).observe(time.perf_counter() - started)
            self.m.last_reconcile.labels(*labels).set(self.clock())

    def _reconcile(self, labels, spec, target, state, previous_status, notify) -> ReconcileResult:
        now = self.clock()
        count_error = self.m.error_counter(*labels)
        status: dict[str, Any] = {}
        conditions = _Conditions(previous_status.get("conditions"), now)
        if spec.slo is None:
            conditions.by_type.pop(SLO_CONDITION, None)  # the SLO was removed from the spec
        result = ReconcileResult(status)
        self.m.min.labels(*labels).set(spec.min_replicas)
        self.m.max.labels(*labels).set(spec.max_replicas)

        try:
            scale = target.get_scale()
        except (KubeError, OSError) as exc:
            count_error("get_scale")
            result.errors.append(str(exc))
            message = f"the HPA controller was unable to get the target's current scale: {exc}"
            if conditions.set("AbleToScale", False, "FailedGetScale", message):
                notify("Warning", "FailedGetScale", message)
            log.warning("cannot read the target's scale", extra=_ctx(labels, error=str(exc)))
            status["conditions"] = conditions.as_list()
            self._export_conditions(labels, conditions)
            return result
        current = scale.replicas

        pods: list[PodSample] | None = None
        # The HPA lists the pods for every metric that uses them: Pods metrics for their samples,
        # Value targets for the count of ready pods their ratio multiplies.
        if current > 0 and any(
            m.source == "Pods" or m.target_type == "Value" for m in spec.metrics
        ):
            try:
                pods = target.pods()
            except (KubeError, OSError) as exc:
                count_error("list_pods")
                result.errors.append(str(exc))
                log.warning("cannot list the target's pods", extra=_ctx(labels, error=str(exc)))
        inputs = [self._read(metric, pods, count_error) for metric in spec.metrics]
        result.errors.extend(i.error for i in inputs if i.error)
        slo_input = self._slo_input(spec, count_error) if spec.slo is not None else None

        # A decision made from a scale that changes before the write must leave no trace.
        snapshot = copy.deepcopy(state)
        decision = decide(
            spec,
            current,
            inputs,
            state,
            now,
            status_replicas=scale.status_replicas,
            pods=pods,
            readiness=self.readiness,
            downscale_stabilization=self.downscale_stabilization,
            slo=slo_input,
        )
        for ctype, (ok, reason, message) in decision.conditions.items():
            # ScalingLimited false is the normal state; the others false mean trouble, worth an
            # Event when they turn false or turn false for another reason.
            was = conditions.by_type.get(ctype, {}).get("reason")
            changed = conditions.set(ctype, ok, reason, message)
            if not ok and ctype != "ScalingLimited" and (changed or reason != was):
                notify("Warning", reason, message)
        if self.budget is not None:
            decision = self._apply_budget(labels[1], state, decision, conditions, now, notify)
        result.decision = decision

        desired = decision.desired_replicas
        direction = "up" if desired > current else "down" if desired < current else "none"
        self.m.decisions.labels(*labels, direction, decision.driver).inc()
        context = _ctx(
            labels,
            current=current,
            desired=desired,
            reactive=decision.reactive_proposal,
            predictive=decision.predictive_proposal,
            driver=decision.driver,
            reason=decision.reason,
            dry_run=self.dry_run,
        )
        if desired != current:
            if self.dry_run:
                log.info("dry run: would scale", extra=context)
                notify(
                    "Normal",
                    "DryRunRescale",
                    f"would scale from {current} to {desired} (dry run); driver: "
                    f"{decision.driver}; reason: {decision.reason}",
                )
            elif not self.may_act():
                log.warning("not the leader any more; not scaling", extra=context)
                result.errors.append("lost leadership before scaling")
                return result
            else:
                current = self._scale(
                    labels, target, state, snapshot, decision, conditions, status, result, notify
                )
        else:
            seen = (current, desired, decision.driver)
            steady = self._last_decision.get(labels) == seen
            self._last_decision[labels] = seen
            log.log(logging.DEBUG if steady else logging.INFO, "decision", extra=context)

        self.m.current.labels(*labels).set(current)
        self.m.desired.labels(*labels).set(desired)
        self.m.reactive.labels(*labels).set(nan_if_none(decision.reactive_proposal))
        self.m.predictive.labels(*labels).set(nan_if_none(decision.predictive_proposal))
        self._export_metrics(labels, spec, inputs, decision)
        self._export_slo(labels, spec, decision.slo)
        self._export_conditions(labels, conditions)

        status.update(
            currentReplicas=current,
            desiredReplicas=desired,
            conditions=conditions.as_list(),
            currentMetrics=_metric_statuses(spec, decision),
            lastDecision={
                "time": rfc3339(now),
                "currentReplicas": current,
                "desiredReplicas": desired,
                "reactiveProposal": decision.reactive_proposal,
                "predictiveProposal": decision.predictive_proposal,
                "driver": decision.driver,
                "reason": decision.reason,
                "dryRun": self.dry_run,
            },
        )
        # None removes what an earlier spec.slo left (the status is merge-patched).
        status["slo"] = _slo_status(decision.slo) if decision.slo is not None else None
        return result

    def _apply_budget(self, name, state, decision, conditions, now, notify) -> Decision:
        """Cap the decision at what the GPU budgets governing this autoscaler allow now."""
        assert self.budget is not None
        current, desired = decision.current_replicas, decision.desired_replicas
        admission = self.budget.admit(name, state, current, desired, now)
        if admission is None:
            conditions.by_type.pop(BUDGET_CONDITION, None)
            return decision
        limited = admission.reason is not None
        reason = admission.reason or "WithinBudget"
        if conditions.set(BUDGET_CONDITION, limited, reason, admission.message) and limited:
            notify("Warning", BUDGET_CONDITION, admission.message)
        if admission.replicas == desired:
            return decision
        return dataclasses.replace(
            decision,
            desired_replicas=admission.replicas,
            reason=f"{decision.reason}; GPU budget: {admission.reason}",
        )

    def _slo_input(self, spec: GPUAutoscalerSpec, count_error) -> SloInput:
        """The SLO's inputs: the rate (read and forecast like an External metric) and the
        service model; what is missing goes in ``error`` and the decision falls back."""
        assert spec.slo is not None
        reading = self._read(spec.slo.rate_metric, None, count_error)
        if reading.error is not None:
            return SloInput(error=f"request rate: {reading.error}")
        rate, upper = reading.value, reading.forecast_upper
        if self.service_models is None:
            return SloInput(rate, upper, error="this controller has no service model source")
        try:
            model = self.service_models.read(spec.slo)
            quantum = self.service_models.best_effort_quantum(spec.slo)
        except ServiceModelUnavailable as exc:
            count_error(exc.kind)
            return SloInput(rate, upper, error=f"service model: {exc.message}")
        return SloInput(rate, upper, model, best_effort_quantum_seconds=quantum)

    def _read(self, metric: MetricSpec, pods, count_error) -> MetricInput:
        reading = self.metrics_source.read(metric, pods, count_error)
        if self.forecasts is None or reading.error is not None:
            return reading
        upper = self.forecasts.upper(metric, count_error)
        if upper is None:
            return reading
        if metric.source == "Pods":
            upper = _per_pod(upper, reading.pods)
        return MetricInput(reading.spec, reading.pods, reading.value, upper, reading.error)

    def _scale(
        self, labels, target, state, snapshot, decision, conditions, status, result, notify
    ) -> int:
        """Write the decision; the target's replica count afterwards, as far as it is known."""
        current, desired = decision.current_replicas, decision.desired_replicas
        try:
            target.set_replicas(desired)
        except KubeError as exc:
            if exc.conflict:
                return self._conflict(labels, target, state, snapshot, decision, conditions, notify)
            self._failed_scale(labels, decision, conditions, result, notify, exc)
            return current
        except (OSError, ValueError) as exc:
            self._failed_scale(labels, decision, conditions, result, notify, exc)
            return current
        now = self.clock()
        record_scale(state, now, current, desired)
        result.scaled = True
        status["lastScaleTime"] = rfc3339(now)
        conditions.set(
            "AbleToScale",
            True,
            "SucceededRescale",
            f"the HPA controller was able to update the target scale to {desired}",
        )
        self.m.scales.labels(*labels, "up" if desired > current else "down").inc()
        notify(
            "Normal",
            "SuccessfulRescale",
            f"New size: {desired}; reason: {decision.reason}; driver: {decision.driver}",
        )
        log.info(
            "scaled",
            extra=_ctx(labels, current=current, desired=desired, driver=decision.driver),
        )
        return desired

    def _failed_scale(self, labels, decision, conditions, result, notify, exc) -> None:
        desired = decision.desired_replicas
        self.m.error_counter(*labels)("update_scale")
        result.errors.append(str(exc))
        message = f"the HPA controller was unable to update the target scale: {exc}"
        conditions.set("AbleToScale", False, "FailedUpdateScale", message)
        notify(
            "Warning",
            "FailedRescale",
            f"New size: {desired}; reason: {decision.reason}; error: {exc}",
        )
        log.error("scaling failed", extra=_ctx(labels, desired=desired, error=str(exc)))

    def _conflict(self, labels, target, state, snapshot, decision, conditions, notify) -> int:
        """Someone else changed the scale after it was read: drop the decision entirely (its
        recommendation too) and let the next reconcile decide from the new count; never write
        the old number again."""
        state.restore(snapshot)
        self.m.conflicts.labels(*labels).inc()
        now_replicas = decision.current_replicas
        try:
            now_replicas = target.get_scale().replicas
        except (KubeError, OSError) as exc:
            log.warning(
                "cannot re-read the scale after a conflict", extra=_ctx(labels, error=str(exc))
            )
        message = (
            f"the target's scale changed after it was read ({decision.current_replicas} -> "
            f"{now_replicas} replicas) by another writer; the decision to scale to "
            f"{decision.desired_replicas} was made from stale data and was dropped; the next "
            "reconcile decides again"
        )
        conditions.set("AbleToScale", False, "ScaleConflict", message)
        notify("Warning", "ScaleConflict", message)
        log.warning("scale conflict; decision dropped", extra=_ctx(labels, now=now_replicas))
        return now_replicas

    def _export_metrics(self, labels, spec, inputs, decision) -> None:
        by_name = {o.name: o for o in decision.per_metric}
        for metric, reading in zip(spec.metrics, inputs, strict=True):
            outcome = by_name.get(metric.name)
            self.m.metric_target.labels(*labels, metric.name).set(metric.target_value)
            usage = outcome.usage if outcome else None
            self.m.metric_value.labels(*labels, metric.name).set(nan_if_none(usage))
            self.m.metric_forecast.labels(*labels, metric.name).set(
                nan_if_none(reading.forecast_upper)
            )

    def _export_slo(self, labels, spec: GPUAutoscalerSpec, slo: SloOutcome | None) -> None:
        mode = "hpa" if spec.slo is None else "hpa_fallback" if slo is None or slo.error else "slo"
        for each in SIZING_MODES:
            self.m.sizing_mode.labels(*labels, each).set(1 if each == mode else 0)
        latency = spec.slo.latency_seconds if spec.slo is not None else None
        self.m.slo_seconds.labels(*labels).set(nan_if_none(latency))
        sizing = slo.sizing if slo is not None else None
        self.m.modelled_p99.labels(*labels).set(
            nan_if_none(sizing.modelled_p99_seconds if sizing else None)
        )
        self.m.slo_proposal.labels(*labels).set(nan_if_none(slo.proposal if slo else None))
        self.m.slo_rate.labels(*labels).set(nan_if_none(slo.sizing_rate if slo else None))
        reserved = None
        if slo is not None and slo.sized_latency_seconds is not None:
            reserved = slo.latency_seconds - slo.sized_latency_seconds
        self.m.slo_best_effort_reserve.labels(*labels).set(nan_if_none(reserved))

    def _export_conditions(self, labels, conditions: _Conditions) -> None:
        for ctype, cond in conditions.by_type.items():
            self.m.condition.labels(*labels, ctype).set(1 if cond["status"] == "True" else 0)


def _per_pod(total: float, pods: Sequence[PodSample] | None) -> float | None:
    """A forecast of the fleet's total, as the per-pod average over the pods counted now."""
    counted = [
        p for p in pods or () if p.value is not None and not p.deleting and p.phase != "Failed"
    ]
    return total / len(counted) if counted else None


def _metric_statuses(spec: GPUAutoscalerSpec, decision: Decision) -> list[dict[str, Any]]:
    key = {"Utilization": "averageUtilization", "AverageValue": "averageValue", "Value": "value"}
    by_name = {o.name: o for o in decision.per_metric}
    out = []
    for metric in spec.metrics:
        outcome = by_name.get(metric.name)
        entry: dict[str, Any] = {"name": metric.name, "type": metric.source}
        if outcome is not None:
            if outcome.usage is not None:
                entry["current"] = {key[metric.target_type]: _number(outcome.usage)}
            entry["reactiveReplicas"] = outcome.reactive
            entry["predictiveReplicas"] = outcome.predictive
            if outcome.forecast_upper is not None:
                entry["forecastUpper"] = _number(outcome.forecast_upper)
            if outcome.error:
                entry["error"] = outcome.error[:512]
        out.append(entry)
    return out


def _slo_status(slo: SloOutcome) -> dict[str, Any]:
    """``status.slo``: the modelled latency, the service model in use (with the best-effort
    slice reserved out of the SLO, None when no best-effort work runs), the latency sized for
    and why that many replicas. Every key is always written (None removes it in the merge
    patch), so nothing from an earlier reconcile lingers."""
    model, sizing = slo.service_model, slo.sizing
    return {
        "mode": "hpa_fallback" if slo.error else "slo",
        "latencySeconds": slo.latency_seconds,
        "sizedLatencySeconds": slo.sized_latency_seconds,
        "quantile": slo.quantile,
        "objective": slo.objective,
        "sizingQuantile": slo.sizing_quantile,
        "rate": slo.rate,
        "forecastUpper": slo.forecast_upper,
        "sizingRate": slo.sizing_rate,
        "serviceModel": (
            {
                "fixedSeconds": model.fixed_seconds,
                "perItemSeconds": model.per_item_seconds,
                "maxBatch": model.max_batch,
                "serviceScv": model.service_scv,
                "bestEffortQuantumSeconds": slo.best_effort_quantum_seconds,
            }
            if model is not None
            else None
        ),
        "modelledP99Seconds": (
            sizing.modelled_p99_seconds
            if sizing is not None and math.isfinite(sizing.modelled_p99_seconds)
            else None
        ),
        "sizedReplicas": sizing.replicas if sizing is not None else None,
        "proposal": slo.proposal,
        "feasible": sizing.feasible if sizing is not None else None,
        "reason": (sizing.reason if sizing is not None else slo.error or "")[:1024],
    }


def _number(value: float) -> str:
    """As a Kubernetes quantity string, the way the HPA writes metric values."""
    return f"{value:.6g}" if abs(value) >= 1e-3 or value == 0 else f"{value * 1000:.6g}m"


def _ctx(labels: tuple[str, str], **fields: Any) -> dict[str, Any]:
    return {"namespace": labels[0], "autoscaler": labels[1], **fields}


class _Conditions:
    """The HPA's conditions, keeping ``lastTransitionTime`` when a status does not change."""

    def __init__(self, previous: Any, now: float) -> None:
        self.now = now
        self.by_type: dict[str, dict[str, str]] = {}
        for cond in previous or []:
            if isinstance(cond, Mapping) and cond.get("type") in CONDITION_TYPES:
                self.by_type[cond["type"]] = dict(cond)

    def set(self, ctype: str, ok: bool, reason: str, message: str) -> bool:
        """Set a condition; True when its status changed (or it is new)."""
        status = "True" if ok else "False"
        old = self.by_type.get(ctype)
        changed = old is None or old.get("status") != status
        self.by_type[ctype] = {
            "type": ctype,
            "status": status,
            "reason": reason,
            "message": message[:1024],
            "lastTransitionTime": rfc3339(self.now)
            if old is None or changed
            else old.get("lastTransitionTime", rfc3339(self.now)),
        }
        return changed

    def as_list(self) -> list[dict[str, str]]:
        return [self.by_type[t] for t in CONDITION_TYPES if t in self.by_type]
