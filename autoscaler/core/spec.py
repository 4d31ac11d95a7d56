"""The GPUAutoscaler spec as the decision core reads it: validated, defaulted, immutable.

These types carry no parsing: :mod:`autoscaler.spec` validates the custom resource (or the local
mode's YAML file) against its schema and builds them, so the core stays free of I/O and of the
kernel. :class:`SpecError` lives here because a spec built in code (the simulator, a library
caller) is checked when constructed, and its message names the bad field's path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MetricSource = Literal["Pods", "Object", "External"]
TargetType = Literal["Utilization", "AverageValue", "Value"]
PolicyType = Literal["Pods", "Percent"]
SelectPolicy = Literal["Max", "Min", "Disabled"]

SOURCES: tuple[str, ...] = ("Pods", "Object", "External")
TARGET_TYPES: tuple[str, ...] = ("Utilization", "AverageValue", "Value")
# Which target types each source accepts, as autoscaling/v2 validation allows them; a Pods
# Utilization target stands for the resource-metric case (GPU utilization instead of CPU).
ALLOWED_TARGETS: dict[str, tuple[str, ...]] = {
    "Pods": ("Utilization", "AverageValue"),
    "Object": ("Value", "AverageValue"),
    "External": ("Value", "AverageValue"),
}

DEFAULT_TOLERANCE = 0.1
DEFAULT_SCALE_UP_STABILIZATION_SECONDS = 0
DEFAULT_RESOURCE = "nvidia.com/gpu"
DEFAULT_POLICY_PERIOD_SECONDS = 15
MAX_STABILIZATION_WINDOW_SECONDS = 3600
MAX_POLICY_PERIOD_SECONDS = 1800


class SpecError(ValueError):
    """The spec is invalid; the message starts with the field's path and says how to fix it."""


def unknown_source_problem(source: object) -> str:
    """What is wrong with a metric type the core does not know, and what to write instead of
    the HPA's resource metric types."""
    hint = ""
    if source in ("Resource", "ContainerResource"):
        hint = (
            "; there is no resource metrics API here: a resource's utilization is a Pods metric "
            "with a Utilization target (type: Pods, target: {type: Utilization, "
            "averageUtilization: 70}, resource: nvidia.com/gpu, optionally container: NAME)"
        )
    return f"{source!r} is not one of {', '.join(SOURCES)}{hint}"


@dataclass(frozen=True)
class ScaleTargetRef:
    """The workload whose scale subresource is driven (Deployment, StatefulSet, local group)."""

    api_version: str
    kind: str
    name: str


@dataclass(frozen=True)
class Prediction:
    """How a metric's predictive candidate is formed from a forecast.

    The forecast is asked for ``effective_horizon_seconds`` ahead: never less than the warm-up
    time of a new replica, because a replica ordered now only helps that far in the future.
    """

    enabled: bool = True
    query: str | None = None
    horizon_seconds: float = 300.0
    quantile: float = 0.9
    warmup_seconds: float = 0.0

    @property
    def effective_horizon_seconds(self) -> float:
        return max(self.horizon_seconds, self.warmup_seconds)


@dataclass(frozen=True)
class MetricSpec:
    """One metric: where its value comes from (PromQL), how it is read, and its target.

    ``resource`` and ``container`` matter for Utilization targets only: the pods' request of
    ``resource`` (in ``container``, or summed over all containers) is what the usage is a share of.
    Constructing one with a source or target type the core does not know raises
    :class:`SpecError` here, not later in a reconcile.
    """

    name: str
    query: str
    source: MetricSource
    target_type: TargetType
    target_value: float
    prediction: Prediction | None = None
    resource: str = DEFAULT_RESOURCE
    container: str | None = None

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise SpecError(f"metric {self.name!r} type: {unknown_source_problem(self.source)}")
        if self.target_type not in ALLOWED_TARGETS[self.source]:
            raise SpecError(
                f"metric {self.name!r} target type: {self.target_type!r} is not allowed for a "
                f"{self.source} metric; use one of {', '.join(ALLOWED_TARGETS[self.source])}"
            )

    @property
    def prediction_query(self) -> str:
        """The series the predictor forecasts: the prediction's own query or the metric's."""
        if self.prediction is not None and self.prediction.query:
            return self.prediction.query
        return self.query


@dataclass(frozen=True)
class HPAScalingPolicy:
    """At most ``value`` pods (or percent of the replicas) changed within ``period_seconds``."""

    type: PolicyType
    value: int
    period_seconds: int


@dataclass(frozen=True)
class HPAScalingRules:
    """Rules for one direction; a None ``stabilization_window_seconds`` (scale-down only) means
    the controller's --downscale-stabilization applies."""

    stabilization_window_seconds: int | None
    select_policy: SelectPolicy
    policies: tuple[HPAScalingPolicy, ...]

    @property
    def longest_policy_period(self) -> int:
        return max((p.period_seconds for p in self.policies), default=0)


def default_scale_up_rules() -> HPAScalingRules:
    return HPAScalingRules(
        stabilization_window_seconds=DEFAULT_SCALE_UP_STABILIZATION_SECONDS,
        select_policy="Max",
        policies=(
            HPAScalingPolicy("Pods", 4, DEFAULT_POLICY_PERIOD_SECONDS),
            HPAScalingPolicy("Percent", 100, DEFAULT_POLICY_PERIOD_SECONDS),
        ),
    )


def default_scale_down_rules() -> HPAScalingRules:
    """The API's scale-down defaults; the window stays unset, to be filled from the controller's
    --downscale-stabilization flag (as kube-controller-manager does)."""
    return HPAScalingRules(
        stabilization_window_seconds=None,
        select_policy="Max",
        policies=(HPAScalingPolicy("Percent", 100, DEFAULT_POLICY_PERIOD_SECONDS),),
    )


@dataclass(frozen=True)
class Behavior:
    scale_up: HPAScalingRules
    scale_down: HPAScalingRules


def default_behavior() -> Behavior:
    return Behavior(scale_up=default_scale_up_rules(), scale_down=default_scale_down_rules())


# The batcher's own series: its online request counter and its fitted batch cost t(b) = c + a*b.
BATCHER_REQUESTS = "autoglm_batcher_requests_total"
BATCHER_COST_FIXED = "autoglm_batcher_cost_fixed_seconds"
BATCHER_COST_PER_ITEM = "autoglm_batcher_cost_per_item_seconds"
BATCHER_MAX_BATCH = "autoglm_batcher_max_batch_size_items"
# ... and the spread of one request's service time (squared coefficient of variation)
BATCHER_SERVICE_SCV = "autoglm_batcher_service_time_scv"
# ... and, with best-effort work on the fleet, its slice length and the busy time by class
BATCHER_BEST_EFFORT_QUANTUM = "autoglm_batcher_best_effort_quantum_seconds"
BATCHER_CLASS_BUSY = "autoglm_batcher_class_busy_seconds_total"
DEFAULT_SLO_QUANTILE = 0.99
DEFAULT_SLO_RATE_NAME = "request_rate"


def best_effort_quantum_query(selector: str = "") -> str:
    """The batchers' longest best-effort slice, answered only while best-effort work ran in the
    last five minutes: a batcher exports its quantum whether or not a job runs, and only a
    running job makes an online request wait for a slice. Five minutes, not one, so that the
    slack controller's throttling (best-effort work paused because the online SLO is tight) does
    not lift the reservation just when it matters."""
    matchers = ",".join(m for m in ('class="best_effort"', selector.strip()[1:-1].strip()) if m)
    return (
        f"max({BATCHER_BEST_EFFORT_QUANTUM}{selector}) and on() "
        f"(sum(rate({BATCHER_CLASS_BUSY}{{{matchers}}}[5m])) > 0)"
    )


@dataclass(frozen=True)
class SloSpec:
    """Size the fleet for a latency SLO instead of a utilization target.

    The fewest replicas whose modelled ``quantile`` latency, at the larger of the observed online
    request rate and its forecast's upper bound, stays within ``latency_seconds``. The service
    model (the batcher's fitted batch cost, its largest batch and the spread of its requests'
    service times), the best-effort slice reserved out of the SLO and the rate are PromQL
    queries; by default they read the batcher's own series, narrowed by ``selector``.
    ``rate_name`` is the rate's name as the predictor's forecast target. With ``objective``
    (the share of ``objective_window_seconds`` windows whose ``quantile`` must hold) the
    per-request quantile sized for is derived from it at each rate
    (:mod:`autoscaler.core.slo_objective`) instead of being ``quantile`` itself.
    """

    latency_seconds: float
    quantile: float = DEFAULT_SLO_QUANTILE
    objective: float | None = None
    objective_window_seconds: float = 60.0
    rate_query: str = f"sum(rate({BATCHER_REQUESTS}[1m]))"
    fixed_seconds_query: str = f"avg({BATCHER_COST_FIXED})"
    per_item_seconds_query: str = f"avg({BATCHER_COST_PER_ITEM})"
    max_batch_query: str = f"min({BATCHER_MAX_BATCH})"
    service_scv_query: str = f"max({BATCHER_SERVICE_SCV})"
    best_effort_quantum_query: str = best_effort_quantum_query()
    rate_name: str = DEFAULT_SLO_RATE_NAME
    prediction: Prediction | None = None

    @property
    def rate_metric(self) -> MetricSpec:
        """The rate as a metric, so it is read and forecast like any External metric."""
        return MetricSpec(
            self.rate_name, self.rate_query, "External", "Value", 1.0, self.prediction
        )


@dataclass(frozen=True)
class GPUAutoscalerSpec:
    scale_target_ref: ScaleTargetRef
    min_replicas: int
    max_replicas: int
    metrics: tuple[MetricSpec, ...]  # with ``slo``: the HPA rule it falls back on (may be empty)
    behavior: Behavior | None  # None: no behavior section, the HPA's rules for that case
    tolerance_up: float = DEFAULT_TOLERANCE
    tolerance_down: float = DEFAULT_TOLERANCE
    slo: SloSpec | None = None
