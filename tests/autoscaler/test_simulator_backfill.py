"""Best-effort backfill, SLO sizing and flag checking in the simulator, on small synthetic loads."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import pytest

import autoscaler.simulator.cli as cli
from autoscaler.core.slo_sizing import ServiceModel, replicas_for_slo
from autoscaler.simulator.backfill import BackfillConfig, SlackController, default_quantum
from autoscaler.simulator.engine import SimulationConfig, simulate, sized_replicas
from autoscaler.simulator.fleet import Fleet
from autoscaler.simulator.report import summarise
from autoscaler.simulator.trace import from_arrivals

SERVICE = ServiceModel(0.5, 0.5, max_batch=4)  # t(4) = 2.5 s, 1.6 req/s per replica


def poisson(rate: float, duration: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(1.0 / rate, int(rate * duration * 1.5) + 50))
    return times[times < duration]


# -- the fleet --------------------------------------------------------------------------------
def test_idle_replicas_run_best_effort_slices_and_online_waits_at_most_one_quantum():
    arrivals = np.arange(1.0, 400.0, 7.3)  # sparse: the replica is mostly idle
    fleet = Fleet(
        arrivals,
        np.ones(len(arrivals)),
        SERVICE,
        cold_start=0,
        initial_replicas=1,
        backfill_quantum=0.4,
        backfill_work=math.inf,
    )
    fleet.set_backfill_cap(1)
    fleet.advance(400.0)
    waits = fleet.started - arrivals
    assert waits.max() <= 0.4 + 1e-9
    assert waits.max() > 0  # some request did land on a running slice
    # the replica was never idle: online batches and slices fill the 400 paid seconds
    assert fleet.busy_seconds + fleet.backfill_seconds == pytest.approx(400.0, abs=0.4)
    assert fleet.busy_seconds == pytest.approx(len(arrivals) * 1.0)


def test_a_finite_backlog_is_done_once_and_then_the_replicas_idle():
    fleet = Fleet(
        np.array([500.0]), np.ones(1), SERVICE, 0, 2, backfill_quantum=1.0, backfill_work=30.5
    )
    fleet.set_backfill_cap(2)
    fleet.advance(100.0)
    assert fleet.backfill_seconds == pytest.approx(30.5)
    assert fleet.backfill_left == 0
    assert fleet.backfilling_count == 0


def test_no_slice_starts_beyond_the_cap_and_a_raised_cap_starts_idle_replicas():
    fleet = Fleet(np.array([900.0]), np.ones(1), SERVICE, 0, 4, backfill_quantum=5.0)
    fleet.backfill_left = math.inf
    fleet.advance(10.0)
    assert fleet.backfill_seconds == 0  # cap 0: off
    fleet.set_backfill_cap(3)
    assert fleet.backfilling_count == 3
    fleet.advance(22.0)
    assert fleet.backfill_seconds == pytest.approx(3 * 12.0)
    fleet.set_backfill_cap(1)  # two runs stop at their slice boundary, 25 s
    assert fleet.backfilling_count == 1
    fleet.advance(40.0)
    assert fleet.backfill_seconds == pytest.approx(3 * 15.0 + 15.0)
    fleet.set_backfill_cap(0)
    fleet.advance(60.0)
    assert fleet.backfill_seconds == pytest.approx(3 * 15.0 + 15.0)
    assert fleet.backfilling_count == 0


def test_scale_down_takes_best_effort_replicas_before_serving_ones():
    arrivals = np.array([0.0])
    fleet = Fleet(arrivals, np.ones(1), ServiceModel(50, 0, 1), 0, 2, backfill_quantum=10.0)
    fleet.backfill_left = math.inf
    fleet.advance(0.0)  # replica 1 took the request at t=0 (it was idle last)
    fleet.set_backfill_cap(1)
    assert fleet.backfilling_count == 1
    fleet.advance(1.0)
    fleet.scale_to(1)
    fleet.advance(60.0)
    assert fleet.finished[0] == pytest.approx(50.0)
    removed = [r for r in fleet.replicas if r.removed_at is not None]
    assert len(removed) == 1 and removed[0].removed_at == pytest.approx(10.0)


def test_paid_time_before_a_replica_is_ready_is_counted_as_starting():
    fleet = Fleet(np.array([0.0]), np.ones(1), ServiceModel(1, 0, 1), 30, 1)
    fleet.scale_to(3)  # two replicas ordered at 0, ready at 30
    fleet.advance(10.0)
    fleet.scale_to(2)  # one of them is cancelled after 10 s of starting
    fleet.advance(100.0)
    assert fleet.starting_seconds(100.0) == pytest.approx(10.0 + 30.0)
    assert fleet.billed_seconds(100.0) == pytest.approx(100.0 + 10.0 + 100.0)


# -- the slack controller ---------------------------------------------------------------------
def test_slack_controller_drops_to_zero_at_once_and_grows_back_in_steps():
    ctl = SlackController(BackfillConfig(margin=0.1, grow_step=0.25), slo_seconds=10.0)
    assert ctl.update(9.5) == 0.0  # slack 5% < 10%: stop
    assert ctl.update(8.5) == 0.0  # slack 15%: hold
    assert ctl.update(7.0) == 0.25  # slack 30% > 20%: grow
    assert ctl.update(None) == 0.5  # no online request: all slack
    assert ctl.update(8.5) == 0.5
    assert ctl.allowed_replicas(7) == 3
    for _ in range(5):
        ctl.update(1.0)
    assert ctl.share == 1.0 and ctl.allowed_replicas(7) == 7


def test_default_quantum_is_a_tenth_of_the_room_a_full_batch_leaves():
    assert default_quantum(SERVICE, 8.0) == pytest.approx(0.55)
    assert default_quantum(SERVICE, 2.0) == pytest.approx(0.2)  # no room: a tenth of the SLO
    assert BackfillConfig(quantum_seconds=0.3).quantum(SERVICE, 8.0) == 0.3


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"work_seconds": 0.0}, "replica-seconds"),
        ({"work_seconds": math.nan}, "replica-seconds"),
        ({"quantum_seconds": 0.0}, "quantum"),
        ({"quantum_seconds": math.inf}, "quantum"),
        ({"margin": 0.6}, "margin"),
        ({"grow_step": 0.0}, "grow step"),
        ({"window_seconds": -1.0}, "window"),
    ],
)
def test_backfill_config_refuses_bad_values(changes, message):
    with pytest.raises(ValueError, match=message):
        BackfillConfig(**changes)


# -- whole replays ----------------------------------------------------------------------------
def step_trace(seed: int = 3):
    """2 req/s for 20 minutes, 8 req/s for 20, 2 again for 20."""
    parts = [poisson(rate, 1200.0, seed + i) + 1200.0 * i for i, rate in enumerate((2, 8, 2))]
    return from_arrivals(np.concatenate(parts))


def base_config(**changes) -> SimulationConfig:
    config = SimulationConfig(service=SERVICE, cold_start=60, slo_seconds=8.0, max_replicas=30)
    return replace(config, **changes)


def test_backfill_fills_the_idle_capacity_and_keeps_the_online_slo():
    trace = step_trace()
    plain = summarise(simulate(trace, base_config(), "hpa"))
    filled = summarise(simulate(trace, base_config(backfill=BackfillConfig()), "hpa"))
    assert plain["backfill_busy"] == 0 and plain["total_busy"] == plain["online_busy"]
    assert filled["total_busy"] == pytest.approx(filled["online_busy"] + filled["backfill_busy"])
    assert filled["total_busy"] > 0.9 > plain["total_busy"]
    assert filled["backfill_replica_hours"] > 0
    assert filled["backfill_quantum_seconds"] == pytest.approx(0.55)
    assert filled["slo_minutes"] >= plain["slo_minutes"] - 1 / 60
    assert filled["unfinished"] == plain["unfinished"] == 0
    # best-effort work can use any paid time but the cold starts
    assert filled["total_busy"] <= 1 - filled["starting_share"] + 1e-9
    assert filled["starting_share"] == pytest.approx(plain["starting_share"], rel=0.01)


def test_the_slack_controller_stops_backfill_when_the_online_slo_is_at_risk():
    # one replica at most, overloaded in the middle: the slack is gone and so is best effort
    trace = step_trace()
    config = base_config(max_replicas=2, backfill=BackfillConfig(grow_step=0.5))
    result = simulate(trace, config, "hpa")
    share = np.asarray(result.timeline.backfill_share)
    t = np.asarray(result.timeline.t)
    overloaded = (t > 1500) & (t < 2400)
    assert share[overloaded].max() == 0.0
    assert share[t < 1100].max() == 1.0


def test_slo_sizing_holds_the_slo_with_the_replicas_the_model_asks_for():
    trace = step_trace()
    result = simulate(trace, base_config(sizing="slo"), "hpa")
    summary = summarise(result)
    assert summary["sizing"] == "slo"
    # breaches only while the step up's backlog drains (minutes 20-29), none in steady load
    minute = np.floor(trace.arrivals / 60.0).astype(int)
    p99 = np.array([np.percentile(result.latency[minute == m], 99) for m in range(60)])
    breached = np.flatnonzero(p99 > 8.0)
    assert len(breached) and breached.min() >= 20 and breached.max() < 30
    hpa = summarise(simulate(trace, base_config(), "hpa"))
    assert summary["gpu_hours"] < hpa["gpu_hours"]
    busy_replicas = replicas_for_slo(8.0, 8.0, SERVICE, min_replicas=1, max_replicas=30).replicas
    t = np.asarray(result.timeline.t)
    steady = (t > 1800) & (t < 2400)  # long after the step up, before the step down
    assert set(np.asarray(result.timeline.replicas)[steady]) <= {
        busy_replicas - 1,
        busy_replicas,
        busy_replicas + 1,
    }
    # the HPA's scale-down stabilization (300 s) still holds the count after the load drops
    after_drop = (t > 2400) & (t < 2400 + 240)
    assert min(np.asarray(result.timeline.replicas)[after_drop]) >= busy_replicas - 1


def test_slo_sizing_with_an_slo_no_count_can_meet_does_not_crash():
    summary = summarise(simulate(step_trace(), base_config(sizing="slo", slo_seconds=0.5), "hpa"))
    assert summary["slo_minutes"] == 0.0
    assert summary["max_replicas"] < 30  # more replicas cannot shorten a batch: not bought


def test_a_reserved_quantum_sizes_for_what_the_slo_leaves_after_it():
    """An online request may wait one best-effort quantum: with the reserve, SLO sizing holds
    SLO - quantum, so it asks for at least as many replicas, more where the quantum matters."""
    plain = base_config(sizing="slo", backfill=BackfillConfig(quantum_seconds=4.0))
    reserved = replace(plain, backfill=BackfillConfig(quantum_seconds=4.0, reserve_quantum=True))
    for rate in (0.5, 2.0, 8.0, 15.0):
        expected = replicas_for_slo(rate, 4.0, SERVICE, min_replicas=1, max_replicas=30)
        assert sized_replicas(reserved, rate) == expected.replicas
        assert sized_replicas(reserved, rate) >= sized_replicas(plain, rate)
    assert any(sized_replicas(reserved, r) > sized_replicas(plain, r) for r in (2.0, 8.0, 15.0))
    with pytest.raises(ValueError, match="quantum"):
        base_config(backfill=BackfillConfig(quantum_seconds=8.0, reserve_quantum=True))


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"forecast_quantile": 1.5}, "forecast_quantile"),
        ({"slo_quantile": 1.0}, "slo_quantile"),
        ({"cold_start": math.nan}, "cold_start"),
        ({"slo_seconds": math.inf}, "slo_seconds"),
        ({"sizing": "slo", "slo_on": "queueing"}, "end-to-end"),
        ({"sizing": "fast"}, "sizing"),
    ],
)
def test_simulation_config_refuses_bad_values(changes, message):
    with pytest.raises(ValueError, match=message):
        base_config(**changes)


# -- the command line -------------------------------------------------------------------------
@pytest.fixture
def trace_csv(tmp_path):
    csv = tmp_path / "trace.csv"
    csv.write_text("t\n" + "\n".join(f"{x:.3f}" for x in poisson(2.0, 600, 5)) + "\n")
    return csv


def run_cli(trace_csv, *flags):
    return cli.simulate_main(
        ["--trace", str(trace_csv), "--time-column", "t", "--c", "0.5", "--a", "0.5", *flags]
    )


def test_cli_runs_slo_sizing_with_backfill(trace_csv, tmp_path, capsys):
    out = tmp_path / "deep" / "r.json"
    flags = ["--sizing", "slo", "--slo-seconds", "8", "--backfill", "--json", str(out)]
    assert run_cli(trace_csv, *flags, "--max-batch", "4", "--backfill-quantum", "0.3") == 0
    summary = json.loads(out.read_text())
    assert summary["sizing"] == "slo" and summary["backfill_quantum_seconds"] == 0.3
    assert summary["total_busy"] > summary["online_busy"]
    assert "total_busy" in capsys.readouterr().out


def test_cli_reserves_the_quantum_out_of_the_slo_it_sizes_for(trace_csv, tmp_path):
    """``--reserve-quantum`` is BackfillConfig(reserve_quantum=True): the sizing holds the SLO
    less one slice, and so never buys fewer replica-hours than without it."""
    runs = {}
    for name, extra in (("plain", []), ("reserved", ["--reserve-quantum"])):
        out = tmp_path / f"{name}.json"
        flags = ["--sizing", "slo", "--slo-seconds", "8", "--backfill", "--json", str(out)]
        assert run_cli(trace_csv, *flags, "--backfill-quantum", "2", *extra) == 0
        runs[name] = json.loads(out.read_text())
    assert runs["plain"]["sized_latency_seconds"] == 8.0
    assert runs["reserved"]["sized_latency_seconds"] == 6.0
    assert runs["reserved"]["gpu_hours"] >= runs["plain"]["gpu_hours"]


@pytest.mark.parametrize("flags", [["--reserve-quantum"], ["--reserve-quantum", "--backfill"]])
def test_cli_refuses_a_reserve_with_nothing_to_reserve_from(flags, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.simulate_main(["--trace", str(tmp_path / "not-read.csv"), *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--reserve-quantum" in err and "--sizing slo" in err


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--forecast-quantile", "1.5"], "--forecast-quantile"),
        (["--forecast-quantile", "nan"], "--forecast-quantile"),
        (["--slo-quantile", "0"], "--slo-quantile"),
        (["--speed", "inf"], "--speed"),
        (["--speed", "0"], "--speed"),
        (["--c", "-1"], "--c"),
        (["--cold-start", "-inf"], "--cold-start"),
        (["--slo-seconds", "0"], "--slo-seconds"),
        (["--target-utilization", "70"], "--target-utilization"),
        (["--backfill-margin", "0.5"], "--backfill-margin"),
        (["--backfill-work", "-2"], "--backfill-work"),
        (["--forecast-season", "nan"], "--forecast-season"),
        (["--forecast-season", "-5"], "--forecast-season"),
        (["--min-replicas", "5", "--max-replicas", "2"], "--min-replicas"),
        (["--sizing", "slo", "--slo-on", "queueing"], "--sizing"),
        (["--max-batch", "0"], "--max-batch"),
    ],
)
def test_cli_refuses_bad_numbers_in_one_line_before_reading_the_trace(
    flags, named, tmp_path, capsys
):
    with pytest.raises(SystemExit) as exit_info:
        cli.simulate_main(["--trace", str(tmp_path / "not-read.csv"), *flags])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and named in err and "Traceback" not in err


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_cli_refuses_an_unwritable_output_before_the_replay(flag, trace_csv, tmp_path, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    with pytest.raises(SystemExit) as exit_info:
        run_cli(trace_csv, flag, str(blocker / "sub" / "out"))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and flag in err and "writable" in err


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_cli_refuses_a_folder_as_output_before_the_replay(
    flag, trace_csv, tmp_path, capsys, monkeypatch
):
    def no_replay(*args, **kwargs):
        raise AssertionError("the replay started")

    monkeypatch.setattr(cli, "simulate", no_replay)
    with pytest.raises(SystemExit) as exit_info:
        run_cli(trace_csv, flag, str(tmp_path))
    assert exit_info.value.code == 2
    assert "is a directory" in capsys.readouterr().err


def test_cli_sizes_for_an_objective_over_minutes(trace_csv, tmp_path):
    """``--slo-objective`` derives a per-request quantile stricter than the p99 for minutes of
    about 120 requests, so it never buys fewer replica-hours than the p99 alone."""
    runs = {}
    for name, extra in (("p99", []), ("objective", ["--slo-objective", "0.995"])):
        out = tmp_path / f"{name}.json"
        flags = ["--sizing", "slo", "--slo-seconds", "8", "--json", str(out), *extra]
        assert run_cli(trace_csv, *flags) == 0
        runs[name] = json.loads(out.read_text())
    assert runs["p99"]["slo_objective"] is None
    assert runs["objective"]["slo_objective"] == 0.995
    assert runs["objective"]["gpu_hours"] >= runs["p99"]["gpu_hours"]


def test_cli_refuses_an_objective_without_slo_sizing(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.simulate_main(["--trace", str(tmp_path / "not-read.csv"), "--slo-objective", "0.995"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--slo-objective" in err and "--sizing slo" in err
