"""Per-metric replica proposals, rule for rule as Kubernetes' ``replica_calculator.go``.

Each function answers: given one metric's reading and its target, how many replicas would bring
the metric to target? The rules that make the HPA trustworthy are kept exactly:

* a ratio within the tolerance (separately up and down) keeps the current count;
* pods being deleted or failed are ignored; pending pods count as unready;
* a pod without a sample is assumed to sit at the target (``max(100%, target)`` for a
  Utilization target) when the metric says scale down, and at 0 when it says scale up, so a gap in
  the data never exaggerates a change;
* unready pods are assumed at 0 when the metric says scale up (a warming replica must not inflate
  the load), and left out otherwise;
* after such substitutions the ratio is recomputed, and if it now lies within the tolerance or
  points the other way, or the resulting count would move against the direction, nothing changes.

Differences that come from the data model, not the algorithm: values are floats (no milli-unit
integer truncation), and the readiness rules that Kubernetes applies to the CPU resource metric
(initialization period, delay of initial readiness) apply here to Utilization targets, the GPU
analogue of CPU utilization. Pods metrics with AverageValue targets follow the custom-metric rules
(only pending pods are unready), as in Kubernetes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

# kube-controller-manager defaults: --horizontal-pod-autoscaler-cpu-initialization-period and
# --horizontal-pod-autoscaler-initial-readiness-delay.
INITIALIZATION_PERIOD_SECONDS = 300.0
INITIAL_READINESS_DELAY_SECONDS = 30.0

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]


class MetricUnavailable(Exception):
    """No proposal can be computed from this metric; ``reason`` is the HPA condition reason."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


@dataclass(frozen=True)
class Tolerances:
    """The dead band around a usage ratio of 1.0 within which nothing changes."""

    up: float = 0.1
    down: float = 0.1

    def within(self, usage_ratio: float) -> bool:
        return (1.0 - self.down) <= usage_ratio <= (1.0 + self.up)


@dataclass(frozen=True)
class PodSample:
    """One pod of the target and its sample of a Pods metric.

    ``value`` is None when the pod has no sample. ``ready`` is the pod's Ready condition (None when
    the pod has none yet), ``ready_changed_at`` that condition's last transition time,
    ``started_at`` the pod's start time, ``sampled_at`` and ``window_seconds`` the timestamp and
    averaging window of the sample (all unix seconds).
    """

    name: str
    value: float | None
    ready: bool | None = True
    phase: PodPhase = "Running"
    deleting: bool = False
    started_at: float | None = None
    ready_changed_at: float | None = None
    sampled_at: float | None = None
    window_seconds: float = 0.0


@dataclass(frozen=True)
class Proposal:
    """A replica count proposed by one metric and the usage it was computed from.

    ``usage`` is what the HPA writes in the metric's status: the average per pod for Pods metrics
    and per-pod targets, the value itself for Value targets.
    """

    replicas: int
    usage: float
    usage_ratio: float


@dataclass(frozen=True)
class PodGroups:
    ready_count: int
    unready: frozenset[str]
    missing: frozenset[str]
    ignored: frozenset[str]


def group_pods(
    pods: Sequence[PodSample],
    now: float,
    readiness_rules: bool,
    initialization_period: float = INITIALIZATION_PERIOD_SECONDS,
    initial_readiness_delay: float = INITIAL_READINESS_DELAY_SECONDS,
) -> PodGroups:
    """Sort pods into ready, unready, missing a sample, and ignored (``groupPods``)."""
    ready_count = 0
    unready: set[str] = set()
    missing: set[str] = set()
    ignored: set[str] = set()
    for pod in pods:
        if pod.deleting or pod.phase == "Failed":
            ignored.add(pod.name)
            continue
        if pod.phase == "Pending":
            unready.add(pod.name)
            continue
        if pod.value is None or math.isnan(pod.value):
            missing.add(pod.name)
            continue
        if readiness_rules and _unready(pod, now, initialization_period, initial_readiness_delay):
            unready.add(pod.name)
            continue
        ready_count += 1
    return PodGroups(ready_count, frozenset(unready), frozenset(missing), frozenset(ignored))


def _unready(pod: PodSample, now: float, init_period: float, readiness_delay: float) -> bool:
    if pod.ready is None or pod.started_at is None:
        return True
    changed = pod.ready_changed_at if pod.ready_changed_at is not None else pod.started_at
    if pod.started_at + init_period > now:
        # Still initialising: ignore the sample if the pod is unready or the sample's window
        # began before the pod last changed readiness.
        sampled = pod.sampled_at if pod.sampled_at is not None else now
        return (not pod.ready) or sampled < changed + pod.window_seconds
    # Past initialisation: ignore it only if it is unready and has never been ready.
    return (not pod.ready) and pod.started_at + readiness_delay > changed


def pods_metric_replicas(
    pods: Sequence[PodSample],
    current_replicas: int,
    target: float,
    tolerances: Tolerances,
    now: float,
    utilization: bool,
) -> Proposal:
    """Proposal for a Pods metric with an AverageValue (or Utilization) target.

    ``calcPlainMetricReplicas`` and ``GetResourceReplicas``: the usage is the average over pods
    with samples; ``utilization`` selects the resource-metric rules (readiness rules, and a
    missing pod counted at ``max(100, target)`` percent on scale-down).
    """
    if not pods:
        raise MetricUnavailable(
            "FailedGetPodsMetric", "no pods returned by selector while calculating replica count"
        )
    groups = group_pods(pods, now, readiness_rules=utilization)
    samples = {
        p.name: float(p.value)
        for p in pods
        if p.name not in groups.ignored | groups.unready | groups.missing
    }
    if not samples:
        raise MetricUnavailable(
            "FailedGetPodsMetric",
            "did not receive metrics for targeted pods (pods might be unready)",
        )
    usage_ratio, usage = _usage_ratio(samples.values(), target)

    scale_up_with_unready = bool(groups.unready) and usage_ratio > 1.0
    if not scale_up_with_unready and not groups.missing:
        if tolerances.within(usage_ratio):
            return Proposal(current_replicas, usage, usage_ratio)
        return Proposal(math.ceil(usage_ratio * groups.ready_count), usage, usage_ratio)

    if groups.missing:
        if usage_ratio < 1.0:
            fallback = max(100.0, target) if utilization else target
            samples.update(dict.fromkeys(groups.missing, fallback))
        elif usage_ratio > 1.0:
            samples.update(dict.fromkeys(groups.missing, 0.0))
    if scale_up_with_unready:
        samples.update(dict.fromkeys(groups.unready, 0.0))

    new_ratio, _ = _usage_ratio(samples.values(), target)
    if (
        tolerances.within(new_ratio)
        or (usage_ratio < 1.0 < new_ratio)
        or (usage_ratio > 1.0 > new_ratio)
    ):
        return Proposal(current_replicas, usage, usage_ratio)
    new_replicas = math.ceil(new_ratio * len(samples))
    if (new_ratio < 1.0 and new_replicas > current_replicas) or (
        new_ratio > 1.0 and new_replicas < current_replicas
    ):
        return Proposal(current_replicas, usage, usage_ratio)
    return Proposal(new_replicas, usage, usage_ratio)


def _usage_ratio(values: object, target: float) -> tuple[float, float]:
    values = list(values)  # type: ignore[call-overload]
    usage = sum(values) / len(values)
    return usage / target, usage


def value_metric_replicas(
    value: float, current_replicas: int, ready_pods: int, target: float, tolerances: Tolerances
) -> Proposal:
    """Object or External metric with a Value target (``getUsageRatioReplicaCount``).

    The count scales the *ready* pods by the ratio (none ready proposes 0, as in Kubernetes); at
    zero replicas the ratio alone decides, which is how a target at zero is woken up.
    """
    usage_ratio = value / target
    if current_replicas == 0:
        return Proposal(math.ceil(usage_ratio), value, usage_ratio)
    if tolerances.within(usage_ratio):
        return Proposal(current_replicas, value, usage_ratio)
    return Proposal(math.ceil(usage_ratio * ready_pods), value, usage_ratio)


def average_value_metric_replicas(
    value: float, status_replicas: int, target: float, tolerances: Tolerances
) -> Proposal:
    """Object or External metric with an AverageValue (per-pod) target.

    ``GetObjectPerPodMetricReplicas``: the total is divided by the target; the ratio that the
    tolerance sees is taken against the replicas the target currently reports.
    """
    if status_replicas <= 0:
        usage_ratio = math.inf if value > 0 else 0.0
        return Proposal(math.ceil(value / target), value, usage_ratio)
    usage_ratio = value / (target * status_replicas)
    replicas = status_replicas
    if not tolerances.within(usage_ratio):
        replicas = math.ceil(value / target)
    return Proposal(replicas, value / status_replicas, usage_ratio)
