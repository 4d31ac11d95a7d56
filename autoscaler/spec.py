"""The GPUAutoscaler spec: autoscaling/v2's shape with PromQL metrics and a prediction section.

One schema serves the custom resource (its camelCase ``spec`` as the API server returns it), the
local mode's YAML file and the CRD's ``openAPIV3Schema`` (generated from the models below by
``python -m autoscaler.crd.generate``), so the API server, the controller and the local mode
accept the same specs. The models check each field's shape and bounds; the rules that join
fields (a target's value key follows its type, minReplicas 0 needs an Object or External metric)
are checked when the models become the decision core's types (:mod:`autoscaler.core.spec`).

Defaults are filled in the way the Kubernetes API server defaults an ``autoscaling/v2``
HorizontalPodAutoscaler with a behavior section: scale up by at most max(4 pods, 100%) per 15 s
with no stabilization, scale down by at most 100% per 15 s after a 300 s stabilization window,
tolerance 0.1 both ways.

A metric entry is flattened compared with autoscaling/v2, because the value comes from a PromQL
query rather than from a metrics API::

    metrics:
      - name: gpu_util
        type: Pods                      # Pods | Object | External
        query: avg by (pod) (DCGM_FI_DEV_GPU_UTIL{namespace="llm"})
        target: {type: Utilization, averageUtilization: 70}
        resource: nvidia.com/gpu        # Utilization only: the request it is a share of
        prediction: {horizonSeconds: 300, quantile: 0.9, warmupSeconds: 180}

Without a ``behavior`` section the autoscaler follows the HPA's rules for an object without one
(scale-down window from the controller's flag, at most max(2x, 4) replicas up per decision, no
rate limit down); with one, unset fields are filled from the API defaults direction by direction,
and the scale-down window, which the API leaves unset, from the controller's flag.

Errors raise :class:`SpecError`, whose message starts with the path of the bad field
(``spec.metrics[1].target.value: ...``) and says what is accepted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    WithJsonSchema,
)
from pydantic.alias_generators import to_camel
from pydantic_core import PydanticCustomError

from autoglm.config import ConfigError, read_yaml_file
from autoglm.schema_errors import Location, first_error_line
from autoscaler.core.spec import (
    ALLOWED_TARGETS,
    BATCHER_BEST_EFFORT_QUANTUM,
    BATCHER_COST_FIXED,
    BATCHER_COST_PER_ITEM,
    BATCHER_MAX_BATCH,
    BATCHER_REQUESTS,
    BATCHER_SERVICE_SCV,
    DEFAULT_POLICY_PERIOD_SECONDS,
    DEFAULT_RESOURCE,
    DEFAULT_SCALE_UP_STABILIZATION_SECONDS,
    DEFAULT_SLO_QUANTILE,
    DEFAULT_SLO_RATE_NAME,
    DEFAULT_TOLERANCE,
    MAX_POLICY_PERIOD_SECONDS,
    MAX_STABILIZATION_WINDOW_SECONDS,
    SOURCES,
    TARGET_TYPES,
    Behavior,
    GPUAutoscalerSpec,
    HPAScalingPolicy,
    HPAScalingRules,
    MetricSource,
    MetricSpec,
    PolicyType,
    Prediction,
    ScaleTargetRef,
    SelectPolicy,
    SloSpec,
    SpecError,
    TargetType,
    best_effort_quantum_query,
    default_behavior,
    default_scale_down_rules,
    default_scale_up_rules,
    unknown_source_problem,
)

__all__ = [
    "ALLOWED_TARGETS",
    "BATCHER_COST_FIXED",
    "BATCHER_COST_PER_ITEM",
    "BATCHER_MAX_BATCH",
    "BATCHER_REQUESTS",
    "BATCHER_SERVICE_SCV",
    "DEFAULT_POLICY_PERIOD_SECONDS",
    "DEFAULT_RESOURCE",
    "DEFAULT_SCALE_UP_STABILIZATION_SECONDS",
    "DEFAULT_SLO_QUANTILE",
    "DEFAULT_SLO_RATE_NAME",
    "DEFAULT_TOLERANCE",
    "MAX_POLICY_PERIOD_SECONDS",
    "MAX_STABILIZATION_WINDOW_SECONDS",
    "SOURCES",
    "TARGET_TYPES",
    "Behavior",
    "GPUAutoscalerSpec",
    "GPUAutoscalerSpecModel",
    "HPAScalingPolicy",
    "HPAScalingRules",
    "MetricSource",
    "MetricSpec",
    "PolicyType",
    "Prediction",
    "ScaleTargetRef",
    "SelectPolicy",
    "SloSpec",
    "SpecError",
    "TargetType",
    "default_behavior",
    "default_scale_down_rules",
    "default_scale_up_rules",
    "load_spec_file",
    "parse_quantity",
    "parse_spec",
    "spec_path",
]

_TARGET_KEY = {
    "Utilization": "averageUtilization",
    "AverageValue": "averageValue",
    "Value": "value",
}
MAX_INT32 = 2**31 - 1

# --- quantities --------------------------------------------------------------------------------

_QUANTITY = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)(m|k|M|G|T|Ki|Mi|Gi|Ti)?$")
_QUANTITY_FACTOR = {
    None: 1.0,
    "m": 1e-3,
    "k": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "Ki": 1024.0,
    "Mi": 1024.0**2,
    "Gi": 1024.0**3,
    "Ti": 1024.0**4,
}


def _quantity_value(raw: Any) -> float:
    """A number or a Kubernetes quantity string as a float; ValueError saying what is accepted."""
    if isinstance(raw, bool):
        raise ValueError(f"expected a number or a quantity like '500m', got {raw!r}")
    if isinstance(raw, (int, float)):
        value = float(raw)
    elif isinstance(raw, str) and (m := _QUANTITY.match(raw.strip())):
        value = float(m.group(1)) * _QUANTITY_FACTOR[m.group(2)]
    else:
        raise ValueError(f"expected a number or a quantity like '500m', got {raw!r}")
    if not math.isfinite(value):
        raise ValueError(f"must be a finite number, got {raw!r}")
    return value


def parse_quantity(raw: Any, path: str) -> float:
    """A number or a Kubernetes quantity string ("500m", "2k", "1Gi") as a float."""
    try:
        return _quantity_value(raw)
    except ValueError as exc:
        raise SpecError(f"{path}: {exc}") from None


def _as_quantity(raw: Any) -> float:
    try:
        return _quantity_value(raw)
    except ValueError as exc:
        raise PydanticCustomError("quantity", str(exc)) from None


def _not_blank(text: str) -> str:
    if not text.strip():
        raise PydanticCustomError("blank", f"expected a non-empty string, got {text!r}")
    return text


def _known_source(raw: Any) -> Any:
    if raw not in SOURCES:
        raise PydanticCustomError("metric_type", unknown_source_problem(raw))
    return raw


# A number, or a string such as "500m": the API server's int-or-string, read as a float.
Quantity = Annotated[
    float,
    BeforeValidator(_as_quantity),
    WithJsonSchema(
        {"x-kubernetes-int-or-string": True, "anyOf": [{"type": "integer"}, {"type": "string"}]}
    ),
]
NonEmpty = Annotated[str, Field(min_length=1), AfterValidator(_not_blank)]
Fraction = Annotated[float, Field(ge=0.5, lt=1.0)]


# --- the custom resource's spec, as written ---------------------------------------------------


class WrittenSpec(BaseModel):
    """Fields as the user writes them: camelCase, no unknown keys, no conversions (a "3" is not
    the integer 3, as the API server's schema would not take it either)."""

    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        strict=True,
        allow_inf_nan=False,
        frozen=True,
    )


class ScaleTargetRefModel(WrittenSpec):
    api_version: NonEmpty = "apps/v1"
    # The API server scales these kinds; the local mode also takes its own ("Local").
    kind: NonEmpty = Field(json_schema_extra={"enum": ["Deployment", "StatefulSet", "ReplicaSet"]})
    name: NonEmpty


class PredictionModel(WrittenSpec):
    enabled: bool = True
    query: NonEmpty | None = Field(
        None, description="Series the predictor forecasts (a fleet total for Pods metrics)."
    )
    horizon_seconds: float = Field(300.0, gt=0)
    quantile: Fraction = 0.9
    warmup_seconds: float = Field(0.0, ge=0)


class TargetModel(WrittenSpec):
    type: Literal["Utilization", "AverageValue", "Value"]
    average_utilization: Quantity | None = None
    average_value: Quantity | None = None
    value: Quantity | None = None


class MetricModel(WrittenSpec):
    name: NonEmpty = Field(description="Unique name; also the predictor target.")
    type: Annotated[Literal["Pods", "Object", "External"], BeforeValidator(_known_source)] = Field(
        "Pods",
        description="Pods queries return one series per pod (label pod); Object one value; "
        "External series are summed.",
    )
    query: NonEmpty = Field(description="PromQL instant query.")
    resource: NonEmpty | None = Field(
        None,
        description="Utilization targets only; the pods' resource request the query's "
        f"percentages are shares of (default {DEFAULT_RESOURCE}).",
    )
    container: NonEmpty | None = Field(
        None,
        description="Utilization targets only; take the request of this container (as a "
        "ContainerResource metric) instead of the sum over the pod's containers.",
    )
    target: TargetModel
    prediction: PredictionModel | None = None


class ServiceModelQueries(WrittenSpec):
    fixed_seconds_query: NonEmpty | None = None
    per_item_seconds_query: NonEmpty | None = None
    max_batch_query: NonEmpty | None = None
    service_scv_query: NonEmpty | None = Field(
        default=None,
        description="Spread of one request's service time, a squared coefficient of variation "
        f"(default: max({BATCHER_SERVICE_SCV})); no series: taken as 0.",
    )
    best_effort_quantum_query: NonEmpty | None = Field(
        default=None,
        description="Longest best-effort slice in seconds, reserved out of the SLO: an online "
        "request may wait one for the device (default: max(" + BATCHER_BEST_EFFORT_QUANTUM + ") "
        "while the batchers' best-effort busy rate over 5m is > 0); no series: nothing reserved.",
    )


class SloModel(WrittenSpec):
    latency_seconds: float = Field(gt=0)
    quantile: Fraction = DEFAULT_SLO_QUANTILE
    objective: float | None = Field(
        None,
        gt=0.0,
        lt=1.0,
        description="Share of windows whose quantile latency must hold the SLO, e.g. 0.995; the "
        "per-request quantile sized for is then derived from it at each rate (a window of few "
        "requests breaches when one is late). Unset: size for the quantile itself.",
    )
    objective_window_seconds: float = Field(
        60.0, gt=0, description="The window the objective counts, in seconds (a minute)."
    )
    selector: str = Field(
        "", description='PromQL label matchers for the default queries, e.g. {namespace="ml"}.'
    )
    rate_query: NonEmpty | None = Field(
        None,
        description=f"Online request rate in req/s (default: sum(rate({BATCHER_REQUESTS}[1m]))).",
    )
    rate_name: NonEmpty = Field(
        DEFAULT_SLO_RATE_NAME, description="The rate's predictor target name."
    )
    service_model: ServiceModelQueries | None = None
    prediction: PredictionModel | None = None


class PolicyModel(WrittenSpec):
    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1)
    period_seconds: int = Field(ge=1, le=MAX_POLICY_PERIOD_SECONDS)


class RulesModel(WrittenSpec):
    stabilization_window_seconds: int | None = Field(
        None, ge=0, le=MAX_STABILIZATION_WINDOW_SECONDS
    )
    select_policy: Literal["Max", "Min", "Disabled"] | None = None
    tolerance: Quantity | None = None
    policies: list[PolicyModel] | None = Field(None, min_length=1)


class BehaviorModel(WrittenSpec):
    scale_up: RulesModel | None = None
    scale_down: RulesModel | None = None


class GPUAutoscalerSpecModel(WrittenSpec):
    """A GPUAutoscaler's ``spec`` as written; :func:`parse_spec` turns it into the core's type."""

    scale_target_ref: ScaleTargetRefModel = Field(
        description="The workload scaled through its scale subresource."
    )
    min_replicas: int = Field(1, ge=0, le=MAX_INT32, json_schema_extra={"format": "int32"})
    max_replicas: int = Field(ge=1, le=MAX_INT32, json_schema_extra={"format": "int32"})
    metrics: list[MetricModel] | None = Field(
        None,
        description="The HPA rule; required without slo, and with slo what it falls back on.",
    )
    slo: SloModel | None = Field(
        None,
        description="Size for a latency SLO instead of a utilization target (the fewest "
        "replicas whose modelled latency at max(observed rate, forecast upper bound) holds).",
    )
    behavior: BehaviorModel | None = None


# --- parsing -----------------------------------------------------------------------------------


def parse_spec(obj: Mapping[str, Any]) -> GPUAutoscalerSpec:
    """Parse a GPUAutoscaler object (with ``spec``) or just its spec into a validated spec."""
    if not isinstance(obj, Mapping):
        raise SpecError("spec: expected a mapping (a GPUAutoscaler object or its spec)")
    if "spec" in obj and isinstance(obj.get("spec"), Mapping):
        obj = obj["spec"]
    try:
        written = GPUAutoscalerSpecModel.model_validate(dict(obj))
    except ValidationError as exc:
        raise SpecError(_one_line(exc)) from None
    return _to_core(written)


def load_spec_file(path: str | Path) -> GPUAutoscalerSpec:
    """Read a YAML file holding a GPUAutoscaler object or only its spec."""
    p = Path(path)
    try:
        data = read_yaml_file(p, "spec file")
    except ConfigError as exc:
        raise SpecError(str(exc)) from exc
    if not isinstance(data, Mapping):
        raise SpecError(f"spec file {str(p)!r} must hold a GPUAutoscaler object or its spec")
    return parse_spec(data)


def _one_line(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    if error["type"] == "too_short" and error["loc"][-1] == "policies":
        return (
            f"{spec_path(tuple(error['loc']))}: must specify at least one policy (as the "
            "Kubernetes API requires); remove the key to get the defaults, or set "
            "selectPolicy: Disabled with a policy to stop scaling in this direction"
        )
    return first_error_line(exc, GPUAutoscalerSpecModel, spec_path)


def spec_path(loc: Location) -> str:
    """``spec.metrics[1].target.value`` for ``("metrics", 1, "target", "value")``."""
    path = "spec"
    for step in loc:
        path += f"[{step}]" if isinstance(step, int) else f".{step}"
    return path


def _to_core(spec: GPUAutoscalerSpecModel) -> GPUAutoscalerSpec:
    """The rules that join fields, and the core's immutable types."""
    if spec.max_replicas < spec.min_replicas:
        raise SpecError(
            f"spec.maxReplicas: {spec.max_replicas} is below minReplicas {spec.min_replicas}; "
            "raise maxReplicas or lower minReplicas"
        )
    slo = _slo(spec.slo, "spec.slo") if spec.slo is not None else None
    if slo is not None and spec.min_replicas == 0:
        raise SpecError(
            "spec.minReplicas: 0 cannot hold a latency SLO (a request arriving at zero replicas "
            "waits for a cold start); set minReplicas >= 1 or remove spec.slo"
        )
    if spec.metrics is None and slo is None:
        raise SpecError("spec.metrics: is required")
    if not spec.metrics and slo is None:
        raise SpecError("spec.metrics: expected a non-empty list of metrics")
    metrics = tuple(_metric(m, f"spec.metrics[{i}]") for i, m in enumerate(spec.metrics or []))
    names = [m.name for m in metrics]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SpecError(f"spec.metrics[{i}].name: {name!r} is used twice; names must be unique")
    if slo is not None and slo.rate_name in names:
        raise SpecError(
            f"spec.slo.rateName: {slo.rate_name!r} is also a metric's name; forecasts are looked "
            "up by name, so give the SLO's rate another one"
        )
    if spec.min_replicas == 0 and all(m.source == "Pods" for m in metrics):
        raise SpecError(
            "spec.minReplicas: 0 needs at least one Object or External metric, because Pods "
            "metrics have no pods to read at zero replicas; set minReplicas >= 1"
        )
    behavior, tol_up, tol_down = _behavior(spec.behavior, "spec.behavior")
    ref = spec.scale_target_ref
    return GPUAutoscalerSpec(
        scale_target_ref=ScaleTargetRef(ref.api_version, ref.kind, ref.name),
        min_replicas=spec.min_replicas,
        max_replicas=spec.max_replicas,
        metrics=metrics,
        behavior=behavior,
        tolerance_up=tol_up,
        tolerance_down=tol_down,
        slo=slo,
    )


def _metric(metric: MetricModel, path: str) -> MetricSpec:
    target, tpath = metric.target, f"{path}.target"
    if target.type not in ALLOWED_TARGETS[metric.type]:
        raise SpecError(
            f"{tpath}.type: {target.type} is not allowed for a {metric.type} metric; "
            f"use one of {', '.join(ALLOWED_TARGETS[metric.type])}"
        )
    key = _TARGET_KEY[target.type]
    values = {
        "averageUtilization": target.average_utilization,
        "averageValue": target.average_value,
        "value": target.value,
    }
    for other, given in values.items():
        if other != key and given is not None:
            raise SpecError(
                f"{tpath}.{other}: unknown field for a {target.type} target; valid fields are "
                f"{key}, type"
            )
    value = values[key]
    if value is None:
        raise SpecError(f"{tpath}.{key}: is required")
    if value <= 0:
        raise SpecError(f"{tpath}.{key}: must be > 0, got {value:g}")
    for field in ("resource", "container"):
        if getattr(metric, field) is not None and target.type != "Utilization":
            raise SpecError(
                f"{path}.{field}: only a Utilization target is a share of a resource request; "
                "remove it"
            )
    return MetricSpec(
        metric.name,
        metric.query,
        metric.type,
        target.type,
        value,
        _prediction(metric.prediction),
        metric.resource or DEFAULT_RESOURCE,
        metric.container,
    )


def _prediction(prediction: PredictionModel | None) -> Prediction | None:
    if prediction is None:
        return None
    return Prediction(
        prediction.enabled,
        prediction.query,
        prediction.horizon_seconds,
        prediction.quantile,
        prediction.warmup_seconds,
    )


_SELECTOR = re.compile(r"^\{.*\}$", re.DOTALL)


def _slo(slo: SloModel, path: str) -> SloSpec:
    selector = slo.selector.strip()
    if selector and not _SELECTOR.match(selector):
        raise SpecError(
            f"{path}.selector: expected PromQL label matchers in braces, e.g. "
            f"'{{namespace=\"ml\"}}', got {selector!r}"
        )
    model = slo.service_model or ServiceModelQueries()
    return SloSpec(
        latency_seconds=slo.latency_seconds,
        quantile=slo.quantile,
        objective=slo.objective,
        objective_window_seconds=slo.objective_window_seconds,
        rate_query=slo.rate_query or f"sum(rate({BATCHER_REQUESTS}{selector}[1m]))",
        fixed_seconds_query=model.fixed_seconds_query or f"avg({BATCHER_COST_FIXED}{selector})",
        per_item_seconds_query=model.per_item_seconds_query
        or f"avg({BATCHER_COST_PER_ITEM}{selector})",
        max_batch_query=model.max_batch_query or f"min({BATCHER_MAX_BATCH}{selector})",
        service_scv_query=model.service_scv_query or f"max({BATCHER_SERVICE_SCV}{selector})",
        best_effort_quantum_query=model.best_effort_quantum_query
        or best_effort_quantum_query(selector),
        rate_name=slo.rate_name,
        prediction=_prediction(slo.prediction),
    )


def _behavior(behavior: BehaviorModel | None, path: str) -> tuple[Behavior | None, float, float]:
    if behavior is None:
        return None, DEFAULT_TOLERANCE, DEFAULT_TOLERANCE
    up, tol_up = _rules(behavior.scale_up, f"{path}.scaleUp", default_scale_up_rules())
    down, tol_down = _rules(behavior.scale_down, f"{path}.scaleDown", default_scale_down_rules())
    return Behavior(scale_up=up, scale_down=down), tol_up, tol_down


def _rules(
    rules: RulesModel | None, path: str, default: HPAScalingRules
) -> tuple[HPAScalingRules, float]:
    """Fill unset fields from ``default`` field by field, as the API server's defaulting does."""
    if rules is None:
        return default, DEFAULT_TOLERANCE
    tolerance = DEFAULT_TOLERANCE if rules.tolerance is None else rules.tolerance
    if tolerance < 0:
        raise SpecError(f"{path}.tolerance: must be >= 0, got {tolerance:g}")
    policies = default.policies
    if rules.policies is not None:
        policies = tuple(
            HPAScalingPolicy(p.type, p.value, p.period_seconds) for p in rules.policies
        )
    window = rules.stabilization_window_seconds
    return (
        HPAScalingRules(
            default.stabilization_window_seconds if window is None else window,
            rules.select_policy or default.select_policy,
            policies,
        ),
        tolerance,
    )
