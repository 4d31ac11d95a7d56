"""The trace-driven simulator on small synthetic traces, with the real decision core."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import numpy as np
import pytest

from autoscaler.core.slo_sizing import ServiceModel
from autoscaler.simulator import comparison
from autoscaler.simulator.cli import simulate_main
from autoscaler.simulator.engine import (
    SimulationConfig,
    peak_replicas,
    predictor_forecaster,
    simulate,
)
from autoscaler.simulator.fleet import Fleet
from autoscaler.simulator.forecast import (
    ClairvoyantForecaster,
    PredictorForecaster,
    SharedForecaster,
)
from autoscaler.simulator.frontier import FrontierPoint, compare, plot_frontiers
from autoscaler.simulator.report import summarise, window_scores
from autoscaler.simulator.trace import TraceError, from_arrivals, load_trace, superpose

SERVICE = ServiceModel(0.5, 0.5, max_batch=4)  # 4 req/s per replica at full batches


def poisson(rate_fn, duration, seed=0):
    """Arrival times of an inhomogeneous Poisson process by thinning."""
    rng = np.random.default_rng(seed)
    peak = max(rate_fn(t) for t in np.arange(0, duration, 1.0))
    t = np.cumsum(rng.exponential(1.0 / peak, int(peak * duration * 1.5) + 100))
    t = t[t < duration]
    return t[rng.random(len(t)) < np.array([rate_fn(x) for x in t]) / peak]


def test_fleet_serves_every_request_exactly_once_in_fifo_batches():
    arrivals = np.sort(np.random.default_rng(1).uniform(0, 100, 500))
    fleet = Fleet(arrivals, np.ones(500), SERVICE, cold_start=10, initial_replicas=3)
    fleet.advance(10_000)
    assert not np.isnan(fleet.finished).any()
    assert np.all(fleet.started >= arrivals) and np.all(fleet.finished > fleet.started)
    # a batch takes c + a*b: every service time is one of the four batch sizes' times
    service_times = np.round(fleet.finished - fleet.started, 9)
    assert set(service_times) <= {1.0, 1.5, 2.0, 2.5}
    batches = set(zip(fleet.started, fleet.finished, strict=True))
    assert fleet.busy_seconds == pytest.approx(sum(f - s for s, f in batches))


def test_cold_start_delays_service_and_scale_down_drains_busy_replicas():
    fleet = Fleet(np.array([0.0, 0.1]), np.ones(2), ServiceModel(5, 0, max_batch=1), 30, 0)
    fleet.scale_to(1)
    fleet.advance(100)
    assert fleet.started[0] == pytest.approx(30.0)  # waited for the cold start
    fleet2 = Fleet(np.array([0.0]), np.ones(1), ServiceModel(50, 0, max_batch=1), 0, 1)
    fleet2.advance(10)
    fleet2.scale_to(0)
    assert fleet2.replica_count == 0
    fleet2.advance(100)
    assert fleet2.finished[0] == pytest.approx(50.0)  # finished its batch before leaving
    assert fleet2.billed_seconds(100) == pytest.approx(50.0)


def test_conservation_and_static_never_scales():
    trace = from_arrivals(poisson(lambda t: 3.0, 1800))
    cfg = SimulationConfig(service=SERVICE, cold_start=60)
    result = simulate(trace, cfg, "static")
    assert result.unfinished == 0 and np.isfinite(result.latency).all()
    assert result.scale_ups == result.scale_downs == 0
    assert set(result.timeline.replicas) == {peak_replicas(trace, cfg)}
    s = summarise(result)
    assert s["requests"] == len(trace)


def test_step_load_makes_hpa_scale_up_after_the_cold_start():
    trace = from_arrivals(poisson(lambda t: 1.0 if t < 900 else 10.0, 2400, seed=2))
    cfg = SimulationConfig(service=SERVICE, cold_start=120, min_replicas=1)
    result = simulate(trace, cfg, "hpa")
    t = np.array(result.timeline.t)
    replicas = np.array(result.timeline.replicas)
    ready = np.array(result.timeline.ready)
    assert replicas[t < 900].max() <= 2
    first_up = t[(t >= 900) & (replicas > replicas[t < 900].max())][0]
    assert 900 < first_up <= 900 + 2 * cfg.tick + cfg.metric_window
    # needed: 10 req/s / (0.7 * 4 req/s) -> 4 replicas; ready only after the cold start
    assert replicas[-1] >= 4 or replicas.max() >= 4
    became_ready = t[(t > first_up) & (ready >= 4)][0]
    assert became_ready >= first_up + cfg.cold_start
    assert result.unfinished == 0
    assert (
        result.drivers["metric:request_rate/reactive"] + result.drivers["policy:scale_up_limit"]
        >= 1
    )


class SeasonalNaive:
    """Stand-in forecaster: the highest rate seen one season ago over the horizon, plus 10%."""

    name = "seasonal_naive_stand_in"

    def __init__(self, period: float) -> None:
        self.period = period
        self.times: list[float] = []
        self.rates: list[float] = []
        self.latest_seen = -np.inf

    def observe(self, t: float, rate: float) -> None:
        self.times.append(t)
        self.rates.append(rate)

    def upper(self, now: float, horizon_seconds: float) -> float | None:
        self.latest_seen = max(self.latest_seen, self.times[-1])
        if now < self.period:
            return None
        t = np.array(self.times)
        window = (t >= now - self.period) & (t <= now - self.period + horizon_seconds)
        return 1.1 * max(np.array(self.rates)[window])


def periodic_rate(t: float) -> float:
    return 8.0 if (t % 3600) >= 2700 else 0.5  # a daily-like peak in the last 15 min of each hour


def test_predictive_scales_before_the_periodic_peak_and_breaches_less():
    trace = from_arrivals(poisson(periodic_rate, 4 * 3600, seed=3))
    cfg = SimulationConfig(service=SERVICE, cold_start=180, slo_seconds=5)
    hpa = simulate(trace, cfg, "hpa")
    stand_in = SeasonalNaive(period=3600)
    pred = simulate(trace, cfg, "predictive", forecaster=stand_in)
    t = np.array(pred.timeline.t)
    ready_p = np.array(pred.timeline.ready)
    ready_h = np.array(hpa.timeline.ready)
    last_peak = 3 * 3600 + 2700
    at_peak = (t >= last_peak) & (t < last_peak + 15)
    # the predictive fleet is ready for the fourth peak when it starts; the reactive one is not
    assert ready_p[at_peak].min() >= 3 > ready_h[at_peak].max()
    assert pred.drivers["metric:request_rate/predictive"] >= 1
    assert summarise(pred)["breach_minutes"] < summarise(hpa)["breach_minutes"]
    # the forecaster was asked with the horizon of a cold start plus one tick
    assert cfg.warmup_seconds == 195
    assert summarise(pred)["forecaster"] == "seasonal_naive_stand_in"


def test_decisions_never_depend_on_requests_after_the_decision():
    """Two traces equal up to 50 min and different after: every decision up to then matches."""
    rng = np.random.default_rng(7)
    head = poisson(lambda t: 3.0 + 2.0 * np.sin(t / 600.0), 3000, seed=8)
    calm = np.concatenate([head, 3000 + np.sort(rng.uniform(0, 1800, 300))])
    storm = np.concatenate([head, 3000 + np.sort(rng.uniform(0, 1800, 30000))])
    cfg = SimulationConfig(service=SERVICE, cold_start=120, forecast_step=60.0, forecast_seasons=())
    a = simulate(from_arrivals(calm), cfg, "predictive")
    b = simulate(from_arrivals(storm), cfg, "predictive")
    before = np.array(a.timeline.t) < 3000
    n = int(before.sum())
    assert a.timeline.replicas[:n] == b.timeline.replicas[:n]
    np.testing.assert_array_equal(a.timeline.forecast[:n], b.timeline.forecast[:n])
    assert np.isfinite(a.timeline.forecast[n - 1])  # the predictor was forecasting by then
    assert max(b.timeline.replicas) > max(a.timeline.replicas)  # and the futures do differ


def test_predictive_with_the_predictor_service_selects_by_backtest():
    trace = from_arrivals(poisson(periodic_rate, 3 * 3600, seed=4))
    cfg = SimulationConfig(
        service=SERVICE,
        cold_start=120,
        forecast_step=60.0,
        forecast_seasons=(3600.0,),
        forecast_models=("ets_log",),
        forecast_refit_seconds=3600.0,
    )
    result = simulate(trace, cfg, "predictive")
    assert result.unfinished == 0
    # the baselines always compete; with two hours seen the hourly seasonal copy joins them
    assert set(result.forecast_models) <= {
        "naive",
        "seasonal_naive_3600s",
        "ets_log",
    }
    forecasts = np.array(result.timeline.forecast)
    assert np.isnan(forecasts[:80]).all()  # the predictor waits for 20 one-minute points
    assert np.isfinite(forecasts[-10:]).all()


def test_a_seasonal_only_predictor_forecasts_with_baselines_until_two_seasons_exist():
    trace = from_arrivals(poisson(periodic_rate, 3 * 3600, seed=4))
    cfg = SimulationConfig(
        service=SERVICE,
        cold_start=120,
        forecast_step=60.0,
        forecast_seasons=(3600.0,),
        forecast_models=("seasonal_level",),
        forecast_refit_seconds=1800.0,
    )
    result = simulate(trace, cfg, "predictive")
    forecasts = np.array(result.timeline.forecast)
    # forecasting from the first fit (20 one-minute points), not only after two hours
    assert np.isfinite(forecasts[84:]).all()
    assert result.forecast_models["naive"] > 0
    assert (
        result.forecast_models["seasonal_level"] + result.forecast_models["seasonal_naive_3600s"]
        > 0
    )
    with pytest.raises(ValueError, match="unknown forecast model 'arima'"):
        replace(cfg, forecast_models=("arima",))


def test_peak_series_forecasts_the_highest_rate_of_each_step():
    """A rate at 1 with one tick at 5 in every step: the peak series sees 5, the mean ~1.2."""
    rates = {
        series: PredictorForecaster(
            60.0, 60.0, seasons_seconds=(), models=("ets_log",), series=series
        )
        for series in ("peak", "mean")
    }
    for t in np.arange(15.0, 3600.0 + 1, 15.0):
        for forecaster in rates.values():
            forecaster.observe(t, 5.0 if t % 60 == 30 else 1.0)
    peak = rates["peak"].upper(3600.0, 60.0)
    mean = rates["mean"].upper(3600.0, 60.0)
    assert peak == pytest.approx(5.0, rel=0.05)
    assert mean == pytest.approx(2.0, rel=0.05)
    # as the controller asks the predictor: a step beyond the configured horizons has no bound
    assert rates["peak"].upper(3600.0, 600.0) is None
    assert rates["peak"].refits == 1  # fitted once 20 steps were seen; the day has not passed
    with pytest.raises(ValueError, match="series"):
        PredictorForecaster(60.0, 60.0, series="median")


def test_long_warmup_waits_for_a_backtestable_history_instead_of_failing_refits(caplog):
    """22 horizons at 30 s (a 10-minute cold start): no refit is tried, and none fails, until
    the history covers the backtest of the deepest horizon; then the forecaster fits once."""
    forecaster = PredictorForecaster(
        30.0, 615.0, seasons_seconds=(), models=("ets_log",), refit_seconds=86400.0
    )
    rng = np.random.default_rng(3)
    with caplog.at_level(logging.INFO, logger="predictor"):
        for t in np.arange(15.0, 3600.0 + 1, 15.0):
            forecaster.observe(t, 2.0 + rng.normal(0.0, 0.1))
    assert not [r for r in caplog.records if r.getMessage() == "refit failed"]
    assert forecaster.refits == 1
    assert forecaster.upper(3600.0, 615.0) == pytest.approx(2.0, abs=0.5)


def test_the_configured_quantile_sets_the_bound_the_policy_sees():
    """A lower quantile gives a lower bound on a noisy load (it was always the 0.9 one)."""
    bounds = {}
    for quantile in (0.5, 0.9):
        forecaster = PredictorForecaster(
            60.0, 60.0, quantile=quantile, seasons_seconds=(), models=("ets_log",)
        )
        rng = np.random.default_rng(5)
        for t in np.arange(15.0, 3600.0 + 1, 15.0):
            forecaster.observe(t, 4.0 + rng.exponential(1.0))
        bounds[quantile] = forecaster.upper(3600.0, 60.0)
    assert bounds[0.5] < bounds[0.9]


def test_forecast_lookback_reaches_the_predictor_and_must_be_positive():
    """The bench calibrates on the last 6 hours: the predictor must be given that history."""
    cfg = small_forecast_config(forecast_lookback_seconds=6 * 3600.0)
    assert predictor_forecaster(cfg).predictor.lookback_seconds == 6 * 3600.0
    with pytest.raises(ValueError, match="forecast_lookback_seconds"):
        small_forecast_config(forecast_lookback_seconds=0.0)


def test_clairvoyant_bound_reads_the_highest_future_rate_of_the_horizon():
    """Arrivals 0.5/s until 600 s, then 3/s: from 540 s the 1-minute rate measured at the ticks
    of the next 135 s reaches 3/s by 660 s; from 300 s it stays at 0.5/s; from 585 s the next
    30 s end at 615 s, whose minute holds 45 s of the old rate and 15 s of the new."""
    arrivals = np.concatenate([np.arange(0.0, 600.0, 2.0), np.arange(600.0, 1200.0, 1 / 3)])
    bound = ClairvoyantForecaster(arrivals, metric_window=60.0, tick=15.0)
    bound.observe(540.0, 0.5)  # ignored: the bound reads the trace
    assert bound.upper(300.0, 135.0) == pytest.approx(0.5, abs=0.02)
    assert bound.upper(540.0, 135.0) == pytest.approx(3.0, abs=0.02)
    assert bound.upper(585.0, 30.0) == pytest.approx(0.5 * 45 / 60 + 3.0 * 15 / 60, abs=0.03)


def test_queue_metric_scales_a_burst_beyond_its_rate():
    steady = poisson(lambda t: 1.0, 1800, seed=9)
    burst = 600 + np.sort(np.random.default_rng(10).uniform(0, 5, 400))
    trace = from_arrivals(np.concatenate([steady, burst]))
    in_burst = (trace.arrivals >= 600) & (trace.arrivals <= 605)
    cfg = SimulationConfig(service=SERVICE, cold_start=60, slo_seconds=5)
    rate_only = simulate(trace, cfg, "hpa")
    with_queue = simulate(trace, replace(cfg, queue_target=2.0), "hpa")
    assert with_queue.drivers["metric:queue_length/reactive"] >= 1
    assert max(with_queue.timeline.replicas) > max(rate_only.timeline.replicas)
    # 400 requests need 100 batches of 2.5 s: the extra replicas drain the backlog sooner
    assert with_queue.latency[in_burst].mean() < rate_only.latency[in_burst].mean()
    assert max(with_queue.timeline.queue) >= 300  # the burst queued before replicas came
    with pytest.raises(ValueError, match="queue_target"):
        SimulationConfig(service=SERVICE, queue_target=0)


def test_score_from_leaves_the_warm_up_out_of_the_slo():
    trace = from_arrivals(poisson(lambda t: 8.0 if t < 300 else 1.0, 1800, seed=11))
    cfg = SimulationConfig(service=SERVICE, cold_start=120, slo_seconds=3)
    all_minutes = summarise(simulate(trace, cfg, "hpa"))
    later = summarise(simulate(trace, replace(cfg, score_from=600.0), "hpa"))
    assert later["breach_minutes"] < all_minutes["breach_minutes"]
    assert later["scored_requests"] == int((trace.arrivals >= 600).sum())
    assert later["minutes"] == len(np.unique(trace.arrivals[trace.arrivals >= 600] // 60))
    assert later["gpu_hours"] == pytest.approx(all_minutes["gpu_hours"])  # cost is never cut


def test_superpose_keeps_the_time_axis_and_multiplies_the_load():
    base = from_arrivals(np.arange(0.0, 7200.0, 10.0), work=np.arange(720) % 3 + 1.0)
    trace = superpose(base, copies=4, jitter_seconds=60.0, seed=1)
    assert len(trace) == 4 * len(base)
    assert trace.work.sum() == pytest.approx(4 * base.work.sum())
    assert np.all(np.diff(trace.arrivals) >= 0) and trace.arrivals[0] == 0.0
    assert trace.duration == pytest.approx(base.duration, abs=120.0)
    hourly = np.bincount((trace.arrivals // 3600).astype(int))
    assert abs(hourly[0] - 4 * 360) <= 4 * 6  # only requests near the hour edge move
    again = superpose(base, copies=4, jitter_seconds=60.0, seed=1)
    np.testing.assert_array_equal(trace.arrivals, again.arrivals)
    assert superpose(base, 1, 60.0) is base
    with pytest.raises(TraceError, match="copies"):
        superpose(base, 0, 60.0)


def test_fleet_counts_stay_exact_through_many_scale_changes():
    arrivals = np.sort(np.random.default_rng(12).uniform(0, 600, 3000))
    fleet = Fleet(arrivals, np.ones(3000), SERVICE, cold_start=20, initial_replicas=2)
    for step, desired in enumerate([6, 3, 9, 1, 4, 4, 0, 7, 2, 5] * 3):
        fleet.advance(step * 20.0)
        fleet.scale_to(desired)
        live = [r for r in fleet.replicas if r.removed_at is None and not r.removing]
        assert fleet.replica_count == len(live) == desired
        assert fleet.ready_count == sum(1 for r in live if r.ready_at <= fleet.now)
    fleet.advance(10_000)
    assert not np.isnan(fleet.finished).any()


def test_load_trace_time_formats_window_and_speed(tmp_path):
    csv = tmp_path / "t.csv"
    csv.write_text(
        "when,exec\n2024-01-01 00:00:10,2\n2024-01-01 00:00:00,4\n2024-01-01 00:01:00,0\n"
    )
    trace = load_trace(csv, time_column="when", work_column="exec", speed=2)
    assert list(trace.arrivals) == [0.0, 5.0, 30.0]
    assert trace.work.mean() == pytest.approx(1.0) and trace.mean_work_raw == pytest.approx(2.0)
    epoch = tmp_path / "e.csv"
    epoch.write_text("ts\n1000\n1500\n1250\n")
    trace = load_trace(epoch, time_column="ts", time_format="epoch_ms", duration=0.4)
    assert list(trace.arrivals) == [0.0, 0.25]
    with pytest.raises(TraceError, match="no column 'nope'"):
        load_trace(csv, time_column="nope")
    with pytest.raises(TraceError, match="does not parse"):
        load_trace(csv, time_column="exec", time_format="%Y-%m-%d")


def test_cli_writes_json_and_plot(tmp_path, capsys):
    csv = tmp_path / "trace.csv"
    times = poisson(lambda t: 2.0, 900, seed=5)
    csv.write_text("t\n" + "\n".join(f"{x:.3f}" for x in times) + "\n")
    out, png = tmp_path / "r.json", tmp_path / "r.png"
    rc = simulate_main(
        [
            "--trace",
            str(csv),
            "--time-column",
            "t",
            "--policy",
            "hpa",
            "--c",
            "0.5",
            "--a",
            "0.5",
            "--max-batch",
            "4",
            "--json",
            str(out),
            "--plot",
            str(png),
        ]
    )
    assert rc == 0
    summary = json.loads(out.read_text())
    assert summary["policy"] == "hpa" and summary["requests"] == len(times)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "slo_minutes" in capsys.readouterr().out
    assert simulate_main(["--trace", str(tmp_path / "missing.csv")]) == 2


def test_simulate_takes_a_dataset_name(tmp_path, capsys, monkeypatch):
    """A shipped excerpt replays by name; a whole trace not fetched yet names the fetch command."""
    out = tmp_path / "summary.json"
    assert simulate_main(["--trace", "azure-llm-conv-10min", "--json", str(out)]) == 0
    assert json.loads(out.read_text())["requests"] == 2863
    monkeypatch.setenv("AUTOGLM_TRACES_DIR", str(tmp_path / "empty"))
    capsys.readouterr()
    assert simulate_main(["--trace", "azure-llm-conv"]) == 2
    assert "autoglm datasets fetch azure-llm-conv" in capsys.readouterr().err


def small_forecast_config(**changes) -> SimulationConfig:
    base = SimulationConfig(
        service=SERVICE,
        cold_start=120,
        forecast_step=60.0,
        forecast_seasons=(),
        forecast_models=("ets_log",),
        forecast_refit_seconds=1800.0,
    )
    return replace(base, **changes)


def test_a_shared_forecaster_gives_every_target_the_forecasts_a_fresh_one_would():
    trace = from_arrivals(poisson(periodic_rate, 2 * 3600, seed=11))
    base = small_forecast_config()
    shared = SharedForecaster(predictor_forecaster(base))
    for target in (0.5, 0.8, 0.6):  # not in time order of anything: each run replays from 0
        cfg = replace(base, target_utilization=target)
        alone = simulate(trace, cfg, "predictive")
        reused = simulate(trace, cfg, "predictive", shared)
        np.testing.assert_array_equal(alone.timeline.forecast, reused.timeline.forecast)
        assert alone.timeline.replicas == reused.timeline.replicas
        assert alone.forecast_models == reused.forecast_models
        assert summarise(alone)["breach_minutes"] == summarise(reused)["breach_minutes"]
    # the wrapped predictor saw the load once: as many refits as one standalone pass
    standalone = predictor_forecaster(base)
    simulate(trace, base, "predictive", standalone)
    assert shared.inner.refits == standalone.refits


def test_a_shared_forecaster_refuses_a_different_load():
    base = small_forecast_config()
    shared = SharedForecaster(predictor_forecaster(base))
    simulate(from_arrivals(poisson(lambda t: 3.0, 1200, seed=1)), base, "predictive", shared)
    with pytest.raises(ValueError, match="same trace"):
        simulate(from_arrivals(poisson(lambda t: 3.0, 1200, seed=2)), base, "predictive", shared)
    with pytest.raises(ValueError, match="same tick"):
        simulate(
            from_arrivals(poisson(lambda t: 3.0, 1200, seed=1)),
            replace(base, tick=10.0),
            "predictive",
            shared,
        )


def test_one_shared_pass_answers_every_recorded_quantile_as_a_fresh_predictor_would():
    trace = from_arrivals(poisson(periodic_rate, 2 * 3600, seed=13))
    base = small_forecast_config(forecast_series="peak")
    shared = SharedForecaster(predictor_forecaster(base), quantiles=(0.5, 0.9))
    headline = simulate(trace, base, "predictive", shared)  # the default (0.9) records both
    bounds = {}
    for quantile in (0.5, 0.9):
        cfg = replace(base, forecast_quantile=quantile)
        alone = simulate(trace, cfg, "predictive")
        reused = simulate(trace, cfg, "predictive", shared.at_quantile(quantile))
        np.testing.assert_array_equal(alone.timeline.forecast, reused.timeline.forecast)
        assert alone.timeline.replicas == reused.timeline.replicas
        assert alone.forecast_models == reused.forecast_models
        bounds[quantile] = np.nansum(reused.timeline.forecast)
    np.testing.assert_array_equal(headline.timeline.forecast, reused.timeline.forecast)
    assert bounds[0.5] < bounds[0.9]
    standalone = predictor_forecaster(base)
    simulate(trace, base, "predictive", standalone)
    assert shared.inner.refits == standalone.refits  # one pass for all quantiles
    with pytest.raises(ValueError, match="not recorded"):
        shared.at_quantile(0.7)


def test_window_scores_split_a_run_into_parts_that_add_up_to_the_whole():
    trace = from_arrivals(poisson(periodic_rate, 3 * 3600, seed=14))
    cfg = SimulationConfig(service=SERVICE, cold_start=180, slo_seconds=5)
    result = simulate(trace, cfg, "hpa")
    whole = summarise(result)
    assert whole["breach_minutes"] > 0  # the peaks breach, so the split below means something
    everything = window_scores(result, 0.0, result.end_time + cfg.tick)
    assert everything["breach_minutes"] == whole["breach_minutes"]
    assert everything["minutes"] == whole["minutes"]
    # ordered replica-hours: the billed figure less the draining tails and the first tick
    assert everything["gpu_hours"] == pytest.approx(whole["gpu_hours"], rel=0.02)
    # a cut inside a minute: that minute goes to the window its start lies in, not to both
    first, second = window_scores(result, 0.0, 5430.0), window_scores(result, 5430.0, 1e9)
    assert first["breach_minutes"] + second["breach_minutes"] == whole["breach_minutes"]
    assert first["gpu_hours"] + second["gpu_hours"] == pytest.approx(everything["gpu_hours"])
    assert first["gpu_hours"] > 0 and second["gpu_hours"] > 0
    with pytest.raises(ValueError, match="start < end"):
        window_scores(result, 10.0, 10.0)


HPA_CURVE = [
    FrontierPoint("hpa", 0.8, 100.0, 400),
    FrontierPoint("hpa", 0.7, 120.0, 200),
    FrontierPoint("hpa", 0.6, 140.0, 100),
]


def test_frontier_interpolates_between_the_reference_points_around_a_candidate():
    below = compare(HPA_CURVE, FrontierPoint("p", 0.7, 110.0, 250))
    assert below.verdict == "below"
    assert below.reference_breaches == pytest.approx(300.0)  # halfway from 400 to 200
    assert below.reference_gpu_hours == pytest.approx(115.0)  # HPA pays 115 for 250 breaches
    above = compare(HPA_CURVE, FrontierPoint("p", 0.7, 130.0, 150))
    assert above.verdict == "on_or_above"  # exactly on the line is not better
    assert above.reference_breaches == pytest.approx(150.0)
    costlier = compare(HPA_CURVE, FrontierPoint("p", 0.5, 200.0, 10))
    assert costlier.verdict == "outside"
    assert costlier.reference_breaches is None and costlier.reference_gpu_hours is None
    # order of the reference points does not matter
    assert compare(HPA_CURVE[::-1], FrontierPoint("p", 0.7, 110.0, 250)) == below


def test_frontier_reads_no_equal_quality_cost_where_the_reference_is_not_monotone():
    bumpy = [*HPA_CURVE, FrontierPoint("hpa", 0.5, 160.0, 120)]
    placed = compare(bumpy, FrontierPoint("p", 0.6, 150.0, 90))
    assert placed.verdict == "below"
    assert placed.reference_breaches == pytest.approx(110.0)
    assert placed.reference_gpu_hours is None
    with pytest.raises(ValueError, match="two reference points"):
        compare(HPA_CURVE[:1], FrontierPoint("p", 0.6, 150.0, 90))


def test_frontier_plot_is_written(tmp_path):
    path = tmp_path / "frontier.png"
    plot_frontiers({"a": [*HPA_CURVE, FrontierPoint("p", 0.7, 110.0, 250)]}, path, "t")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_reachability_names_the_limits_no_forecast_moves():
    """The static-share floor is static's utilization over the target; an HPA without breach
    minutes leaves nothing for 'fewer' to improve on; goals are reported as each run met them."""

    def row(trace, label, util, breaches, goals=None):
        r = {"trace": trace, "label": label, "target_utilization": 0.7}
        r.update(mean_utilization=util, breach_minutes=breaches)
        return r | ({"goals": goals} if goals else {})

    rows = [
        row("flat", "static", 0.462, 0),
        row("flat", "hpa", 0.58, 0),
        row("flat", "predictive", 0.55, 0, {"gpu_hours_at_most_hpa": False}),
        row("flat", "clairvoyant", 0.58, 0, {"gpu_hours_at_most_hpa": True}),
        row("bursty", "static", 0.07, 0),
        row("bursty", "hpa", 0.45, 12),
        row("bursty", "predictive", 0.40, 3, {"gpu_hours_at_most_hpa": False}),
        row("bursty", "clairvoyant", 0.45, 1, {"gpu_hours_at_most_hpa": True}),
    ]
    reach = comparison.reachability(rows)
    assert reach["flat"]["static_share_floor"] == pytest.approx(0.66)
    assert reach["flat"]["static_share_floor_with_tolerance"] == pytest.approx(0.6)
    assert not reach["flat"]["fewer_breaches_possible"]
    assert reach["bursty"]["fewer_breaches_possible"]
    assert reach["bursty"]["static_share_floor"] == pytest.approx(0.1)
    assert reach["bursty"]["predictive"] == {"gpu_hours_at_most_hpa": False}
    assert reach["bursty"]["clairvoyant"] == {"gpu_hours_at_most_hpa": True}


@pytest.mark.timeout(120)
def test_bench_frontier_section_reuses_headline_rows_and_places_each_variant():
    trace = from_arrivals(poisson(periodic_rate, 2 * 3600, seed=12))
    config = small_forecast_config()
    forecasters = {
        series: SharedForecaster(predictor_forecaster(replace(config, forecast_series=series)))
        for series in ("mean", "peak")
    }
    headline = summarise(simulate(trace, replace(config, target_utilization=0.6), "hpa"))
    known = {("hpa", 0.6): {**headline, "breach_minutes": 12345}}  # marked, to see it reused
    rows = comparison.run_frontier(trace, config, [0.6, 0.8], forecasters, known, [0.5, 0.6, 0.8])
    assert [(r["label"], r["target_utilization"]) for r in rows] == [
        ("hpa", 0.5),
        ("hpa", 0.6),
        ("hpa", 0.8),
        *((label, t) for label in ("predictive-mean", "predictive-peak") for t in (0.6, 0.8)),
    ]
    reused = [r for r in rows if r["reused_from_headline"]]
    assert [(r["label"], r["breach_minutes"]) for r in reused] == [("hpa", 12345)]
    # a fresh run at 0.8 spends fewer GPU-hours than one at 0.5
    hpa = {r["target_utilization"]: r for r in rows if r["label"] == "hpa"}
    assert hpa[0.8]["gpu_hours"] < hpa[0.5]["gpu_hours"]
    for r in rows:
        if r["label"] == "hpa":
            assert "vs_hpa_frontier" not in r
        else:
            assert r["vs_hpa_frontier"] in ("below", "on_or_above", "outside")
            inside = hpa[0.8]["gpu_hours"] <= r["gpu_hours"] <= hpa[0.5]["gpu_hours"]
            assert (r["hpa_breaches_at_same_gpu_hours"] is not None) == inside
    tally = comparison.frontier_verdicts(rows)
    assert set(tally) == {"predictive-mean", "predictive-peak"}
    assert all(sum(t.values()) == 2 for t in tally.values())


@pytest.mark.timeout(120)
def test_bench_quantile_sweep_chooses_on_the_first_part_and_judges_on_the_second():
    trace = from_arrivals(poisson(periodic_rate, 4 * 3600, seed=15))
    config = small_forecast_config(forecast_series="peak", slo_seconds=5)
    shared = SharedForecaster(predictor_forecaster(config), quantiles=(0.5, 0.9))
    hpa = simulate(trace, config, "hpa")
    headline = simulate(trace, config, "predictive", shared)
    sweep = comparison.run_quantile_sweep(
        trace, config, [0.5, 0.9], shared, {0.9: headline}, hpa, 0.5
    )
    split = sweep["split_seconds"]
    assert split % 60 == 0 and trace.duration / 2 - 60 < split <= trace.duration / 2
    rows = {r["quantile"]: r for r in sweep["rows"]}
    assert rows[0.9]["reused_from_headline"] and not rows[0.5]["reused_from_headline"]
    assert rows[0.5]["gpu_hours"] < rows[0.9]["gpu_hours"]  # a lower bound orders less
    for r in rows.values():
        for window in ("choose", "judge"):
            hpa_scores = sweep["hpa"][window]
            expected = (
                r[window]["breach_minutes"] < hpa_scores["breach_minutes"]
                and r[window]["gpu_hours"] <= hpa_scores["gpu_hours"]
            )
            assert r[window]["beats_hpa"] == expected
    winners = [q for q, r in rows.items() if r["choose"]["beats_hpa"]]
    if winners:
        chosen = min(winners, key=lambda q: (rows[q]["choose"]["breach_minutes"], q))
        assert sweep["chosen_quantile"] == chosen
        assert sweep["chosen_beats_hpa_out_of_sample"] == rows[chosen]["judge"]["beats_hpa"]
    else:
        assert sweep["chosen_quantile"] is None
        assert sweep["chosen_beats_hpa_out_of_sample"] is None
