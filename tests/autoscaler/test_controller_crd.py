"""The GPUAutoscaler CRD: valid for the API server, and agreeing with the parser and the status."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import kubernetes_validate
import yaml

from autoscaler.spec import load_spec_file, parse_spec

CRD_DIR = Path(__file__).resolve().parents[2] / "autoscaler" / "crd"


def _crd() -> dict:
    return yaml.safe_load((CRD_DIR / "gpuautoscaler.yaml").read_text())


def _schema() -> dict:
    (version,) = _crd()["spec"]["versions"]
    return version["schema"]["openAPIV3Schema"]


def _as_json_schema(node):
    """OpenAPI v3.0 as JSON Schema: nullable becomes a null type; x-kubernetes-* keys go."""
    if isinstance(node, list):
        return [_as_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _as_json_schema(v) for k, v in node.items() if not k.startswith("x-kubernetes")}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if out.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if out.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    return out


def test_the_crd_is_a_valid_apiextensions_v1_object():
    kubernetes_validate.validate(_crd(), "1.30", strict=True)
    crd = _crd()
    assert crd["spec"]["versions"][0]["subresources"] == {"status": {}}
    assert crd["metadata"]["name"] == "gpuautoscalers.autoscaling.autoglm.io"


def test_the_example_fits_the_schema_and_the_parser():
    example = yaml.safe_load((CRD_DIR / "example.yaml").read_text())
    jsonschema.validate(example, _as_json_schema(_schema()))
    spec = load_spec_file(CRD_DIR / "example.yaml")
    assert spec.metrics[1].prediction.effective_horizon_seconds == 300


def test_the_schema_rejects_what_the_parser_rejects():
    example = yaml.safe_load((CRD_DIR / "example.yaml").read_text())
    example["spec"]["metrics"][0]["type"] = "Resource"
    try:
        jsonschema.validate(example, _as_json_schema(_schema()))
    except jsonschema.ValidationError as exc:
        assert "Resource" in str(exc.message)
    else:
        raise AssertionError("the schema accepted an unknown metric type")
    try:
        parse_spec(example)
    except ValueError as exc:
        assert "spec.metrics[0].type" in str(exc)
    else:
        raise AssertionError("the parser accepted an unknown metric type")


def test_the_status_the_controller_writes_fits_the_schema():
    """A status as written by test_controller's scale-up (shape kept in sync by this test)."""
    from tests.autoscaler.test_controller import Harness, autoscaler_object

    h = Harness()
    try:
        h.deployment("llm", 2, [140.0, 140.0])
        h.fake.add_custom("gpuautoscalers", autoscaler_object())
        h.controller.reconcile_all()
        obj = h.fake.get("gpuautoscalers", "ml", "llm")
    finally:
        h.close()
    jsonschema.validate(obj, _as_json_schema(_schema()))
    assert obj["status"]["lastDecision"]["driver"]


def _undeclared(value, schema, path="") -> list[str]:
    """Keys in ``value`` that the structural schema does not declare (the API server would
    prune them from what the controller writes)."""
    if isinstance(value, dict):
        props = schema.get("properties")
        if props is None:
            return []
        out = []
        for key, item in value.items():
            if key not in props:
                out.append(f"{path}.{key}")
            else:
                out += _undeclared(item, props[key], f"{path}.{key}")
        return out
    if isinstance(value, list) and "items" in schema:
        return [p for item in value for p in _undeclared(item, schema["items"], f"{path}[]")]
    return []


def test_an_slo_autoscaler_and_its_status_fit_the_schema_without_pruning():
    from autoscaler.controller.service_model import PrometheusServiceModels
    from tests.autoscaler.test_controller import Harness
    from tests.autoscaler.test_controller_slo import (
        BEST_EFFORT_SLICE,
        MODEL,
        RATE,
        serve_model,
        slo_object,
    )

    h = Harness()
    h.reconciler.service_models = PrometheusServiceModels(h.client)
    try:
        h.deployment("llm", 2, [70.0, 70.0])
        serve_model(h, MODEL)
        h.prom.answers[RATE] = [({}, 100.0)]
        h.prom.answers[BEST_EFFORT_SLICE] = [({}, 0.1)]  # every status.slo field is written
        h.fake.add_custom("gpuautoscalers", slo_object(prediction={"horizonSeconds": 60}))
        h.controller.reconcile_all()
        obj = h.fake.get("gpuautoscalers", "ml", "llm")
    finally:
        h.close()
    jsonschema.validate(obj, _as_json_schema(_schema()))
    assert obj["status"]["slo"]["mode"] == "slo"
    assert obj["status"]["slo"]["serviceModel"]["bestEffortQuantumSeconds"] == 0.1
    assert _undeclared(obj["spec"], _schema()["properties"]["spec"], "spec") == []
    assert _undeclared(obj["status"], _schema()["properties"]["status"], "status") == []
    parse_spec(obj)  # and the parser takes what the schema takes
