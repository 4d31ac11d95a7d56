"""The GPUAutoscaler CRD's spec schema is the parser's model: generated, never edited by hand."""

from __future__ import annotations

import copy

import jsonschema
import pytest
import yaml

from autoscaler.crd import generate
from autoscaler.spec import SpecError, parse_spec
from tests.autoscaler.test_controller_crd import CRD_DIR, _as_json_schema, _schema


def test_the_crd_file_is_what_the_generator_writes():
    """Fails when autoscaler/spec.py's models and the CRD drift apart; the fix is to run
    python -m autoscaler.crd.generate and commit the file."""
    assert generate.main(["--check"]) == 0


def test_generating_twice_changes_nothing():
    once = generate.rendered_crd((CRD_DIR / "gpuautoscaler.yaml").read_text())
    assert generate.rendered_crd(once) == once


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
