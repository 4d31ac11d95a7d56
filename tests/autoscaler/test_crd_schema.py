"""The CRDs' spec schemas are the parsers' models: generated, never edited by hand."""

from __future__ import annotations

import copy

import jsonschema
import pytest
import yaml

from autoscaler.controller.budget import BudgetSpecError, parse_budget
from autoscaler.crd import generate
from autoscaler.spec import SpecError, parse_spec
from tests.autoscaler.test_controller_crd import CRD_DIR, _as_json_schema, _schema


def test_the_crd_files_are_what_the_generator_writes():
    """Fails when the spec models (autoscaler/spec.py, autoscaler/budget_spec.py) and the CRDs
    drift apart; the fix is to run python -m autoscaler.crd.generate and commit the files."""
    assert generate.main(["--check"]) == 0


@pytest.mark.parametrize("path", list(generate.CRDS), ids=lambda p: p.name)
def test_generating_twice_changes_nothing(path):
    model = generate.CRDS[path]
    once = generate.rendered_crd(path.read_text(), model)
    assert generate.rendered_crd(once, model) == once


def test_a_changed_model_is_drift(tmp_path, monkeypatch):
    """The check compares the files with the models, not with themselves."""
    stale = tmp_path / "gpuautoscaler.yaml"
    stale.write_text(
        (CRD_DIR / "gpuautoscaler.yaml").read_text().replace("maximum: 3600", "maximum: 60")
    )
    monkeypatch.setattr(generate, "CRDS", {stale: generate.CRDS[CRD_DIR / "gpuautoscaler.yaml"]})
    assert generate.main(["--check"]) == 1
    assert generate.main([]) == 0 and generate.main(["--check"]) == 0


def test_the_generated_schema_is_structural():
    """What the API server refuses in a structural schema does not reach the file."""
    text = yaml.safe_dump(_schema()["properties"]["spec"])
    for refused in ("$ref", "$defs", "additionalProperties", "title:", "type: 'null'"):
        assert refused not in text


def _example() -> dict:
    return yaml.safe_load((CRD_DIR / "example.yaml").read_text())


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("maxReplicas",), 0),
        (("minReplicas",), -1),
        (("maxReplicas",), "3"),
        (("metrics", 0, "type"), "Resource"),
        (("metrics", 0, "name"), ""),
        (("metrics", 1, "prediction", "quantile"), 1.0),
        (("metrics", 1, "prediction", "horizonSeconds"), 0),
        (("metrics", 1, "prediction", "warmupSeconds"), -1),
        (("behavior", "scaleDown", "policies"), []),
        (("behavior", "scaleDown", "policies", 0, "periodSeconds"), 1801),
        (("behavior", "scaleDown", "selectPolicy"), "Most"),
        (("behavior", "scaleDown", "stabilizationWindowSeconds"), 3601),
    ],
)
def test_the_schema_and_the_parser_refuse_the_same_values(path, value):
    obj = _example()
    node = obj["spec"]
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, _as_json_schema(_schema()))
    with pytest.raises(SpecError):
        parse_spec(copy.deepcopy(obj))


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("resources",), {}),
        (("tenants", 0, "weight"), 0),
        (("tenants", 0, "autoscaler"), ""),
        (("tenants", 0, "priority"), "high"),
        (("default", "preempt"), "yes"),
    ],
)
def test_the_budget_schema_and_parser_refuse_the_same_values(path, value):
    obj = yaml.safe_load((CRD_DIR / "gpubudget-example.yaml").read_text())
    node = obj["spec"]
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value
    crd = yaml.safe_load((CRD_DIR / "gpubudget.yaml").read_text())
    (version,) = crd["spec"]["versions"]
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(obj, _as_json_schema(version["schema"]["openAPIV3Schema"]))
    with pytest.raises(BudgetSpecError, match=r"^spec\."):
        parse_budget(copy.deepcopy(obj))


@pytest.mark.parametrize("quantity", [-1, "lots", "-2"])
def test_a_budget_quantity_the_schema_cannot_bound_is_refused_by_the_parser(quantity):
    """int-or-string has no minimum in a structural schema: the controller refuses these and
    reports the budget invalid."""
    obj = yaml.safe_load((CRD_DIR / "gpubudget-example.yaml").read_text())
    obj["spec"]["resources"]["nvidia.com/gpu"] = quantity
    with pytest.raises(BudgetSpecError, match=r"^spec\.resources\.nvidia\.com/gpu: "):
        parse_budget(obj)
