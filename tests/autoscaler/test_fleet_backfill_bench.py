"""``bench/fleet_backfill.py --smoke`` end to end on the real traces (slow: it replays them)."""

from __future__ import annotations

import importlib
import json
import sys
from types import SimpleNamespace

import numpy as np
import pytest

from autoglm.datasets import expected_path, fetch_hint

MISSING = [
    name for name in ("genai-requests", "azure-llm-conv") if not expected_path(name).is_file()
]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # a first import rewrites sys.path[0]
    return importlib.import_module("bench.fleet_backfill")


@pytest.mark.slow
@pytest.mark.skipif(
    bool(MISSING), reason=f"needs the whole traces: {'; '.join(map(fetch_hint, MISSING))}"
)
def test_smoke_run_writes_every_policy_with_and_without_backfill(bench, tmp_path, capsys):
    out = tmp_path / "fleet.json"
    assert bench.main(["--smoke", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["smoke"] is True
    fleets = {r["fleet"] for r in result["rows"]}
    assert fleets == {"alibaba-8t-120s", "azure-120s"}
    for fleet in fleets:
        rows = {r["label"]: r for r in result["rows"] if r["fleet"] == fleet}
        assert {"hpa", "hpa+bf", "slo", "slo+bf", "clairvoyant-slo"} <= set(rows)
        for label in ("hpa", "slo"):
            plain, filled = rows[label], rows[f"{label}+bf"]
            assert plain["backfill_busy"] == 0
            assert filled["backfill_busy"] > 0
            assert filled["total_busy"] > plain["total_busy"]
            # backfill changes neither the sizing decisions' inputs nor what is paid much
            assert filled["gpu_hours"] == pytest.approx(plain["gpu_hours"], rel=0.05)
            assert filled["slo_minutes_change_pp"] == pytest.approx(
                100 * (filled["slo_minutes"] - plain["slo_minutes"])
            )
        assert rows["slo"]["sizing"] == "slo" and rows["hpa"]["sizing"] == "target"
    goals = result["goals"]["alibaba-8t-120s"]
    assert set(goals["slo+bf"]) >= {"total_busy_at_least_0.90", "slo_within_0.2pp"}
    assert "vs_hpa_frontier" in goals["slo"]
    printed = capsys.readouterr().out
    assert "alibaba-8t-120s slo goals:" in printed and "wrote" in printed


def test_unknown_fleet_is_refused(bench, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench.main(["--fleets", "alibaba-9t-120s"])
    assert exit_info.value.code == 2
    assert "unknown fleet 'alibaba-9t-120s'" in capsys.readouterr().err


def test_binomial_check_sets_clustered_lateness_beside_independent_lateness(bench):
    """Two minutes of 50 requests, two late ones together in the first: 2% late, one breach
    minute, where independent lateness at 2% would breach 2 * (1 - 0.98^50) of them."""
    from autoscaler.core.slo_objective import request_exceedance_for_objective
    from autoscaler.core.slo_sizing import ServiceModel

    config = bench.SimulationConfig(
        service=ServiceModel(1.0, 0.1, 4), slo_seconds=10.0, slo_objective=0.995
    )
    arrivals = np.concatenate([np.linspace(0, 59, 50), np.linspace(60, 119, 50)])
    latency = np.full(100, 1.0)
    latency[[3, 4]] = [30.0, np.inf]  # one over the SLO, one never served
    result = SimpleNamespace(
        config=config, trace=SimpleNamespace(arrivals=arrivals), latency=latency
    )

    row = bench.binomial_check(result)

    independent_breaches = 2 * (1 - 0.98**50)
    assert row["late_share"] == pytest.approx(0.02)
    assert row["binomial_breach_minutes"] == pytest.approx(independent_breaches)
    assert row["late_per_late_minute"] == 2.0
    assert row["binomial_late_per_late_minute"] == pytest.approx(2 / independent_breaches)
    assert row["objective_late_share"] == pytest.approx(
        request_exceedance_for_objective(50, 0.99, 0.995)
    )
