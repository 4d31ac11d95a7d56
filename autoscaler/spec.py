"""The GPUAutoscaler spec: autoscaling/v2's shape with PromQL metrics and a prediction section.

One parser serves the custom resource (its camelCase ``spec`` as the API server returns it) and
the local mode's YAML file, so both are validated by the same rules. Defaults are filled in the
way the Kubernetes API server defaults an ``autoscaling/v2`` HorizontalPodAutoscaler with a
behavior section: scale up by at most max(4 pods, 100%) per 15 s with no stabilization, scale
down by at most 100% per 15 s after a 300 s stabilization window, tolerance 0.1 both ways.

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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from autoglm.config import ConfigError, read_yaml_file

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
_TARGET_KEY = {
    "Utilization": "averageUtilization",
    "AverageValue": "averageValue",
    "Value": "value",
}

DEFAULT_TOLERANCE = 0.1
DEFAULT_SCALE_UP_STABILIZATION_SECONDS = 0
DEFAULT_RESOURCE = "nvidia.com/gpu"
DEFAULT_POLICY_PERIOD_SECONDS = 15
MAX_STABILIZATION_WINDOW_SECONDS = 3600
MAX_POLICY_PERIOD_SECONDS = 1800


class SpecError(ValueError):
    """The spec is invalid; the message starts with the field's path and says how to fix it."""


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
            raise SpecError(_unknown_source_message(f"metric {self.name!r} type", self.source))
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
DEFAULT_SLO_QUANTILE = 0.99
DEFAULT_SLO_RATE_NAME = "request_rate"


@dataclass(frozen=True)
class SloSpec:
    """Size the fleet for a latency SLO instead of a utilization target.

    The fewest replicas whose modelled ``quantile`` latency, at the larger of the observed online
    request rate and its forecast's upper bound, stays within ``latency_seconds``. The service
    model (the batcher's fitted batch cost and its largest batch) and the rate are PromQL
    queries; by default they read the batcher's own series, narrowed by ``selector``.
    ``rate_name`` is the rate's name as the predictor's forecast target.
    """

    latency_seconds: float
    quantile: float = DEFAULT_SLO_QUANTILE
    rate_query: str = f"sum(rate({BATCHER_REQUESTS}[1m]))"
    fixed_seconds_query: str = f"avg({BATCHER_COST_FIXED})"
    per_item_seconds_query: str = f"avg({BATCHER_COST_PER_ITEM})"
    max_batch_query: str = f"min({BATCHER_MAX_BATCH})"
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


# --- parsing -----------------------------------------------------------------------------------

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


def parse_quantity(raw: Any, path: str) -> float:
    """A number or a Kubernetes quantity string ("500m", "2k", "1Gi") as a float."""
    if isinstance(raw, bool):
        raise SpecError(f"{path}: expected a number or a quantity like '500m', got {raw!r}")
    if isinstance(raw, (int, float)):
        value = float(raw)
    elif isinstance(raw, str) and (m := _QUANTITY.match(raw.strip())):
        value = float(m.group(1)) * _QUANTITY_FACTOR[m.group(2)]
    else:
        raise SpecError(f"{path}: expected a number or a quantity like '500m', got {raw!r}")
    if not math.isfinite(value):
        raise SpecError(f"{path}: must be a finite number, got {raw!r}")
    return value


def parse_spec(obj: Mapping[str, Any]) -> GPUAutoscalerSpec:
    """Parse a GPUAutoscaler object (with ``spec``) or just its spec into a validated spec."""
    if not isinstance(obj, Mapping):
        raise SpecError("spec: expected a mapping (a GPUAutoscaler object or its spec)")
    if "spec" in obj and isinstance(obj.get("spec"), Mapping):
        obj = obj["spec"]
    _reject_unknown(
        obj, "spec", {"scaleTargetRef", "minReplicas", "maxReplicas", "metrics", "behavior", "slo"}
    )
    ref = _parse_target_ref(_required(obj, "scaleTargetRef", "spec"), "spec.scaleTargetRef")
    min_replicas = _int(obj.get("minReplicas", 1), "spec.minReplicas", minimum=0)
    max_replicas = _int(_required(obj, "maxReplicas", "spec"), "spec.maxReplicas", minimum=1)
    if max_replicas < min_replicas:
        raise SpecError(
            f"spec.maxReplicas: {max_replicas} is below minReplicas {min_replicas}; "
            "raise maxReplicas or lower minReplicas"
        )
    slo = _parse_slo(obj["slo"], "spec.slo") if obj.get("slo") is not None else None
    if slo is not None and min_replicas == 0:
        raise SpecError(
            "spec.minReplicas: 0 cannot hold a latency SLO (a request arriving at zero replicas "
            "waits for a cold start); set minReplicas >= 1 or remove spec.slo"
        )
    raw_metrics = obj.get("metrics") if slo is not None else _required(obj, "metrics", "spec")
    if raw_metrics is None:
        raw_metrics = []
    if not isinstance(raw_metrics, list) or (not raw_metrics and slo is None):
        raise SpecError("spec.metrics: expected a non-empty list of metrics")
    metrics = tuple(_parse_metric(m, f"spec.metrics[{i}]") for i, m in enumerate(raw_metrics))
    names = [m.name for m in metrics]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise SpecError(f"spec.metrics[{i}].name: {name!r} is used twice; names must be unique")
    if slo is not None and slo.rate_name in names:
        raise SpecError(
            f"spec.slo.rateName: {slo.rate_name!r} is also a metric's name; forecasts are looked "
            "up by name, so give the SLO's rate another one"
        )
    if min_replicas == 0 and all(m.source == "Pods" for m in metrics):
        raise SpecError(
            "spec.minReplicas: 0 needs at least one Object or External metric, because Pods "
            "metrics have no pods to read at zero replicas; set minReplicas >= 1"
        )
    behavior, tol_up, tol_down = _parse_behavior(obj.get("behavior"), "spec.behavior")
    return GPUAutoscalerSpec(
        scale_target_ref=ref,
        min_replicas=min_replicas,
        max_replicas=max_replicas,
        metrics=metrics,
        behavior=behavior,
        tolerance_up=tol_up,
        tolerance_down=tol_down,
        slo=slo,
    )


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


def _parse_target_ref(raw: Any, path: str) -> ScaleTargetRef:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{path}: expected a mapping with apiVersion, kind and name")
    _reject_unknown(raw, path, {"apiVersion", "kind", "name"})
    return ScaleTargetRef(
        api_version=_str(raw.get("apiVersion", "apps/v1"), f"{path}.apiVersion"),
        kind=_str(_required(raw, "kind", path), f"{path}.kind"),
        name=_str(_required(raw, "name", path), f"{path}.name"),
    )


def _unknown_source_message(path: str, source: Any) -> str:
    hint = ""
    if source in ("Resource", "ContainerResource"):
        hint = (
            "; there is no resource metrics API here: a resource's utilization is a Pods metric "
            "with a Utilization target (type: Pods, target: {type: Utilization, "
            "averageUtilization: 70}, resource: nvidia.com/gpu, optionally container: NAME)"
        )
    return f"{path}: {source!r} is not one of {', '.join(SOURCES)}{hint}"


def _parse_metric(raw: Any, path: str) -> MetricSpec:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{path}: expected a mapping with name, type, query and target")
    _reject_unknown(
        raw, path, {"name", "type", "query", "target", "prediction", "resource", "container"}
    )
    name = _str(_required(raw, "name", path), f"{path}.name")
    source = raw.get("type", "Pods")
    if source not in SOURCES:
        raise SpecError(_unknown_source_message(f"{path}.type", source))
    query = _str(_required(raw, "query", path), f"{path}.query")
    target = _required(raw, "target", path)
    tpath = f"{path}.target"
    if not isinstance(target, Mapping):
        raise SpecError(f"{tpath}: expected a mapping like {{type: AverageValue, averageValue: 5}}")
    target_type = _choice(_required(target, "type", tpath), f"{tpath}.type", TARGET_TYPES)
    if target_type not in ALLOWED_TARGETS[source]:
        raise SpecError(
            f"{tpath}.type: {target_type} is not allowed for a {source} metric; "
            f"use one of {', '.join(ALLOWED_TARGETS[source])}"
        )
    key = _TARGET_KEY[target_type]
    _reject_unknown(target, tpath, {"type", key})
    value = parse_quantity(_required(target, key, tpath), f"{tpath}.{key}")
    if value <= 0:
        raise SpecError(f"{tpath}.{key}: must be > 0, got {value:g}")
    prediction = None
    if raw.get("prediction") is not None:
        prediction = _parse_prediction(raw["prediction"], f"{path}.prediction")
    for key in ("resource", "container"):
        if raw.get(key) is not None and target_type != "Utilization":
            raise SpecError(
                f"{path}.{key}: only a Utilization target is a share of a resource request; "
                "remove it"
            )
    resource = _str(raw.get("resource", DEFAULT_RESOURCE), f"{path}.resource")
    container = raw.get("container")
    if container is not None:
        container = _str(container, f"{path}.container")
    return MetricSpec(
        name,
        query,
        source,  # type: ignore[arg-type]
        target_type,  # type: ignore[arg-type]
        value,
        prediction,
        resource,
        container,
    )


def _parse_prediction(raw: Any, path: str) -> Prediction:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{path}: expected a mapping with horizonSeconds, quantile, warmupSeconds")
    _reject_unknown(raw, path, {"enabled", "query", "horizonSeconds", "quantile", "warmupSeconds"})
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise SpecError(f"{path}.enabled: expected true or false, got {enabled!r}")
    query = raw.get("query")
    if query is not None:
        query = _str(query, f"{path}.query")
    horizon = _float(raw.get("horizonSeconds", 300.0), f"{path}.horizonSeconds")
    if horizon <= 0:
        raise SpecError(f"{path}.horizonSeconds: must be > 0, got {horizon:g}")
    quantile = _float(raw.get("quantile", 0.9), f"{path}.quantile")
    if not 0.5 <= quantile < 1.0:
        raise SpecError(f"{path}.quantile: must be in [0.5, 1), got {quantile:g}")
    warmup = _float(raw.get("warmupSeconds", 0.0), f"{path}.warmupSeconds")
    if warmup < 0:
        raise SpecError(f"{path}.warmupSeconds: must be >= 0, got {warmup:g}")
    return Prediction(enabled, query, horizon, quantile, warmup)


_SELECTOR = re.compile(r"^\{.*\}$", re.DOTALL)


def _parse_slo(raw: Any, path: str) -> SloSpec:
    if not isinstance(raw, Mapping):
        raise SpecError(
            f"{path}: expected a mapping with latencySeconds (and optionally quantile, ...)"
        )
    _reject_unknown(
        raw,
        path,
        {
            "latencySeconds",
            "quantile",
            "rateQuery",
            "rateName",
            "selector",
            "serviceModel",
            "prediction",
        },
    )
    latency = _float(_required(raw, "latencySeconds", path), f"{path}.latencySeconds")
    if latency <= 0:
        raise SpecError(f"{path}.latencySeconds: must be > 0 seconds, got {latency:g}")
    quantile = _float(raw.get("quantile", DEFAULT_SLO_QUANTILE), f"{path}.quantile")
    if not 0.5 <= quantile < 1.0:
        raise SpecError(f"{path}.quantile: must be in [0.5, 1), e.g. 0.99, got {quantile:g}")
    selector = raw.get("selector", "")
    if selector:
        selector = _str(selector, f"{path}.selector").strip()
        if not _SELECTOR.match(selector):
            raise SpecError(
                f"{path}.selector: expected PromQL label matchers in braces, e.g. "
                f"'{{namespace=\"ml\"}}', got {selector!r}"
            )
    model = raw.get("serviceModel") or {}
    if not isinstance(model, Mapping):
        raise SpecError(
            f"{path}.serviceModel: expected a mapping of fixedSecondsQuery, "
            "perItemSecondsQuery, maxBatchQuery"
        )
    mpath = f"{path}.serviceModel"
    _reject_unknown(model, mpath, {"fixedSecondsQuery", "perItemSecondsQuery", "maxBatchQuery"})

    def query(raw_query: Any, where: str, default: str) -> str:
        return default if raw_query is None else _str(raw_query, where)

    prediction = None
    if raw.get("prediction") is not None:
        prediction = _parse_prediction(raw["prediction"], f"{path}.prediction")
    return SloSpec(
        latency_seconds=latency,
        quantile=quantile,
        rate_query=query(
            raw.get("rateQuery"),
            f"{path}.rateQuery",
            f"sum(rate({BATCHER_REQUESTS}{selector}[1m]))",
        ),
        fixed_seconds_query=query(
            model.get("fixedSecondsQuery"),
            f"{mpath}.fixedSecondsQuery",
            f"avg({BATCHER_COST_FIXED}{selector})",
        ),
        per_item_seconds_query=query(
            model.get("perItemSecondsQuery"),
            f"{mpath}.perItemSecondsQuery",
            f"avg({BATCHER_COST_PER_ITEM}{selector})",
        ),
        max_batch_query=query(
            model.get("maxBatchQuery"),
            f"{mpath}.maxBatchQuery",
            f"min({BATCHER_MAX_BATCH}{selector})",
        ),
        rate_name=_str(raw.get("rateName", DEFAULT_SLO_RATE_NAME), f"{path}.rateName"),
        prediction=prediction,
    )


def _parse_behavior(raw: Any, path: str) -> tuple[Behavior | None, float, float]:
    if raw is None:
        return None, DEFAULT_TOLERANCE, DEFAULT_TOLERANCE
    if not isinstance(raw, Mapping):
        raise SpecError(f"{path}: expected a mapping with scaleUp and/or scaleDown")
    _reject_unknown(raw, path, {"scaleUp", "scaleDown"})
    up, tol_up = _parse_rules(raw.get("scaleUp"), f"{path}.scaleUp", default_scale_up_rules())
    down, tol_down = _parse_rules(
        raw.get("scaleDown"), f"{path}.scaleDown", default_scale_down_rules()
    )
    return Behavior(scale_up=up, scale_down=down), tol_up, tol_down


def _parse_rules(raw: Any, path: str, default: HPAScalingRules) -> tuple[HPAScalingRules, float]:
    """Fill unset fields from ``default`` field by field, as the API server's defaulting does."""
    if raw is None:
        return default, DEFAULT_TOLERANCE
    if not isinstance(raw, Mapping):
        raise SpecError(f"{path}: expected a mapping (stabilizationWindowSeconds, policies, ...)")
    _reject_unknown(
        raw, path, {"stabilizationWindowSeconds", "selectPolicy", "policies", "tolerance"}
    )
    window = default.stabilization_window_seconds
    if raw.get("stabilizationWindowSeconds") is not None:
        window = _int(
            raw["stabilizationWindowSeconds"],
            f"{path}.stabilizationWindowSeconds",
            minimum=0,
            maximum=MAX_STABILIZATION_WINDOW_SECONDS,
        )
    select = default.select_policy
    if raw.get("selectPolicy") is not None:
        select = _choice(raw["selectPolicy"], f"{path}.selectPolicy", ("Max", "Min", "Disabled"))
    policies = default.policies
    if raw.get("policies") is not None:
        items = raw["policies"]
        if not isinstance(items, list):
            raise SpecError(f"{path}.policies: expected a list of {{type, value, periodSeconds}}")
        policies = tuple(_parse_policy(p, f"{path}.policies[{i}]") for i, p in enumerate(items))
        if not policies:
            raise SpecError(
                f"{path}.policies: must specify at least one policy (as the Kubernetes API "
                "requires); remove the key to get the defaults, or set selectPolicy: Disabled "
                "with a policy to stop scaling in this direction"
            )
    tolerance = DEFAULT_TOLERANCE
    if raw.get("tolerance") is not None:
        tolerance = parse_quantity(raw["tolerance"], f"{path}.tolerance")
        if tolerance < 0:
            raise SpecError(f"{path}.tolerance: must be >= 0, got {tolerance:g}")
    return HPAScalingRules(window, select, policies), tolerance  # type: ignore[arg-type]


def _parse_policy(raw: Any, path: str) -> HPAScalingPolicy:
    if not isinstance(raw, Mapping):
        raise SpecError(f"{path}: expected a mapping {{type: Pods|Percent, value, periodSeconds}}")
    _reject_unknown(raw, path, {"type", "value", "periodSeconds"})
    kind = _choice(_required(raw, "type", path), f"{path}.type", ("Pods", "Percent"))
    value = _int(_required(raw, "value", path), f"{path}.value", minimum=1)
    period = _int(
        _required(raw, "periodSeconds", path),
        f"{path}.periodSeconds",
        minimum=1,
        maximum=MAX_POLICY_PERIOD_SECONDS,
    )
    return HPAScalingPolicy(kind, value, period)  # type: ignore[arg-type]


def _required(raw: Mapping[str, Any], key: str, path: str) -> Any:
    if raw.get(key) is None:
        raise SpecError(f"{path}.{key}: is required")
    return raw[key]


def _reject_unknown(raw: Mapping[str, Any], path: str, known: set[str]) -> None:
    unknown = sorted(str(k) for k in raw if k not in known)
    if unknown:
        raise SpecError(
            f"{path}.{unknown[0]}: unknown field; valid fields are {', '.join(sorted(known))}"
        )


def _str(raw: Any, path: str) -> str:
    if not isinstance(raw, str) or not raw.strip():
        raise SpecError(f"{path}: expected a non-empty string, got {raw!r}")
    return raw


def _choice(raw: Any, path: str, choices: tuple[str, ...]) -> str:
    if raw not in choices:
        raise SpecError(f"{path}: {raw!r} is not one of {', '.join(choices)}")
    return raw


def _int(raw: Any, path: str, minimum: int | None = None, maximum: int | None = None) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int):
        raise SpecError(f"{path}: expected an integer, got {raw!r}")
    if minimum is not None and raw < minimum:
        raise SpecError(f"{path}: must be >= {minimum}, got {raw}")
    if maximum is not None and raw > maximum:
        raise SpecError(f"{path}: must be <= {maximum}, got {raw}")
    return raw


def _float(raw: Any, path: str) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or not math.isfinite(raw):
        raise SpecError(f"{path}: expected a number, got {raw!r}")
    return float(raw)
