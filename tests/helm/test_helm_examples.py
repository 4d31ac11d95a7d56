"""The examples the chart ships (sidecar, prometheus-adapter, KEDA) are valid and name series
that exist: Kubernetes objects pass strict validation, PromQL passes promtool, the batcher's
flags parse, and the forecast labels are those the predictor publishes."""

from __future__ import annotations

import argparse
import re
import subprocess

import kubernetes_validate
import pytest
import yaml

from autoglm.config import add_config_arguments, config_from_args
from batcher.config import BatcherConfig
from predictor.metrics import ForecastCollector
from tests.helm.chart import CHART, KUBE_VERSIONS, prometheus_operator

pytestmark = [pytest.mark.live, pytest.mark.timeout(60)]

EXAMPLES = CHART / "examples"


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((EXAMPLES / name).read_text()) if d]


def _forecast_labels() -> set[str]:
    (upper,) = [f for f in ForecastCollector().collect() if f.name == "autoglm_forecast_upper"]
    return set(upper._labelnames)


def _promtool_accepts(tmp_path, expressions: list[str]) -> None:
    rules = {
        "groups": [
            {
                "name": "examples",
                "rules": [{"record": f"example:{i}", "expr": e} for i, e in enumerate(expressions)],
            }
        ]
    }
    path = tmp_path / "examples.yaml"
    path.write_text(yaml.safe_dump(rules))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_batcher_sidecar_example_is_a_valid_deployment_with_a_pod_monitor():
    deployment, pod_monitor = _docs("batcher-sidecar.yaml")
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(deployment, version, strict=True)
    prometheus_operator().PodMonitor.model_validate(pod_monitor)
    containers = {c["name"]: c for c in deployment["spec"]["template"]["spec"]["containers"]}
    batcher = containers["batcher"]
    assert batcher["command"] == ["autoglm-batcher"]
    parser = argparse.ArgumentParser(exit_on_error=False)
    add_config_arguments(parser, BatcherConfig)
    config = config_from_args(BatcherConfig, parser.parse_args(batcher["args"]))
    assert config.listen == ":8000"
    ports = {p["name"] for p in batcher["ports"]}
    assert {e["port"] for e in pod_monitor["spec"]["podMetricsEndpoints"]} <= ports
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_prometheus_adapter_example_publishes_the_forecast(tmp_path):
    adapter_values, hpa = _docs("prometheus-adapter-values.yaml")
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(hpa, version, strict=True)
    (rule,) = adapter_values["rules"]["external"]
    series = re.match(r"(\w+)\{", rule["seriesQuery"]).group(1)
    assert series == "autoglm_forecast_upper" == rule["name"]["as"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["external"]["metric"]["name"] == rule["name"]["as"]
    assert set(metric["external"]["metric"]["selector"]["matchLabels"]) == _forecast_labels()
    # the adapter fills in <<.Series>> and <<.LabelMatchers>>; what it sends must be PromQL
    sent = (
        rule["metricsQuery"]
        .replace("<<.Series>>", series)
        .replace("<<.LabelMatchers>>", 'target="queue",horizon_seconds="300",quantile="0.9"')
    )
    _promtool_accepts(tmp_path, [rule["seriesQuery"], sent])


def test_keda_example_queries_the_forecast_and_the_live_queue(tmp_path):
    (scaled_object,) = _docs("keda-scaledobject.yaml")
    queries = [t["metadata"]["query"] for t in scaled_object["spec"]["triggers"]]
    _promtool_accepts(tmp_path, queries)
    forecast = next(q for q in queries if "autoglm_forecast_upper" in q)
    assert set(re.findall(r"(\w+)=", forecast)) == _forecast_labels()
    for trigger in scaled_object["spec"]["triggers"]:
        float(trigger["metadata"]["threshold"])  # KEDA wants a number in a string
