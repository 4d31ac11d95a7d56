"""Bad input to ``autoglm-autoscaler`` is one stderr line and exit 2; implausible readings hold."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import pytest

import autoscaler.local
from autoglm.prometheus_api import QueryResult, Sample
from autoscaler.cli import main
from autoscaler.controller.forecasts import PrometheusForecasts, ProviderForecasts
from autoscaler.controller.metrics_source import PrometheusMetricsSource
from autoscaler.core import PodSample
from autoscaler.spec import load_spec_file

EXAMPLE = str(Path(__file__).resolve().parents[2] / "autoscaler" / "crd" / "example.yaml")
LISTEN = ["--listen", "127.0.0.1:0"]


def _one_line_exit_2(capsys, argv: list[str]) -> str:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    return err


# --- run: settings ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("program", "message"),
    [("/no/such/binary", "no such file"), ("no-such-worker-program-xyz", "not on PATH")],
)
def test_a_worker_command_that_cannot_start_is_refused(capsys, program, message):
    argv = ["run", "--mode", "local", "--spec-file", EXAMPLE, "--worker-command", program]
    err = _one_line_exit_2(capsys, argv + LISTEN)
    assert "--worker-command" in err and message in err


def test_a_worker_command_file_that_is_not_executable_is_refused(capsys, tmp_path):
    program = tmp_path / "worker"
    program.write_text("#!/bin/sh\n")
    program.chmod(0o644)
    argv = ["run", "--mode", "local", "--spec-file", EXAMPLE, "--worker-command", str(program)]
    if os.access(program, os.X_OK):
        pytest.skip("root may execute any file")
    assert "not executable" in _one_line_exit_2(capsys, argv + LISTEN)


@pytest.mark.parametrize("port", ["-1", "70000"])
def test_worker_base_port_is_a_tcp_port(capsys, port):
    argv = ["run", "--mode", "local", "--spec-file", EXAMPLE, "--worker-command", sys.executable]
    err = _one_line_exit_2(capsys, [*argv, f"--worker-base-port={port}", *LISTEN])
    assert "--worker-base-port" in err


def test_worker_base_port_is_not_a_yaml_boolean(capsys, tmp_path):
    config = tmp_path / "c.yaml"
    config.write_text("worker_base_port: true\n")
    err = _one_line_exit_2(capsys, ["run", "--config", str(config), *LISTEN])
    assert f"{config}: worker_base_port: true is not a whole number; give an integer" in err


def test_worker_ports_must_fit_below_65536(capsys, monkeypatch):
    started = _forbid_workers(monkeypatch)
    argv = ["run", "--mode", "local", "--spec-file", EXAMPLE, "--worker-command", sys.executable]
    err = _one_line_exit_2(capsys, [*argv, "--worker-base-port", "65535", *LISTEN])
    assert "--worker-base-port" in err and "maxReplicas" in err
    assert started == []


@pytest.mark.parametrize(
    "content",
    [b"\xff\xfe\x00bad", b"clusters: [\n", b"- just\n- a list\n", b"clusters: 3\n"],
    ids=["not-utf8", "bad-yaml", "not-a-mapping", "wrong-shape"],
)
def test_a_bad_kubeconfig_is_one_line(capsys, tmp_path, content):
    path = tmp_path / "kubeconfig"
    path.write_bytes(content)
    err = _one_line_exit_2(capsys, ["run", "--kubeconfig", str(path), *LISTEN])
    assert "--kubeconfig" in err


def test_a_missing_kubeconfig_is_named(capsys, tmp_path):
    err = _one_line_exit_2(capsys, ["run", "--kubeconfig", str(tmp_path / "nope"), *LISTEN])
    assert "--kubeconfig" in err and "No such file" in err


@pytest.mark.parametrize(
    "argv",
    [
        ["run", "--no-such-flag"],
        ["run", "--listen"],
        ["run", "--dry-run=yes"],
        ["--no-such-flag"],
        ["no-such-subcommand"],
        ["decide", "--no-such-flag"],
        ["decide", "--spec", EXAMPLE, "--current", "two", "--metrics", "{}"],
    ],
)
def test_a_bad_command_line_is_one_line_not_the_usage(capsys, argv):
    err = _one_line_exit_2(capsys, argv)
    assert "usage:" not in err and "see --help" in err


def test_decide_answers_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["decide", "--version"])
    assert exc.value.code == 0
    assert "decide" in capsys.readouterr().out


# --- run: local mode checks --listen before it starts workers ---------------------------------


def _forbid_workers(monkeypatch) -> list[object]:
    started: list[object] = []

    class NoWorkers:
        def __init__(self, *args, **kwargs) -> None:
            started.append(args)

        def set_replicas(self, replicas: int) -> None:
            started.append(replicas)

        def close(self) -> None:
            pass

    monkeypatch.setattr(autoscaler.local, "LocalProcessGroup", NoWorkers)
    return started


def test_a_busy_listen_port_is_refused_before_any_worker_starts(capsys, monkeypatch):
    started = _forbid_workers(monkeypatch)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        argv = ["run", "--mode", "local", "--spec-file", EXAMPLE]
        argv += ["--worker-command", sys.executable, "--listen", f"127.0.0.1:{port}"]
        err = _one_line_exit_2(capsys, argv)
    assert "--listen" in err
    assert started == []


# --- simulate ---------------------------------------------------------------------------------


def test_simulate_errors_go_to_stderr(capsys, tmp_path):
    trace = tmp_path / "trace.csv"
    trace.write_text("not,a,trace\n")
    try:
        code = main(["simulate", "--trace", str(trace)])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "error" in err


def test_simulate_log_level_is_a_choice(capsys, tmp_path):
    err = _one_line_exit_2(capsys, ["simulate", "--trace", "x.csv", "--log-level", "loud"])
    assert "--log-level" in err


# --- decide -----------------------------------------------------------------------------------


def _decide(metrics: str, *extra: str) -> list[str]:
    return ["decide", "--spec", EXAMPLE, "--current", "2", "--metrics", metrics, *extra]


@pytest.mark.parametrize(
    ("metrics", "named"),
    [
        ('{"gpu_util": {"pods": {"a": Infinity}}}', "finite"),
        ('{"gpu_util": {"pods": {"a": NaN}}}', "finite"),
        ('{"gpu_util": {"pods": {"a": 1e999}}}', "gpu_util.pods.a"),
        ('{"gpu_util": {"pods": {"a": "80"}}}', "gpu_util.pods.a"),
        ('{"gpu_util": {"pods": {"a": -50}}}', "gpu_util.pods.a"),
        ('{"gpu_util": {"pods": {"a": 50}, "forecast": "lots"}}', "gpu_util.forecast"),
        ('{"gpu_util": {"pods": {"a": 50}, "forecast": [1]}}', "gpu_util.forecast"),
        ('{"gpu_util": {"pods": {"a": 50}, "forecast": -1}}', "gpu_util.forecast"),
        ('{"gpu_util": {"pods": {"a": 50}, "forecast": true}}', "gpu_util.forecast"),
    ],
)
def test_decide_refuses_readings_that_are_not_finite_numbers(capsys, metrics, named):
    assert named in _one_line_exit_2(capsys, _decide(metrics))


@pytest.mark.parametrize(
    "slo",
    [
        '{"rate": 5, "serviceModel": {"fixedSeconds": 0.1, "maxBatch": [1]}}',
        '{"rate": 5, "serviceModel": {"fixedSeconds": 0.1, "maxBatch": 2.5}}',
        '{"rate": Infinity}',
        '{"rate": "5"}',
        '{"rate": 5, "forecast": 1e999}',
    ],
)
def test_decide_refuses_a_bad_slo(capsys, slo):
    err = _one_line_exit_2(capsys, _decide('{"gpu_util": {"pods": {"a": 50}}}', "--slo", slo))
    assert "--slo" in err


def test_decide_refuses_a_negative_current(capsys):
    err = _one_line_exit_2(
        capsys, ["decide", "--spec", EXAMPLE, "--current", "-1", "--metrics", "{}"]
    )
    assert "--current" in err


# --- implausible readings in the controller ---------------------------------------------------


class _Client:
    def __init__(self, samples: list[tuple[dict[str, str], float]]) -> None:
        self.samples = samples

    def query(self, query: str) -> QueryResult:
        return QueryResult("vector", tuple(Sample(labels, v) for labels, v in self.samples))


def _metric(name: str):
    return next(m for m in load_spec_file(EXAMPLE).metrics if m.name == name)


def test_a_negative_pods_reading_is_an_error_not_a_reason_to_scale_down(caplog):
    metric = _metric("gpu_util")
    pods = [PodSample(f"p{i}", None, ready=True, started_at=0.0) for i in range(4)]
    source = PrometheusMetricsSource(_Client([({"pod": p.name}, -50.0) for p in pods]))
    counted: list[str] = []
    for _ in range(3):
        reading = source.read(metric, pods, counted.append)
        assert reading.error is not None and "negative" in reading.error
    assert counted == ["metric_negative"] * 3
    warnings = [r for r in caplog.records if "negative" in r.getMessage()]
    assert len(warnings) == 1  # once, not every reconcile


def test_a_zero_pods_reading_is_still_a_reading():
    metric = _metric("gpu_util")
    pods = [PodSample("p0", None, ready=True, started_at=0.0)]
    reading = PrometheusMetricsSource(_Client([({"pod": "p0"}, 0.0)])).read(metric, pods)
    assert reading.error is None and reading.pods[0].value == 0.0


def _predicted_metric():
    metric = next((m for m in load_spec_file(EXAMPLE).metrics if m.prediction), None)
    # The example is the documented predictive spec: without a predicted metric these tests
    # would test nothing, so that is a failure, not a skip.
    assert metric is not None and metric.prediction.enabled, f"{EXAMPLE} predicts no metric"
    return metric


def test_a_negative_forecast_from_prometheus_is_no_forecast():
    metric = _predicted_metric()
    counted: list[str] = []
    assert PrometheusForecasts(_Client([({}, -3.0)])).upper(metric, counted.append) is None
    assert counted == ["forecast_negative"]


def test_a_negative_forecast_from_a_provider_is_no_forecast():
    metric = _predicted_metric()

    class Forecast:
        upper = -3.0
        horizon_seconds = 1e9
        issued_at = 0.0

    class Provider:
        def forecast(self, target, horizon, quantile):
            return Forecast()

    counted: list[str] = []
    source = ProviderForecasts(Provider(), clock=lambda: 0.0)
    assert source.upper(metric, counted.append) is None
    assert counted == ["forecast_negative"]
