"""The trace-driven simulator on small synthetic traces, with the real decision core."""

from __future__ import annotations

import json

import numpy as np
import pytest

from autoscaler.simulator.cli import simulate_main
from autoscaler.simulator.engine import SimulationConfig, peak_replicas, simulate
from autoscaler.simulator.fleet import Fleet, ServiceModel
from autoscaler.simulator.report import summarise
from autoscaler.simulator.trace import TraceError, from_arrivals, load_trace

SERVICE = ServiceModel(c=0.5, a=0.5, max_batch=4)  # 4 req/s per replica at full batches


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
    durations = np.round(fleet.finished - fleet.started, 9)
    assert set(durations) <= {1.0, 1.5, 2.0, 2.5}
    batches = set(zip(fleet.started, fleet.finished, strict=True))
    assert fleet.busy_seconds == pytest.approx(sum(f - s for s, f in batches))


def test_cold_start_delays_service_and_scale_down_drains_busy_replicas():
    fleet = Fleet(np.array([0.0, 0.1]), np.ones(2), ServiceModel(c=5, a=0, max_batch=1), 30, 0)
    fleet.scale_to(1)
    fleet.advance(100)
    assert fleet.started[0] == pytest.approx(30.0)  # waited for the cold start
    fleet2 = Fleet(np.array([0.0]), np.ones(1), ServiceModel(c=50, a=0), 0, 1)
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
    """Stand-in forecaster: the value one season ago, over the horizon, times a margin."""

    name = "seasonal_naive_stand_in"

    def __init__(self, period: int) -> None:
        self.period = period
        self.history: list[float] = []

    def observe(self, value: float) -> None:
        self.history.append(value)

    def upper(self, horizon_steps: int, quantile: float) -> float | None:
        n = len(self.history)
        if n < self.period:
            return None
        window = self.history[n - self.period : n - self.period + horizon_steps]
        return 1.1 * max(window)


def periodic_rate(t: float) -> float:
    return 8.0 if (t % 3600) >= 2700 else 0.5  # a daily-like peak in the last 15 min of each hour


def test_predictive_scales_before_the_periodic_peak_and_breaches_less():
    trace = from_arrivals(poisson(periodic_rate, 4 * 3600, seed=3))
    cfg = SimulationConfig(service=SERVICE, cold_start=180, slo_seconds=5, season_seconds=3600)
    hpa = simulate(trace, cfg, "hpa")
    pred = simulate(trace, cfg, "predictive", forecaster=SeasonalNaive(period=60))
    t = np.array(pred.timeline.t)
    ready_p = np.array(pred.timeline.ready)
    ready_h = np.array(hpa.timeline.ready)
    last_peak = 3 * 3600 + 2700
    at_peak = (t >= last_peak) & (t < last_peak + 15)
    # the predictive fleet is ready for the fourth peak when it starts; the reactive one is not
    assert ready_p[at_peak].min() >= 3 > ready_h[at_peak].max()
    assert pred.drivers["metric:request_rate/predictive"] >= 1
    assert summarise(pred)["breach_minutes"] < summarise(hpa)["breach_minutes"]


def test_predictive_with_the_predictor_package_model_runs_causally():
    trace = from_arrivals(poisson(periodic_rate, 3 * 3600, seed=4))
    cfg = SimulationConfig(service=SERVICE, cold_start=120, season_seconds=3600)
    result = simulate(trace, cfg, "predictive")
    assert result.unfinished == 0
    assert result.forecaster in {"seasonal_level", "naive"}
    forecasts = np.array(result.timeline.forecast)
    assert np.isnan(forecasts[:100]).all()  # nothing before 30 minutes of history
    assert np.isfinite(forecasts[-10:]).all()


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
