"""The in-process service: pushed points, refits, forecasts, the scheduler and /metrics."""

from __future__ import annotations

import time

import numpy as np
import pytest
import requests

from autoglm.config import ConfigError, build_config
from autoglm.web.exposition import registry_route
from autoglm.web.server import HTTPServer
from predictor.api import ForecastProvider
from predictor.config import PredictorConfig, TargetConfig
from predictor.service import PredictorService
from tests.waiting import wait_until

STEP = 60.0


def target(**overrides) -> TargetConfig:
    settings = dict(
        name="load", step=STEP, lookback=86400, horizons=(1, 3), seasons=(1200.0,),
        models=("ets_log",),
    )  # fmt: skip
    settings.update(overrides)
    return TargetConfig(**settings)


def pattern(i: int) -> float:
    return 50 + 20 * np.sin(2 * np.pi * i / 20)


def push(service: PredictorService, bins: range, per_bin: int = 3) -> None:
    for i in bins:
        for k in range(per_bin):
            service.observe("load", i * STEP + k, pattern(i))


def test_pushed_points_are_binned_fitted_and_forecast():
    now = [0.0]
    service = PredictorService([target()], clock=lambda: now[0])
    assert isinstance(service, ForecastProvider)
    push(service, range(200))
    now[0] = 200 * STEP
    assert service.forecast("load", STEP) is None
    assert service.refit("load")
    forecast = service.forecast("load", STEP)
    assert forecast is not None
    # Bin 198 is the last closed one (stamped with its end, 199 min); one minute from now
    # (200 min) lies in bin 200, two steps past it.
    assert forecast.horizon_seconds == 2 * STEP
    assert forecast.point == pytest.approx(pattern(200), abs=1.0)
    assert forecast.upper >= forecast.point and forecast.quantile == 0.9
    assert forecast.model in {"naive", "seasonal_naive_1200s", "seasonal_level", "ets_log"}
    assert service.forecast("load", 100 * STEP) is None  # beyond the largest horizon


def test_new_points_update_the_fitted_models_without_a_refit():
    now = [0.0]
    service = PredictorService([target(models=())], clock=lambda: now[0])
    push(service, range(120))
    assert service.refit("load")
    before = service.forecast("load", 0)
    push(service, range(120, 125))
    assert (
        service.metrics.registry.get_sample_value(
            "autoglm_predictor_updates_total", {"target": "load"}
        )
        == 5
    )
    after = service.forecast("load", 0)
    assert after.point == pytest.approx(pattern(124), abs=2.0)
    assert after.point != before.point


def test_late_and_non_finite_samples_are_counted_not_kept():
    service = PredictorService([target()])
    service.observe("load", 10 * STEP, 1.0)
    service.observe("load", 11 * STEP, 1.0)
    service.observe("load", 5 * STEP, 1.0)
    service.observe("load", 12 * STEP, float("nan"))
    get = service.metrics.registry.get_sample_value
    assert (
        get("autoglm_predictor_observations_rejected_total", {"target": "load", "reason": "late"})
        == 1
    )
    assert (
        get(
            "autoglm_predictor_observations_rejected_total",
            {"target": "load", "reason": "not_finite"},
        )
        == 1
    )
    with pytest.raises(KeyError, match="unknown target 'gpu'"):
        service.observe("gpu", 0, 1.0)


def test_sum_targets_fill_skipped_bins_with_zero():
    service = PredictorService([target(aggregate="sum")])
    service.observe("load", 0, 2.0)
    service.observe("load", 1, 3.0)
    service.observe("load", 3 * STEP, 1.0)
    assert service.targets["load"].values == [5.0, 0.0, 0.0]


@pytest.mark.timeout(120)
def test_scheduler_refits_and_metrics_are_served_over_http():
    service = PredictorService([target()])
    push(service, range(int(time.time() / STEP) - 150, int(time.time() / STEP) + 1))
    server = HTTPServer("127.0.0.1:0", {"/metrics": registry_route(service.metrics.registry)})
    server.start()
    service.start(refit_seconds=3600, update_seconds=3600)  # the first refit runs at once
    try:
        wait_until(
            lambda: service.forecast("load", STEP) is not None,
            timeout=60,
            what="the first forecast",
        )
        body = requests.get(f"{server.url}/metrics", timeout=5).text
    finally:
        service.stop()
        server.stop()
    assert 'autoglm_forecast_value{horizon_seconds="60",target="load"}' in body
    assert 'autoglm_forecast_upper{horizon_seconds="180",quantile="0.9",target="load"}' in body
    assert "autoglm_forecast_model_info{" in body
    assert (
        'autoglm_forecast_backtest_wape_ratio{horizon_seconds="60",model="naive",target="load"}'
        in body
    )
    assert 'autoglm_forecast_age_seconds{target="load"}' in body
    assert 'autoglm_predictor_refits_total{result="success",target="load"} 1.0' in body


def test_config_reads_targets_and_rejects_bad_ones():
    config = build_config(
        PredictorConfig,
        {"targets": [{"name": "req", "query": "sum(rate(x[1m]))", "step": "15m",
                      "horizons": [4, 1], "seasons": ["1d"]}]},
    )  # fmt: skip
    (t,) = config.target_configs
    assert (t.step, t.horizons, t.seasons) == (900.0, (1, 4), (86400.0,))
    with pytest.raises(ConfigError, match=r"targets\[0\]\.horizons\[0\] must be >= 1, got 0"):
        build_config(PredictorConfig, {"targets": [{"name": "a", "horizons": [0]}]})
    with pytest.raises(ConfigError, match=r"targets\[0\]\.qurey: unknown field; valid fields"):
        build_config(PredictorConfig, {"targets": [{"name": "a", "qurey": "up"}]})
    with pytest.raises(ConfigError, match="no targets"):
        build_config(PredictorConfig, {})
    with pytest.raises(ConfigError, match="used twice"):
        build_config(PredictorConfig, {"targets": [{"name": "a"}, {"name": "a"}]})
    # Horizons up to 20 steps need 82 points of history to be backtested; 1 h of 1 m holds 60.
    with pytest.raises(ConfigError, match=r"covers 60 steps; horizons up to 20 need at least 82"):
        build_config(
            PredictorConfig,
            {"targets": [{"name": "a", "step": "1m", "lookback": "1h", "horizons": [1, 20]}]},
        )
    # A shallow horizon still needs the 20 points every refit fits on: a lookback of 12 steps
    # would keep the target waiting for points forever, so it is refused at start.
    with pytest.raises(ConfigError, match=r"covers 12 steps; horizons up to 1 need at least 20"):
        build_config(
            PredictorConfig,
            {"targets": [{"name": "a", "step": "1m", "lookback": "12m", "horizons": [1]}]},
        )


def test_deep_horizons_wait_for_a_backtestable_history_instead_of_failing(caplog):
    """Below the points selection needs for the deepest horizon a refit waits (info), it does
    not fail (a warning at every step); with enough points it fits."""
    service = PredictorService([target(horizons=(1, 10))])
    push(service, range(30))  # 29 closed bins: above MIN_POINTS, below the 42 needed
    with caplog.at_level("INFO", logger="predictor"):
        assert not service.refit("load")
    (waiting,) = [r for r in caplog.records if r.getMessage() == "waiting for points"]
    assert waiting.needed == 42
    assert not [r for r in caplog.records if r.levelname == "WARNING"]
    push(service, range(30, 60))
    assert service.refit("load")


def test_a_seasonal_only_target_forecasts_with_baselines_until_two_seasons_exist():
    now = [0.0]
    service = PredictorService([target(models=("seasonal_level",))], clock=lambda: now[0])
    push(service, range(30))  # a season is 20 bins: two need 40
    assert service.refit("load")
    assert service.forecast("load", 0).model == "naive"
    push(service, range(30, 200))
    assert service.refit("load")
    assert service.forecast("load", 0).model in {"seasonal_level", "seasonal_naive_1200s"}
    with pytest.raises(ConfigError, match=r"models: unknown model 'arima'; choose from: naive"):
        build_config(PredictorConfig, {"targets": [{"name": "a", "models": ["arima"]}]})
