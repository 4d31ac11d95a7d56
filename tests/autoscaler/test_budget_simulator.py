"""Several tenants under one budget in the fleet simulator, the CLI flag, and the bench smoke."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autoglm.datasets import expected_path, fetch_hint
from autoscaler.core.slo_sizing import ServiceModel
from autoscaler.simulator.cli import simulate_main
from autoscaler.simulator.engine import SimulationConfig
from autoscaler.simulator.tenants import (
    TenantSetup,
    parse_tenant_flag,
    rotated_trace,
    simulate_tenants,
    summarise_run,
    tenant_peak_replicas,
)
from autoscaler.simulator.trace import from_arrivals

ROOT = Path(__file__).resolve().parents[2]
CONFIG = SimulationConfig(
    service=ServiceModel(fixed_seconds=1.0, per_item_seconds=0.25, max_batch=8),
    cold_start=60.0,
    slo_seconds=8.0,
    sizing="slo",
    drain_limit=600.0,
    max_replicas=40,
)


def bursty(seed: int, minutes: int = 40) -> np.ndarray:
    """Poisson arrivals at 2/s with a 10-minute burst at 8/s starting at minute 15."""
    rng = np.random.default_rng(seed)
    rate = np.where(
        (np.arange(minutes * 60) // 60 >= 15) & (np.arange(minutes * 60) // 60 < 25), 8, 2
    )
    counts = rng.poisson(rate)
    return np.repeat(np.arange(minutes * 60, dtype=float), counts) + rng.random(counts.sum())


def tenants(flat: bool = False) -> list[TenantSetup]:
    trace = from_arrivals(bursty(0))
    return [
        TenantSetup("hi", trace, CONFIG, priority=0 if flat else 10),
        TenantSetup("lo", from_arrivals(bursty(1)), CONFIG, priority=0),
    ]


def test_the_high_priority_keeps_its_slo_and_the_pool_is_never_over_committed():
    setups = tenants()
    peaks = sum(tenant_peak_replicas(s) for s in setups)
    total = int(0.7 * peaks)
    run = simulate_tenants(setups, total)
    online = np.add(*(np.asarray(run.tenants[s.name].result.timeline.replicas) for s in setups))
    assert online.max() <= total and run.over_budget_ticks == 0
    report = {r["tenant"]: r for r in summarise_run(run, setups)["tenants"]}
    alone = summarise_run(simulate_tenants(setups[:1], float("inf"), None), setups[:1])
    assert report["hi"]["slo_minutes"] >= alone["tenants"][0]["slo_minutes"]
    assert report["hi"]["limited_by"] == {}
    assert report["lo"]["limited_by"].get("Priority", 0) > 0
    assert report["lo"]["breach_minutes"] > report["hi"]["breach_minutes"]


def test_priorities_move_breaches_to_the_low_priority_and_backfill_fills_the_pool():
    setups = tenants()
    total = int(0.7 * sum(tenant_peak_replicas(s) for s in setups))
    ranked = summarise_run(simulate_tenants(setups, total), setups)
    flat_setups = tenants(flat=True)
    flat = summarise_run(simulate_tenants(flat_setups, total), flat_setups)
    hi = {r["tenant"]: r for r in ranked["tenants"]}["hi"]
    hi_flat = {r["tenant"]: r for r in flat["tenants"]}["hi"]
    assert hi["breach_minutes"] < hi_flat["breach_minutes"]
    without = summarise_run(simulate_tenants(setups, total, None), setups)
    assert ranked["used_share"] > without["used_share"]
    assert ranked["used_share"] >= 0.9 and ranked["backfill_gpu_hours"] > 0


def test_rotated_traces_keep_the_load_and_move_the_bursts():
    trace = from_arrivals(bursty(0))
    shifted = rotated_trace(trace, 600.0)
    assert len(shifted) == len(trace)
    assert abs(shifted.duration - trace.duration) < 2.0
    assert (
        np.histogram(shifted.arrivals, 40)[0].argmax()
        != np.histogram(trace.arrivals, 40)[0].argmax()
    )


def test_the_tenant_flag_is_parsed_and_bad_ones_exit_2(tmp_path, capsys):
    assert parse_tenant_flag("chat:10:8:0") == ("chat", 10, 8.0, 0.0)
    csv = tmp_path / "t.csv"
    csv.write_text("TIMESTAMP\n" + "\n".join(f"{t:.3f}" for t in bursty(0, 20)) + "\n")
    base = [
        "--trace",
        str(csv),
        "--time-format",
        "epoch_s",
        "--sizing",
        "slo",
        "--slo-seconds",
        "8",
    ]
    out = tmp_path / "o.json"
    code = simulate_main(
        [
            *base,
            "--tenant",
            "hi:10:8:0",
            "--tenant",
            "lo:0:20:300",
            "--budget-gpus",
            "6",
            "--json",
            str(out),
        ]
    )
    assert code == 0
    report = json.loads(out.read_text())
    assert [r["tenant"] for r in report["tenants"]] == ["hi", "lo"]
    assert "budget used" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        simulate_main([*base, "--tenant", "hi:ten:8:0", "--budget-gpus", "6"])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        simulate_main([*base, "--tenant", "hi:10:8:0"])
    assert exc.value.code == 2


@pytest.mark.slow
@pytest.mark.skipif(
    not expected_path("azure-llm-conv").is_file(),
    reason=f"needs the whole trace: {fetch_hint('azure-llm-conv')}",
)
def test_the_bench_smoke_prints_the_table_and_writes_the_goals(tmp_path):
    out = tmp_path / "budget.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench/budget.py"), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(out.read_text())
    assert set(report["runs"]) == {"unbounded", "budget", "budget-flat"}
    assert set(report["goals"]) == {
        "high_priority_slo_minutes>=0.99",
        "budget_used>=0.90",
        "low_priority_breaches_reported",
    }
    assert report["runs"]["budget"]["over_budget_ticks"] == 0
    assert "goal budget_used>=0.90" in done.stdout
