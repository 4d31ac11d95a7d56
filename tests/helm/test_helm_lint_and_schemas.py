"""The chart lints strictly and every object it renders is valid for Kubernetes and the operator.

Core kinds are checked with kubernetes-validate in strict mode (unknown fields are errors)
against the lowest Kubernetes the chart supports and the newest the validator knows;
ServiceMonitor and PrometheusRule with prometheus-operator's models, round-tripped so that a
field the models do not know (and would silently drop) fails too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.helm.chart import (
    CHART,
    KUBE_VERSIONS,
    MONITORING_API,
    NAMESPACE,
    ci_values_files,
    helm,
    of_kind,
    prometheus_operator,
    render,
)

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]

VALUES_CASES = [pytest.param(None, id="default")] + [
    pytest.param(path, id=path.name) for path in ci_values_files()
]
OPERATOR_KINDS = ("ServiceMonitor", "PodMonitor", "PrometheusRule")


def _values(path: Path | None) -> list[Path]:
    return [path] if path else []


def test_there_are_ci_values_files_to_exercise_the_options():
    names = {p.name for p in ci_values_files()}
    assert len(names) >= 3, names


@pytest.mark.parametrize("values", VALUES_CASES)
def test_helm_lint_strict(values):
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    if values:
        args += ["-f", str(values)]
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def _strip_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _strip_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_strip_nulls(v) for v in value]
    return value


def validate_operator_object(obj: dict[str, Any]) -> None:
    """Validate with the operator's models; anything the model dropped was an unknown field."""
    assert obj["kind"] in OPERATOR_KINDS, obj["kind"]
    model = getattr(prometheus_operator(), obj["kind"]).model_validate(obj)
    dumped = _strip_nulls(model.model_dump(by_alias=True, exclude_unset=True, mode="json"))
    assert dumped == _strip_nulls(obj), f"{obj['kind']} has fields the operator does not know"


@pytest.mark.parametrize("monitoring_api", [False, True], ids=["plain", "operator"])
@pytest.mark.parametrize("values", VALUES_CASES)
def test_rendered_objects_are_valid(values, monitoring_api):
    objects = render(_values(values), monitoring_api=monitoring_api)
    assert objects
    for obj in objects:
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        if obj["apiVersion"] == MONITORING_API:
            validate_operator_object(obj)
            continue
        for version in KUBE_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where} is not valid for Kubernetes {version}: {exc.message}")


def test_the_operator_check_catches_an_unknown_field():
    (monitor, *_) = of_kind(render(monitoring_api=True), "ServiceMonitor")
    monitor = yaml.safe_load(yaml.safe_dump(monitor))
    monitor["spec"]["endpoints"][0]["scrapeTimout"] = "5s"  # misspelt
    with pytest.raises(AssertionError, match="fields the operator does not know"):
        validate_operator_object(monitor)


def test_the_crds_ship_with_the_chart_and_are_valid():
    objects = render(extra=("--include-crds",))
    crds = {c["metadata"]["name"]: c for c in of_kind(objects, "CustomResourceDefinition")}
    files = {
        "gpuautoscalers.autoscaling.autoglm.io": "gpuautoscaler.yaml",
        "gpubudgets.autoscaling.autoglm.io": "gpubudget.yaml",
    }
    assert set(crds) == set(files)
    for name, file in files.items():
        source = yaml.safe_load((CHART.parents[1] / "autoscaler/crd" / file).read_text())
        assert crds[name] == source  # the same file (crds/ links to it), not a copy
        for version in KUBE_VERSIONS:
            kubernetes_validate.validate(crds[name], version, strict=True)


@pytest.mark.parametrize("values", VALUES_CASES)
def test_operator_kinds_follow_the_api_in_auto_mode(values):
    plain = render(_values(values))
    with_api = render(_values(values), monitoring_api=True)
    forced = (
        yaml.safe_load(values.read_text()).get("monitoring", {}).get("enabled")
        if values
        else "auto"
    )
    operator_kinds = {"ServiceMonitor", "PrometheusRule"}
    if forced == "auto":
        assert not [o for o in plain if o["kind"] in operator_kinds]
    if forced is not False:
        assert of_kind(with_api, "PrometheusRule")
        assert of_kind(with_api, "ServiceMonitor")
    else:
        assert not [o for o in with_api if o["kind"] in operator_kinds]
