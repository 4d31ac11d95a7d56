"""The metrics source against a real Prometheus (/usr/bin/prometheus) with basic auth on.

Prometheus scrapes a prometheus_client endpoint that this test controls; the controller's
queries then go through Prometheus' HTTP API exactly as in a cluster.
"""

from __future__ import annotations

import bcrypt
import pytest
from prometheus_client import CollectorRegistry, Gauge, start_http_server

from autoglm.config import build_config
from autoglm.prometheus_api import PrometheusClient
from autoscaler.config import AutoscalerConfig
from autoscaler.controller.forecasts import PrometheusForecasts
from autoscaler.controller.metrics_source import PrometheusMetricsSource
from autoscaler.core import PodSample
from autoscaler.spec import parse_spec
from tests.live import Prometheus, free_port, scrape_job

pytestmark = [
    pytest.mark.live,
]

USER, PASSWORD = "autoscaler", "s3cret"


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    registry = CollectorRegistry()
    util = Gauge("test_gpu_util", "per pod", ["pod"], registry=registry)
    util.labels("llm-0").set(80)
    util.labels("llm-1").set(40)
    util.labels("other-0").set(5)
    Gauge("test_queue_depth", "per pod", ["pod"], registry=registry).labels("llm-0").set(3)
    Gauge("test_broken", "always NaN", registry=registry).set(float("nan"))
    fc = Gauge(
        "autoglm_forecast_upper", "forecast", ["target", "horizon_seconds", "quantile"],
        registry=registry,
    )  # fmt: skip
    fc.labels("gpu_util", "60", "0.9").set(100)
    fc.labels("gpu_util", "300", "0.9").set(200)
    fc.labels("gpu_util", "900", "0.9").set(400)
    fc.labels("gpu_util", "300", "0.5").set(150)
    exporter_port = free_port()
    server, thread = start_http_server(exporter_port, addr="127.0.0.1", registry=registry)
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    prometheus = Prometheus(
        tmp_path_factory.mktemp("prom"),
        scrape_configs=[scrape_job("fake", [f"127.0.0.1:{exporter_port}"])],
        web_config={"basic_auth_users": {USER: hashed}},
        request_options={"auth": (USER, PASSWORD)},
    )
    try:
        with prometheus:
            prometheus.wait_for("test_gpu_util", lambda result: len(result) == 3, timeout=60)
            yield prometheus.url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


_RAW_UTIL = {
    "name": "gpu_util",
    "type": "Pods",
    "query": "avg by (pod) (test_gpu_util)",
    "target": {"type": "Utilization", "averageUtilization": 70},
    "prediction": {"horizonSeconds": 120, "warmupSeconds": 300},
}
SPEC = parse_spec(
    {
        "scaleTargetRef": {"kind": "Deployment", "name": "llm"},
        "maxReplicas": 10,
        "metrics": [
            _RAW_UTIL,
            {
                "name": "queue",
                "type": "External",
                "query": "test_queue_depth",
                "target": {"type": "AverageValue", "averageValue": 2},
            },
            {
                "name": "queue_obj",
                "type": "Object",
                "query": "sum(test_gpu_util)",
                "target": {"type": "Value", "value": 100},
            },
            {
                "name": "missing",
                "type": "External",
                "query": "test_does_not_exist",
                "target": {"type": "Value", "value": 1},
            },
            {
                "name": "nan",
                "type": "External",
                "query": "test_broken",
                "target": {"type": "Value", "value": 1},
            },
            {
                "name": "not_per_pod",
                "type": "Pods",
                "query": "sum(test_gpu_util)",
                "target": {"type": "AverageValue", "averageValue": 1},
            },
            {
                "name": "bad_syntax",
                "type": "External",
                "query": "sum(",
                "target": {"type": "Value", "value": 1},
            },
        ],
    }
)
PODS = [PodSample("llm-0", None), PodSample("llm-1", None), PodSample("llm-2", None)]


def _metric(name):
    return next(m for m in SPEC.metrics if m.name == name)


@pytest.fixture
def source(prom):
    client = PrometheusClient(prom, username=USER, password=PASSWORD)
    yield PrometheusMetricsSource(client)
    client.close()


def _read(source, name):
    kinds: list[str] = []
    return source.read(_metric(name), PODS, kinds.append), kinds


def test_pods_metric_values_are_matched_to_the_targets_pods(source):
    reading, kinds = _read(source, "gpu_util")
    assert reading.error is None and kinds == []
    # other-0 is not a pod of the target; llm-2 has no series (a missing sample)
    assert {p.name: p.value for p in reading.pods} == {"llm-0": 80.0, "llm-1": 40.0, "llm-2": None}


def test_external_and_object_values(source):
    assert _read(source, "queue")[0].value == 3.0
    assert _read(source, "queue_obj")[0].value == 125.0


@pytest.mark.parametrize(
    ("name", "kind", "text"),
    [
        ("missing", "metric_empty", "no samples"),
        ("nan", "metric_nan", "NaN"),
        ("not_per_pod", "metric_shape", "avg by (pod)"),
        ("bad_syntax", "prometheus_query", "bad_data"),
    ],
)
def test_unusable_answers_are_errors_never_numbers(source, name, kind, text):
    reading, kinds = _read(source, name)
    assert reading.value is None
    assert text in reading.error
    assert kinds == [kind]


def test_without_credentials_prometheus_refuses_and_that_is_an_error(prom):
    client = PrometheusClient(prom)
    try:
        kinds: list[str] = []
        reading = PrometheusMetricsSource(client).read(_metric("queue"), PODS, kinds.append)
        assert reading.error and "401" in reading.error
        assert kinds == ["prometheus_http"]
    finally:
        client.close()


def test_unreachable_prometheus_is_an_error():
    client = PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2)
    try:
        kinds: list[str] = []
        reading = PrometheusMetricsSource(client).read(_metric("gpu_util"), PODS, kinds.append)
        assert reading.error.startswith("prometheus unreachable")
        assert reading.pods is not None  # pods kept, so the core still counts them
        assert kinds == ["prometheus_unreachable"]
    finally:
        client.close()


def test_forecast_series_at_the_warmup_horizon(prom):
    client = PrometheusClient(prom, username=USER, password=PASSWORD)
    try:
        forecasts = PrometheusForecasts(client)
        # horizon 120 s but warm-up 300 s: the shortest published horizon >= 300 s is used,
        # at the spec's quantile (0.9)
        assert forecasts.upper(_metric("gpu_util")) == 200.0
        assert forecasts.upper(_metric("queue")) is None  # prediction not enabled
        long_warmup = parse_spec(
            {
                "scaleTargetRef": {"kind": "Deployment", "name": "llm"},
                "maxReplicas": 10,
                "metrics": [
                    {
                        **{k: v for k, v in _RAW_UTIL.items() if k != "prediction"},
                        "prediction": {"horizonSeconds": 60, "warmupSeconds": 1200},
                    }
                ],
            }
        ).metrics[0]
        kinds: list[str] = []
        assert forecasts.upper(long_warmup, kinds.append) is None  # nothing reaches 1200 s
        assert kinds == ["forecast_short_horizon"]
    finally:
        client.close()


def test_the_controllers_flags_reach_prometheus_and_reread_the_password(prom, tmp_path):
    password = tmp_path / "password"
    password.write_text(PASSWORD + "\n")
    cfg = build_config(
        AutoscalerConfig,
        {
            "prometheus_url": prom,
            "prometheus_username": USER,
            "prometheus_password_file": str(password),
        },
    )
    with cfg.prometheus_client(cfg.prometheus_timeout) as client:
        source = PrometheusMetricsSource(client)
        assert source.read(_metric("queue"), PODS).value == 3.0
        password.write_text("rotated-elsewhere\n")  # read at every query, not once at startup
        kinds: list[str] = []
        reading = source.read(_metric("queue"), PODS, kinds.append)
    assert reading.error and "401" in reading.error
    assert kinds == ["prometheus_http"]
