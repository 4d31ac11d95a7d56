"""Per-metric replica proposals, rule for rule as Kubernetes' ``replica_calculator.go``.

Each function answers: given one metric's reading and its target, how many replicas would bring
the metric to target? The rules that make the HPA trustworthy are kept exactly:

* a ratio within the tolerance (separately up and down) keeps the current count;
* pods being deleted or failed are ignored; pending pods count as unready;
* a pod without a sample is assumed to sit at the target (``max(100%, target)`` of its request
  for a Utilization target) when the metric says scale down, and at 0 when it says scale up, so a
  gap in the data never exaggerates a change;
* unready pods are assumed at 0 when the metric says scale up (a warming replica must not inflate
  the load), and left out otherwise;
* after such substitutions the ratio is recomputed, and if it now lies within the tolerance or
  points the other way, or the resulting count would move against the direction, nothing changes;
* a Utilization is the pods' summed usage over their summed requests, in whole percent, and every
  pod must request the resource; Value targets multiply the pods that are Running and Ready;
* every count is capped at the largest int32, the type of replica counts in the Kubernetes API.

Differences that come from the data model, not the algorithm: values are floats (no milli-unit
integer truncation except the whole-percent utilization), and the readiness rules that Kubernetes
applies to the CPU resource (initialization period, delay of initial readiness) apply here to
Utilization targets, the GPU analogue of CPU utilization. A Utilization query reports each pod's
utilization in percent of its request (as DCGM reports GPU utilization); the pod's usage is that
share of its request, so the sum-over-sum is the request-weighted mean of the pods' percentages.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

# Replica counts are int32 in the Kubernetes API; the HPA caps every proposal there.
MAX_REPLICAS = 2**31 - 1

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
class ReadinessTimes:
    """When a young pod's sample is trusted (the two kube-controller-manager flags)."""

    initialization_period: float = INITIALIZATION_PERIOD_SECONDS
    initial_readiness_delay: float = INITIAL_READINESS_DELAY_SECONDS


DEFAULT_READINESS = ReadinessTimes()


@dataclass(frozen=True)
class PodSample:
    """One pod of the target and its sample of a Pods metric.

    ``value`` is None when the pod has no sample. ``ready`` is the pod's Ready condition (None when
    the pod has none yet), ``ready_changed_at`` that condition's last transition time,
    ``started_at`` the pod's start time, ``sampled_at`` and ``window_seconds`` the timestamp and
    averaging window of the sample (all unix seconds). ``containers`` maps each container's name
    to its resource requests (resource name -> amount), which Utilization targets divide by.
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
    containers: Mapping[str, Mapping[str, float]] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Proposal:
    """A replica count proposed by one metric and the usage it was computed from.

    ``usage`` is what the HPA writes in the metric's status: the utilization in whole percent for
    Utilization targets, the average per pod for other per-pod targets, the value itself for
    Value targets.
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


def capped_ceil(value: float) -> int:
    """``ceil`` as a replica count: at most :data:`MAX_REPLICAS`, never negative."""
    if math.isnan(value) or value <= 0:
        return 0
    if value >= MAX_REPLICAS:
        return MAX_REPLICAS
    return min(math.ceil(value), MAX_REPLICAS)


def group_pods(
    pods: Sequence[PodSample],
    now: float,
    readiness_rules: bool,
    readiness: ReadinessTimes = DEFAULT_READINESS,
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
        if readiness_rules and _unready(pod, now, readiness):
            unready.add(pod.name)
            continue
        ready_count += 1
    return PodGroups(ready_count, frozenset(unready), frozenset(missing), frozenset(ignored))


def _unready(pod: PodSample, now: float, readiness: ReadinessTimes) -> bool:
    if pod.ready is None or pod.started_at is None:
        return True
    changed = pod.ready_changed_at if pod.ready_changed_at is not None else pod.started_at
    if pod.started_at + readiness.initialization_period > now:
        # Still initialising: ignore the sample if the pod is unready or the sample's window
        # began before the pod last changed readiness.
        sampled = pod.sampled_at if pod.sampled_at is not None else now
        return (not pod.ready) or sampled < changed + pod.window_seconds
    # Past initialisation: ignore it only if it is unready and has never been ready.
    return (not pod.ready) and pod.started_at + readiness.initial_readiness_delay > changed


def count_ready(pods: Iterable[PodSample]) -> int:
    """Pods that are Running with a true Ready condition (``getReadyPodsCount``)."""
    return sum(1 for p in pods if p.phase == "Running" and p.ready is True)


def pod_requests(
    pods: Sequence[PodSample], resource: str, container: str | None = None
) -> dict[str, float]:
    """Each pod's request of ``resource`` (``calculatePodRequests``).

    Summed over the pod's containers, or only ``container``'s; a container without the request
    makes the metric invalid, because a utilization of an unknown request means nothing.
    """
    requests: dict[str, float] = {}
    for pod in pods:
        total = 0.0
        names = [container] if container else list(pod.containers)
        if not names:
            raise MetricUnavailable(
                "FailedGetResourceMetric",
                f"missing request for {resource} in pod {pod.name} (no containers known)",
            )
        for name in names:
            amount = (pod.containers.get(name) or {}).get(resource)
            if amount is None:
                raise MetricUnavailable(
                    "FailedGetResourceMetric",
                    f"missing request for {resource} in container {name} of Pod {pod.name}",
                )
            total += amount
        requests[pod.name] = total
    return requests


def _utilization(usage: Mapping[str, float], requests: Mapping[str, float]) -> float:
    """Summed usage over summed requests, in whole percent (``GetResourceUtilizationRatio``).

    Rounded to 1e-9 before flooring, because usage recovered from float percentages can land a
    hair under a whole number that the HPA's integer arithmetic would hit exactly.
    """
    used = sum(v for name, v in usage.items() if name in requests)
    requested = sum(requests[name] for name in usage if name in requests)
    if requested <= 0:
        raise MetricUnavailable("FailedGetResourceMetric", "no metrics returned matched known pods")
    return float(math.floor(round(used * 100.0 / requested, 9)))


def resource_utilization_replicas(
    pods: Sequence[PodSample],
    current_replicas: int,
    target_utilization: float,
    resource: str,
    tolerances: Tolerances,
    now: float,
    *,
    container: str | None = None,
    readiness: ReadinessTimes = DEFAULT_READINESS,
) -> Proposal:
    """Proposal for a Utilization target (``GetResourceReplicas``).

    ``PodSample.value`` is the pod's utilization in percent of its request; the usage the HPA
    sums is that share of the request.
    """
    if not pods:
        raise MetricUnavailable(
            "FailedGetResourceMetric",
            "no pods returned by selector while calculating replica count",
        )
    if all(p.value is None for p in pods):
        # As the HPA's metrics client fails before the requests are looked at.
        raise MetricUnavailable(
            "FailedGetResourceMetric", f"no metrics returned for {resource} of the target's pods"
        )
    groups = group_pods(pods, now, readiness_rules=True, readiness=readiness)
    requests = pod_requests(pods, resource, container)
    usage = {
        p.name: float(p.value) * requests[p.name] / 100.0
        for p in pods
        if p.value is not None and p.name not in groups.ignored | groups.unready | groups.missing
    }
    if not usage:
        raise MetricUnavailable(
            "FailedGetResourceMetric",
            "did not receive metrics for targeted pods (pods might be unready)",
        )
    utilization = _utilization(usage, requests)
    usage_ratio = utilization / target_utilization

    scale_up_with_unready = bool(groups.unready) and usage_ratio > 1.0
    if not scale_up_with_unready and not groups.missing:
        if tolerances.within(usage_ratio):
            return Proposal(current_replicas, utilization, usage_ratio)
        return Proposal(capped_ceil(usage_ratio * groups.ready_count), utilization, usage_ratio)

    if groups.missing:
        if usage_ratio < 1.0:
            fallback = max(100.0, target_utilization) / 100.0
            usage.update({name: requests[name] * fallback for name in groups.missing})
        elif usage_ratio > 1.0:
            usage.update(dict.fromkeys(groups.missing, 0.0))
    if scale_up_with_unready:
        usage.update(dict.fromkeys(groups.unready, 0.0))

    new_ratio = _utilization(usage, requests) / target_utilization
    return _rebalanced(
        current_replicas, usage_ratio, new_ratio, len(usage), utilization, tolerances
    )


def pods_metric_replicas(
    pods: Sequence[PodSample],
    current_replicas: int,
    target: float,
    tolerances: Tolerances,
    now: float,
) -> Proposal:
    """Proposal for a Pods metric with an AverageValue target (``calcPlainMetricReplicas``).

    The usage is the average over pods with samples; only pending pods count as unready, as for
    any custom metric in Kubernetes.
    """
    if not pods:
        raise MetricUnavailable(
            "FailedGetPodsMetric", "no pods returned by selector while calculating replica count"
        )
    groups = group_pods(pods, now, readiness_rules=False)
    samples = {
        p.name: float(p.value)
        for p in pods
        if p.value is not None and p.name not in groups.ignored | groups.unready | groups.missing
    }
    if not samples:
        raise MetricUnavailable(
            "FailedGetPodsMetric",
            "did not receive metrics for targeted pods (pods might be unready)",
        )
    usage = sum(samples.values()) / len(samples)
    usage_ratio = usage / target

    scale_up_with_unready = bool(groups.unready) and usage_ratio > 1.0
    if not scale_up_with_unready and not groups.missing:
        if tolerances.within(usage_ratio):
            return Proposal(current_replicas, usage, usage_ratio)
        return Proposal(capped_ceil(usage_ratio * groups.ready_count), usage, usage_ratio)

    if groups.missing:
        # At exactly 1.0 nothing is filled in: the ratio stays 1.0 and the count stays.
        if usage_ratio < 1.0:
            samples.update(dict.fromkeys(groups.missing, target))
        elif usage_ratio > 1.0:
            samples.update(dict.fromkeys(groups.missing, 0.0))
    if scale_up_with_unready:
        samples.update(dict.fromkeys(groups.unready, 0.0))

    new_ratio = sum(samples.values()) / len(samples) / target
    return _rebalanced(current_replicas, usage_ratio, new_ratio, len(samples), usage, tolerances)


def _rebalanced(
    current: int, ratio: float, new_ratio: float, counted: int, usage: float, tol: Tolerances
) -> Proposal:
    """The count after missing and unready pods were filled in, unless that flips or stalls."""
    if tol.within(new_ratio) or (ratio < 1.0 < new_ratio) or (ratio > 1.0 > new_ratio):
        return Proposal(current, usage, ratio)
    new_replicas = capped_ceil(new_ratio * counted)
    if (new_ratio < 1.0 and new_replicas > current) or (new_ratio > 1.0 and new_replicas < current):
        return Proposal(current, usage, ratio)
    return Proposal(new_replicas, usage, ratio)


def value_metric_replicas(
    value: float,
    current_replicas: int,
    target: float,
    tolerances: Tolerances,
    ready_pods: int | None,
) -> Proposal:
    """Object or External metric with a Value target (``getUsageRatioReplicaCount``).

    The count scales the *ready* pods by the ratio (none ready proposes 0, as in Kubernetes); at
    zero replicas the ratio alone decides, which is how a target at zero is woken up.
    ``ready_pods`` is None when the pods could not be listed: the metric is then invalid
    whenever the count is needed.
    """
    usage_ratio = value / target
    if current_replicas == 0:
        return Proposal(capped_ceil(usage_ratio), value, usage_ratio)
    if tolerances.within(usage_ratio):
        return Proposal(current_replicas, value, usage_ratio)
    if ready_pods is None:
        raise MetricUnavailable(
            "FailedGetExternalMetric",
            "unable to calculate ready pods: no pods were listed for the target",
        )
    return Proposal(capped_ceil(usage_ratio * ready_pods), value, usage_ratio)


def average_value_metric_replicas(
    value: float, status_replicas: int, target: float, tolerances: Tolerances
) -> Proposal:
    """Object or External metric with an AverageValue (per-pod) target.

    ``GetObjectPerPodMetricReplicas``: the total is divided by the target; the ratio that the
    tolerance sees is taken against the replicas the target currently reports.
    """
    if status_replicas <= 0:
        usage_ratio = math.inf if value > 0 else 0.0
        return Proposal(capped_ceil(value / target), value, usage_ratio)
    usage_ratio = value / (target * status_replicas)
    replicas = status_replicas
    if not tolerances.within(usage_ratio):
        replicas = capped_ceil(value / target)
    return Proposal(replicas, value / status_replicas, usage_ratio)
