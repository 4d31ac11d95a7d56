"""Parsing the GPUAutoscaler spec: defaults as the API server fills them, errors with paths."""

from __future__ import annotations

import pytest

from autoscaler.spec import (
    MetricSpec,
    SpecError,
    default_scale_down_rules,
    default_scale_up_rules,
    load_spec_file,
    parse_quantity,
    parse_spec,
)

FULL = """
apiVersion: autoglm.io/v1alpha1
kind: GPUAutoscaler
metadata: {name: llm}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: llm}
  minReplicas: 2
  maxReplicas: 16
  metrics:
    - name: gpu_util
      type: Pods
      query: avg by (pod) (DCGM_FI_DEV_GPU_UTIL)
      target: {type: Utilization, averageUtilization: 70}
      prediction: {horizonSeconds: 60, quantile: 0.95, warmupSeconds: 180}
    - name: queue
      type: External
      query: sum(autoglm_batcher_queue_items)
      target: {type: AverageValue, averageValue: 500m}
  behavior:
    scaleDown:
      stabilizationWindowSeconds: 600
      policies: [{type: Pods, value: 1, periodSeconds: 60}]
      tolerance: 0.05
    scaleUp:
      selectPolicy: Min
"""


def test_full_object_from_yaml_file(tmp_path):
    path = tmp_path / "gpa.yaml"
    path.write_text(FULL)
    spec = load_spec_file(path)
    assert (spec.min_replicas, spec.max_replicas) == (2, 16)
    util, queue = spec.metrics
    assert util.target_type == "Utilization" and util.target_value == 70
    assert util.prediction.effective_horizon_seconds == 180  # never shorter than warm-up
    assert util.prediction_query == util.query
    assert queue.source == "External" and queue.target_value == pytest.approx(0.5)
    assert queue.prediction is None
    down = spec.behavior.scale_down
    assert down.stabilization_window_seconds == 600 and down.policies[0].type == "Pods"
    assert spec.tolerance_down == 0.05 and spec.tolerance_up == 0.1
    up = spec.behavior.scale_up
    # select policy set, the rest defaulted field by field
    assert up.select_policy == "Min" and up.stabilization_window_seconds == 0
    assert [(p.type, p.value, p.period_seconds) for p in up.policies] == [
        ("Pods", 4, 15),
        ("Percent", 100, 15),
    ]


def test_bare_spec_gets_kubernetes_defaults():
    spec = parse_spec(
        {
            "scaleTargetRef": {"kind": "StatefulSet", "name": "s"},
            "maxReplicas": 3,
            "metrics": [
                {"name": "m", "query": "q", "target": {"type": "AverageValue", "averageValue": 1}}
            ],
        }
    )
    assert spec.min_replicas == 1
    assert spec.scale_target_ref.api_version == "apps/v1"
    # no behavior section: the HPA's rules for that case apply, not the behavior defaults
    assert spec.behavior is None
    assert (spec.tolerance_up, spec.tolerance_down) == (0.1, 0.1)


@pytest.mark.parametrize(
    ("patch", "path"),
    [
        ({"maxReplicas": 0}, "spec.maxReplicas"),
        ({"minReplicas": 5, "maxReplicas": 3}, "spec.maxReplicas"),
        ({"metrics": []}, "spec.metrics"),
        ({"minReplicas": 0}, "spec.minReplicas"),
        ({"bogus": 1}, "spec.bogus"),
        (
            {"metrics": [{"name": "m", "query": "q", "target": {"type": "Value", "value": 1}}]},
            "spec.metrics[0].target.type",
        ),
        (
            {
                "metrics": [
                    {
                        "name": "m",
                        "query": "q",
                        "type": "Object",
                        "target": {"type": "Value", "value": "abc"},
                    }
                ]
            },
            "spec.metrics[0].target.value",
        ),
        (
            {
                "metrics": [
                    {
                        "name": "m",
                        "query": "q",
                        "type": "Object",
                        "target": {"type": "Value", "value": -1},
                    }
                ]
            },
            "spec.metrics[0].target.value",
        ),
        (
            {
                "behavior": {
                    "scaleUp": {"policies": [{"type": "Pods", "value": 1, "periodSeconds": 0}]}
                }
            },
            "spec.behavior.scaleUp.policies[0].periodSeconds",
        ),
        (
            {"behavior": {"scaleDown": {"selectPolicy": "Most"}}},
            "spec.behavior.scaleDown.selectPolicy",
        ),
        (
            {
                "metrics": [
                    {
                        "name": "m",
                        "query": "q",
                        "target": {"type": "AverageValue", "averageValue": 1},
                        "prediction": {"quantile": 1.5},
                    }
                ]
            },
            "spec.metrics[0].prediction.quantile",
        ),
    ],
)
def test_errors_name_the_field(patch, path):
    raw = {
        "scaleTargetRef": {"kind": "Deployment", "name": "d"},
        "maxReplicas": 3,
        "metrics": [
            {"name": "m", "query": "q", "target": {"type": "AverageValue", "averageValue": 1}}
        ],
    }
    raw.update(patch)
    with pytest.raises(SpecError) as err:
        parse_spec(raw)
    assert str(err.value).startswith(path + ":")


def test_duplicate_metric_names_rejected():
    m = {"name": "m", "query": "q", "target": {"type": "AverageValue", "averageValue": 1}}
    with pytest.raises(SpecError, match=r"spec.metrics\[1\].name"):
        parse_spec(
            {"scaleTargetRef": {"kind": "D", "name": "d"}, "maxReplicas": 2, "metrics": [m, m]}
        )


def test_quantities():
    assert parse_quantity("250m", "x") == pytest.approx(0.25)
    assert parse_quantity("2k", "x") == 2000
    assert parse_quantity("1Gi", "x") == 1024**3
    assert parse_quantity(3, "x") == 3.0
    with pytest.raises(SpecError, match="x: expected"):
        parse_quantity("3 apples", "x")


def test_unreadable_and_non_mapping_files(tmp_path):
    with pytest.raises(SpecError, match="cannot read"):
        load_spec_file(tmp_path / "missing.yaml")
    bad = tmp_path / "list.yaml"
    bad.write_text("- 1\n- 2\n")
    with pytest.raises(SpecError, match="must hold"):
        load_spec_file(bad)


BASE = {
    "scaleTargetRef": {"kind": "Deployment", "name": "d"},
    "maxReplicas": 5,
    "metrics": [{"name": "m", "query": "q", "target": {"type": "AverageValue", "averageValue": 1}}],
}


@pytest.mark.parametrize("source", ["Resource", "ContainerResource", "Bogus"])
def test_unknown_metric_types_are_refused_when_parsed(source):
    metric = {
        "name": "m",
        "type": source,
        "query": "q",
        "target": {"type": "Utilization", "averageUtilization": 50},
    }
    with pytest.raises(SpecError, match=r"spec.metrics\[0\].type: .* is not one of") as err:
        parse_spec({**BASE, "metrics": [metric]})
    if source != "Bogus":  # the message says what to write instead
        assert "Pods metric with a Utilization target" in str(err.value)


def test_unknown_metric_types_are_refused_when_constructed():
    """A spec built in code (simulator, library use) fails at construction, not in a tick."""
    with pytest.raises(SpecError, match="'Resource' is not one of Pods, Object, External"):
        MetricSpec("m", "q", "Resource", "Utilization", 50.0)  # type: ignore[arg-type]
    with pytest.raises(SpecError, match="not allowed for a Object metric"):
        MetricSpec("m", "q", "Object", "Utilization", 50.0)


def test_behavior_absent_partial_and_empty_policies():
    assert parse_spec(BASE).behavior is None  # the HPA's legacy rules apply
    empty = parse_spec({**BASE, "behavior": {}}).behavior
    assert empty.scale_up == default_scale_up_rules()
    assert empty.scale_down == default_scale_down_rules()
    partial = parse_spec({**BASE, "behavior": {"scaleDown": {"stabilizationWindowSeconds": 60}}})
    assert partial.behavior.scale_up == default_scale_up_rules()
    assert partial.behavior.scale_down.stabilization_window_seconds == 60
    assert partial.behavior.scale_down.policies == default_scale_down_rules().policies
    for select in ("Max", "Disabled"):
        with pytest.raises(SpecError, match=r"scaleUp\.policies: must specify at least one policy"):
            parse_spec({**BASE, "behavior": {"scaleUp": {"policies": [], "selectPolicy": select}}})


def test_utilization_names_its_resource_and_optionally_a_container():
    metric = {
        "name": "gpu",
        "query": "q",
        "resource": "nvidia.com/gpu",
        "container": "server",
        "target": {"type": "Utilization", "averageUtilization": 70},
    }
    spec = parse_spec({**BASE, "metrics": [metric]})
    assert (spec.metrics[0].resource, spec.metrics[0].container) == ("nvidia.com/gpu", "server")
    assert (
        parse_spec({**BASE, "metrics": [{**metric, "container": None}]}).metrics[0].container
        is None
    )
    plain = {
        "name": "q",
        "query": "q",
        "resource": "cpu",
        "target": {"type": "AverageValue", "averageValue": 1},
    }
    with pytest.raises(SpecError, match=r"spec.metrics\[0\].resource: only a Utilization"):
        parse_spec({**BASE, "metrics": [plain]})
