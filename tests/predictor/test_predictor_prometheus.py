"""The Prometheus client and the service's pull mode against a real Prometheus server whose
history was backfilled with promtool."""

from __future__ import annotations

import math
import subprocess
import time

import numpy as np
import pytest

from predictor.config import TargetConfig
from predictor.prometheus_source import PrometheusError, PrometheusSource
from predictor.service import PredictorService
from tests.live import Prometheus, free_port

STEP = 300
POINTS = 576  # two days of 5-minute points


def truth(ts: np.ndarray) -> np.ndarray:
    return 100 + 30 * np.sin(2 * np.pi * ts / 3600.0)


@pytest.fixture(scope="module")
def backfilled(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prometheus")
    end = math.floor((time.time() - 1800) / STEP) * STEP
    ts = end - STEP * np.arange(POINTS)[::-1]
    lines = [
        "# HELP autoglm_test_requests requests per second",
        "# TYPE autoglm_test_requests gauge",
    ]
    lines += [f"autoglm_test_requests {v:.6f} {t}" for t, v in zip(ts, truth(ts), strict=True)]
    lines += ["# TYPE autoglm_test_other gauge"]
    lines += [f"autoglm_test_other 1 {t}" for t in ts]
    lines.append("# EOF")
    source = workdir / "history.om"
    source.write_text("\n".join(lines) + "\n")
    subprocess.run(
        [
            "promtool",
            "tsdb",
            "create-blocks-from",
            "openmetrics",
            str(source),
            str(workdir / "data"),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    server = Prometheus(workdir, scrape_configs=[])
    server.start()
    try:
        yield server, ts
    finally:
        server.stop()


@pytest.mark.timeout(120)
def test_query_range_returns_the_backfilled_history(backfilled):
    server, ts = backfilled
    source = PrometheusSource(server.url, headers={"X-Scope-OrgID": "test"})
    t, v = source.query_range("autoglm_test_requests", float(ts[0]), float(ts[-1]), STEP)
    np.testing.assert_array_equal(t, ts)
    np.testing.assert_allclose(v, truth(ts), rtol=1e-6)


@pytest.mark.timeout(120)
def test_ranges_longer_than_one_request_are_split_and_joined(backfilled, monkeypatch):
    server, ts = backfilled
    monkeypatch.setattr("predictor.prometheus_source.MAX_POINTS_PER_QUERY", 100)
    t, _ = PrometheusSource(server.url).query_range(
        "autoglm_test_requests", float(ts[0]), float(ts[-1]), STEP
    )
    np.testing.assert_array_equal(t, ts)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("query", "message"),
    [
        ('{__name__=~"autoglm_test_.*"}', "returned 2 series; aggregate it"),
        ("sum(", "query failed \\(HTTP 400\\)"),
    ],
)
def test_ambiguous_or_broken_queries_raise_a_clear_error(backfilled, query, message):
    server, ts = backfilled
    with pytest.raises(PrometheusError, match=message):
        PrometheusSource(server.url).query_range(query, float(ts[0]), float(ts[-1]), STEP)


@pytest.mark.timeout(180)
def test_service_forecasts_from_prometheus_and_keeps_them_when_it_goes_down(backfilled):
    server, ts = backfilled
    now = [float(ts[-1])]  # the moment of the last backfilled point
    target = TargetConfig(
        name="requests",
        query="autoglm_test_requests",
        step=STEP,
        lookback=2 * 86400,
        horizons=(1, 3),
        seasons=(3600.0,),
        models=("ets_log",),
    )
    source = PrometheusSource(server.url, timeout=5)
    service = PredictorService([target], source=source, clock=lambda: now[0])
    assert service.forecast("requests", STEP) is None
    assert service.refit("requests")
    forecast = service.forecast("requests", STEP)
    assert forecast is not None and forecast.horizon_seconds == STEP
    expected = truth(np.array([ts[-1] + STEP]))[0]
    assert forecast.point == pytest.approx(expected, rel=0.02)
    assert forecast.upper >= forecast.point

    source.url = f"http://127.0.0.1:{free_port()}"  # Prometheus gone: connection refused
    now[0] += 600
    service.poll("requests")
    errors = service.metrics.registry.get_sample_value(
        "autoglm_predictor_query_errors_total", {"target": "requests"}
    )
    assert errors == 1
    kept = service.forecast("requests", STEP)
    assert kept is not None and kept.issued_at == forecast.issued_at
    # The last point is now older, so "one step from now" lies further from it.
    assert kept.horizon_seconds > forecast.horizon_seconds
    age = service.metrics.registry.get_sample_value(
        "autoglm_forecast_age_seconds", {"target": "requests"}
    )
    assert age == pytest.approx(600)


def test_a_missing_token_file_is_reported_not_raised_as_oserror(tmp_path):
    source = PrometheusSource("http://127.0.0.1:1", bearer_token_file=str(tmp_path / "none"))
    with pytest.raises(PrometheusError, match="cannot read bearer token file"):
        source.query_range("up", 0, 60, 15)
