"""What the running predictor tells an operator: the wait for history at start apart from errors,
how long each target has had no model, Prometheus outages logged once (not a warning a poll),
and its stop. Pull mode against a fake Prometheus (no sockets); the last test runs the real
command and stops it with SIGTERM."""

from __future__ import annotations

import json
import logging
import math
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import requests

from autoglm.prometheus_api import PrometheusError, RangeSeries
from predictor import cli
from predictor.config import TargetConfig
from predictor.service import QUERY_REMINDER_SECONDS, PredictorService
from tests.waiting import wait_until

STEP = 5.0
ROOT = Path(__file__).resolve().parents[2]


class FakePrometheus:
    """A series that exists from ``begins`` on (a sine around 100); ``down`` makes every query
    fail as an unreachable Prometheus does."""

    def __init__(self, begins: float) -> None:
        self.begins = begins
        self.down = False
        self.queries = 0

    def query_range(self, query: str, start: float, end: float, step: float):
        self.queries += 1
        if self.down:
            raise PrometheusError("unreachable", "connection refused")
        first = max(start, math.ceil(self.begins / step) * step)
        ts = np.arange(first, end + step / 2, step)
        if not len(ts):
            return ()
        return (RangeSeries({}, ts, 100 + 10 * np.sin(2 * np.pi * ts / 300.0)),)


def pull_target(**overrides) -> TargetConfig:
    settings = dict(
        name="requests", query="sum(rate(x[1m]))", step=STEP, lookback=3600.0,
        horizons=(1, 2), seasons=(), models=("ets_log",),
    )  # fmt: skip
    settings.update(overrides)
    return TargetConfig(**settings)


def value(service: PredictorService, name: str, **labels: str) -> float | None:
    return service.metrics.registry.get_sample_value(name, {"target": "requests", **labels})


def records(caplog) -> list:
    """The predictor's own records: which other loggers reach the capture at info depends on
    the tests run before in the same process (one may have set the root logger to info)."""
    return [r for r in caplog.records if r.name.startswith("predictor")]


def messages(caplog, level: str | None = None) -> list[str]:
    return [r.getMessage() for r in records(caplog) if level is None or r.levelname == level]


def test_the_wait_for_history_at_start_is_counted_as_waiting_and_the_gauges_show_it(caplog):
    """Right after start the query has too few points, and every poll's refit finds that again:
    result="waiting", not "error" (an error-rate alert must not fire at every start), while the
    gauges say the target has no model yet and for how long, against the history it needs."""
    start = 1_000_000.0
    now = [start]
    prometheus = FakePrometheus(begins=start)  # the series is as new as the predictor
    service = PredictorService([pull_target()], source=prometheus, clock=lambda: now[0])
    needed = service.targets["requests"].min_points
    assert value(service, "autoglm_predictor_history_needed_seconds") == needed * STEP
    assert value(service, "autoglm_predictor_model_fitted") == 0
    assert value(service, "autoglm_predictor_unfitted_seconds") == 0
    with caplog.at_level("DEBUG", logger="predictor.service"):
        polls = 0
        while service.forecast("requests", STEP) is None:
            assert polls < 2 * needed, "never fitted"
            now[0] += STEP
            service.poll_all()
            polls += 1
            if service.forecast("requests", STEP) is None:
                waited = value(service, "autoglm_predictor_unfitted_seconds")
                assert waited == now[0] - start
    waits = polls - 1
    assert waits >= needed - 2
    assert value(service, "autoglm_predictor_refits_total", result="waiting") == waits
    assert value(service, "autoglm_predictor_refits_total", result="error") is None
    assert value(service, "autoglm_predictor_refits_total", result="success") == 1
    assert value(service, "autoglm_predictor_model_fitted") == 1
    assert value(service, "autoglm_predictor_unfitted_seconds") == 0
    assert messages(caplog).count("waiting for points") == 1
    assert not messages(caplog, "WARNING")
    (waiting,) = [r for r in records(caplog) if r.getMessage() == "waiting for points"]
    assert waiting.needed == needed and waiting.points < needed


def test_a_pushed_target_below_the_history_it_needs_is_waiting_too():
    now = [0.0]
    target = TargetConfig(name="requests", step=60.0, horizons=(1, 10), seasons=(), models=())
    service = PredictorService([target], clock=lambda: now[0])
    for i in range(30):  # 29 closed bins; 42 needed
        service.observe("requests", i * 60.0, 1.0 + i % 3)
    now[0] = 1800.0
    assert not service.refit("requests")
    assert value(service, "autoglm_predictor_refits_total", result="waiting") == 1
    assert value(service, "autoglm_predictor_refits_total", result="error") is None
    assert value(service, "autoglm_predictor_model_fitted") == 0
    assert value(service, "autoglm_predictor_unfitted_seconds") == 1800
    assert value(service, "autoglm_predictor_history_needed_seconds") == 42 * 60


def test_a_target_that_never_fits_because_prometheus_is_down_keeps_its_wait_growing():
    now = [1_000_000.0]
    prometheus = FakePrometheus(begins=0.0)
    prometheus.down = True
    service = PredictorService([pull_target()], source=prometheus, clock=lambda: now[0])
    for _ in range(3):
        now[0] += 600
        assert not service.refit("requests")
    assert value(service, "autoglm_predictor_refits_total", result="error") == 3
    assert value(service, "autoglm_predictor_refits_total", result="waiting") is None
    assert value(service, "autoglm_predictor_model_fitted") == 0
    assert value(service, "autoglm_predictor_unfitted_seconds") == 1800


def test_prometheus_down_is_one_warning_a_slow_reminder_and_one_line_when_it_is_back(caplog):
    now = [1_000_000.0]
    prometheus = FakePrometheus(begins=0.0)
    service = PredictorService([pull_target()], source=prometheus, clock=lambda: now[0])
    assert service.refit("requests")
    with caplog.at_level("DEBUG", logger="predictor.service"):
        prometheus.down = True
        down_at = now[0] + STEP
        for _ in range(13):  # a minute of polls every 5 s
            now[0] += STEP
            service.poll("requests")
        assert service.refit("requests") is False  # a refit meanwhile fails the same way
        assert value(service, "autoglm_predictor_query_errors_total") == 14
        assert messages(caplog, "WARNING") == ["prometheus query failed"]
        (first,) = [r for r in records(caplog) if r.levelname == "WARNING"]
        assert first.error == "connection refused"
        assert messages(caplog, "DEBUG").count("prometheus query failed") == 13

        caplog.clear()
        while now[0] - down_at < QUERY_REMINDER_SECONDS:
            now[0] += STEP
            service.poll("requests")
        assert messages(caplog, "WARNING") == ["prometheus queries still failing"]
        reminder = next(r for r in records(caplog) if r.levelname == "WARNING")
        assert reminder.error == "connection refused"
        assert reminder.failing_seconds == pytest.approx(QUERY_REMINDER_SECONDS)
        assert reminder.failures == value(service, "autoglm_predictor_query_errors_total")

        caplog.clear()
        prometheus.down = False
        now[0] += STEP
        service.poll("requests")
        service.poll("requests")
        assert messages(caplog, "INFO") == ["prometheus queries recovered"]
        (back,) = records(caplog)
        assert back.failed_seconds == pytest.approx(now[0] - down_at)
        assert back.failures == value(service, "autoglm_predictor_query_errors_total")

        caplog.clear()
        prometheus.down = True
        now[0] += STEP
        service.poll("requests")
        assert messages(caplog, "WARNING") == ["prometheus query failed"]  # a new outage


class FakeParts:
    """The service, Prometheus client and HTTP server as ``shut_down`` sees them."""

    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        fitted, waiting = TargetConfig(name="a"), TargetConfig(name="b")
        self.targets = PredictorService([fitted, waiting]).targets
        self.targets["a"].models = {1: object()}  # type: ignore[dict-item]

    def stop(self) -> None:
        self.calls.append("stop")

    def close(self) -> None:
        self.calls.append("close")


def test_shut_down_logs_stopping_then_stopped_after_every_part_is_closed(caplog):
    calls: list[str] = []
    parts = FakeParts(calls)

    class Handler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            calls.append(record.getMessage())

    handler = Handler()
    with caplog.at_level("INFO", logger="predictor.cli"):
        cli.log.addHandler(handler)
        try:
            cli.shut_down(parts, parts, parts)  # type: ignore[arg-type]
        finally:
            cli.log.removeHandler(handler)
    assert calls == ["stopping", "stop", "close", "stop", "stopped"]
    (stopped,) = [r for r in records(caplog) if r.getMessage() == "stopped"]
    assert (stopped.targets, stopped.fitted) == (2, 1)


@pytest.mark.slow  # starts the real command (torch's import alone takes seconds)
@pytest.mark.timeout(180)
def test_serve_logs_one_warning_while_prometheus_is_down_and_stopped_after_sigterm(tmp_path):
    """The real command against a Prometheus that is not there, polling every second: one
    warning however many polls fail (all counted), and a "stopped" line after SIGTERM."""
    config = tmp_path / "predictor.yaml"
    target = {"name": "requests", "query": "vector(1)", "step": "1s", "lookback": "1h"}
    settings = {
        "listen": "127.0.0.1:0",
        "prometheus_url": "http://127.0.0.1:9",  # the discard port: connection refused
        "refit_interval": "1h",
        "update_interval": "1s",
        "targets": [{**target, "horizons": [1], "seasons": []}],
    }
    config.write_text(json.dumps(settings))
    log_path = tmp_path / "predictor.log"
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [sys.executable, "-m", "predictor.cli", "serve", "--config", str(config)],
            cwd=ROOT,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:

            def records() -> list[dict]:
                lines = log_path.read_text().splitlines()
                return [json.loads(line) for line in lines if line.startswith("{")]

            def serving() -> dict | None:
                return next((r for r in records() if r.get("msg") == "serving"), None)

            url = wait_until(serving, 120, "the predictor to serve", detail=log_path.read_text)[
                "url"
            ]

            def errors() -> float:
                """Failed queries so far: no series before the first poll has failed."""
                body = requests.get(f"{url}/metrics", timeout=5).text
                lines = [x for x in body.splitlines() if x.startswith("autoglm_predictor_q")]
                return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0

            wait_until(lambda: errors() >= 4, 60, "four failed queries", interval=0.5)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    found = [r["msg"] for r in records()]
    assert found.count("prometheus query failed") == 1, found
    assert found[-2:] == ["stopping", "stopped"], found
