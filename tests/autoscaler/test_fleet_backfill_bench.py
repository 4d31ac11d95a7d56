"""``bench/fleet_backfill.py --smoke`` end to end on the real traces (slow: it replays them)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from autoglm.datasets import expected_path, fetch_hint

ROOT = Path(__file__).resolve().parents[2]
MISSING = [
    name for name in ("genai-requests", "azure-llm-conv") if not expected_path(name).is_file()
]


@pytest.fixture
def bench(monkeypatch):
    monkeypatch.setattr(sys, "path", list(sys.path))  # the bench script rewrites sys.path[0]
    spec = importlib.util.spec_from_file_location(
        "bench_fleet_backfill", ROOT / "bench" / "fleet_backfill.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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
