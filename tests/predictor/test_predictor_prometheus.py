"""The predictor's pull mode against a real Prometheus server whose history was backfilled with
promtool: the shared client (autoglm.prometheus_api) as the predictor uses it, and the service.

The client's own options (auth, TLS, error kinds) are tested in tests/test_prometheus_api.py."""

from __future__ import annotations

import math
import subprocess
import time

import numpy as np
import pytest

from autoglm.prometheus_api import PrometheusClient
from predictor.config import TargetConfig
from predictor.service import PredictorService
from tests.live import Prometheus, free_port

pytestmark = pytest.mark.live  # runs the real promtool/prometheus binaries

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


def _target(query: str) -> TargetConfig:
    return TargetConfig(
        name="requests",
        query=query,
        step=STEP,
        lookback=2 * 86400,
        horizons=(1, 3),
        seasons=(3600.0,),
        models=("ets_log",),
    )


@pytest.mark.timeout(120)
def test_query_range_returns_the_backfilled_history(backfilled):
    server, ts = backfilled
    with PrometheusClient(server.url, headers={"X-Scope-OrgID": "test"}) as client:
        (series,) = client.query_range("autoglm_test_requests", float(ts[0]), float(ts[-1]), STEP)
    np.testing.assert_array_equal(series.timestamps, ts)
    np.testing.assert_allclose(series.values, truth(ts), rtol=1e-6)


@pytest.mark.timeout(120)
def test_ranges_longer_than_one_request_are_split_and_joined(backfilled):
    server, ts = backfilled
    with PrometheusClient(server.url, max_points_per_query=100) as client:
        (series,) = client.query_range("autoglm_test_requests", float(ts[0]), float(ts[-1]), STEP)
    np.testing.assert_array_equal(series.timestamps, ts)
    np.testing.assert_allclose(series.values, truth(ts), rtol=1e-6)


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("query", "message"),
    [
        ('{__name__=~"autoglm_test_.*"}', "returned 2 series; aggregate it"),
        ("sum(", "HTTP 400, bad_data"),
    ],
)
def test_ambiguous_or_broken_queries_are_counted_with_a_clear_reason(
    backfilled, caplog, query, message
):
    server, ts = backfilled
    with PrometheusClient(server.url) as client:
        service = PredictorService([_target(query)], source=client, clock=lambda: float(ts[-1]))
        with caplog.at_level("WARNING", logger="predictor.service"):
            assert not service.refit("requests")
    errors = service.metrics.registry.get_sample_value(
        "autoglm_predictor_query_errors_total", {"target": "requests"}
    )
    assert errors == 1
    assert any(message in getattr(r, "error", "") for r in caplog.records), caplog.records


@pytest.mark.timeout(180)
def test_service_forecasts_from_prometheus_and_keeps_them_when_it_goes_down(backfilled, caplog):
    server, ts = backfilled
    now = [float(ts[-1])]  # the moment of the last backfilled point
    with PrometheusClient(server.url, timeout=5) as source:
        service = PredictorService(
            [_target("autoglm_test_requests")], source=source, clock=lambda: now[0]
        )
        assert service.forecast("requests", STEP) is None
        assert service.refit("requests")
        forecast = service.forecast("requests", STEP)
        assert forecast is not None and forecast.horizon_seconds == STEP
        expected = truth(np.array([ts[-1] + STEP]))[0]
        assert forecast.point == pytest.approx(expected, rel=0.02)
        assert forecast.upper >= forecast.point

        url = source.url
        source.url = f"http://127.0.0.1:{free_port()}"  # Prometheus gone: connection refused
        now[0] += 600
        with caplog.at_level("INFO", logger="predictor.service"):
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

        with caplog.at_level("INFO", logger="predictor.service"):
            service.poll("requests")  # counted, not warned about again
            source.url = url
            service.poll("requests")
            service.poll("requests")
    assert (
        service.metrics.registry.get_sample_value(
            "autoglm_predictor_query_errors_total", {"target": "requests"}
        )
        == 2
    )
    # The outage's lines only: what else is captured at info depends on the tests before it.
    logged = [(r.levelname, r.msg) for r in caplog.records if r.msg.startswith("prometheus quer")]
    assert logged == [
        ("WARNING", "prometheus query failed"),
        ("INFO", "prometheus queries recovered"),
    ]
    assert caplog.records[-1].failures == 2


@pytest.mark.timeout(120)
def test_too_few_points_is_one_wait_line_and_a_warning_once_the_alerts_limit_passes(
    backfilled, caplog
):
    """Right after start a query has too few points, and every poll's refit finds that again:
    one info line for the wait, not a warning a poll; one warning once the wait outlasts the
    limit at which PredictorTargetNotFitted fires (twice the history a refit needs, at least an
    hour), by when the history should be there."""
    server, ts = backfilled
    cut = float(ts[0] + 5 * STEP)  # the query's series ends after its first points
    query = f"autoglm_test_requests and on() (vector(time()) < {cut})"
    now = [float(ts[-1])]
    with PrometheusClient(server.url) as client:
        service = PredictorService([_target(query)], source=client, clock=lambda: now[0])
        with caplog.at_level("INFO", logger="predictor.service"):
            for _ in range(3):
                assert not service.refit("requests")
            (waiting,) = [r for r in caplog.records if r.msg == "waiting for points"]
            assert "only 5 points in the lookback" in waiting.error
            messages = [r.getMessage() for r in caplog.records]
            assert "still too few points" not in messages
            limit = 2 * 20 * STEP  # twice the 20 points a refit needs, over an hour
            now[0] += limit - STEP
            assert not service.refit("requests")
            assert "still too few points" not in [r.getMessage() for r in caplog.records]
            now[0] += STEP
            for _ in range(2):
                assert not service.refit("requests")
    (late,) = [r for r in caplog.records if r.getMessage() == "still too few points"]
    assert (late.waited_seconds, late.limit_seconds) == (limit, limit)
    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("waiting for points") == 1
    assert messages.count("still too few points") == 1
    assert "refit failed" not in messages
    get = service.metrics.registry.get_sample_value
    # The wait is not an error: an error-rate alert must not fire at every start.
    assert get("autoglm_predictor_refits_total", {"target": "requests", "result": "error"}) is None
    assert get("autoglm_predictor_refits_total", {"target": "requests", "result": "waiting"}) == 6
    assert get("autoglm_predictor_model_fitted", {"target": "requests"}) == 0
    assert get("autoglm_predictor_unfitted_seconds", {"target": "requests"}) == limit
