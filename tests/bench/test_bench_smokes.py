"""The benches' smoke modes run end to end and write the report shape the full runs write.

A bench is run by hand rarely; its smoke mode (tiny inputs, figures meaningless) runs here in the
slow tier so a change that breaks a bench shows at once. The deadlines are generous: on a busy
machine the servers the benches start come up slowly. Nothing here asserts a figure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ["no-batching", "fixed-delay", "greedy", "adaptive-no-adm", "adaptive"]


def run_bench(script: str, out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    run = subprocess.run(
        [sys.executable, script, "--smoke", "--json", str(out), *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run


@pytest.mark.timeout(900)
def test_exporter_bench_smoke_compares_every_server_under_both_header_sets(tmp_path: Path) -> None:
    out = tmp_path / "exporter.json"
    run = run_bench("bench/exporter.py", out)
    report = json.loads(out.read_text())
    assert report["rounds"] == 1 and report["scrapes_per_scraper"] > 0
    assert set(report["scenarios"]) == {"requests default (text)", "prometheus (openmetrics)"}
    for row in report["scenarios"].values():
        for kind in ("exporter", "floor", "floor-nodelay"):
            served = row[kind]
            assert served["scrapes"] == report["scrapers"] * report["scrapes_per_scraper"]
            assert 0 < served["p50_ms"] <= served["p99_ms"]
            assert served["body_bytes_on_wire"] > 0
        assert row["p99_ratio_exporter_over_floor"] == pytest.approx(
            row["exporter"]["p99_ms"] / row["floor"]["p99_ms"]
        )
    assert report["collector_cpu"]["collections"] >= 1
    assert "ratio = exporter / floor" in run.stdout


@pytest.mark.timeout(900)
def test_batcher_bench_smoke_runs_both_sections_for_every_policy(tmp_path: Path) -> None:
    out = tmp_path / "batcher.json"
    run_bench("bench/batcher.py", out)
    report = json.loads(out.read_text())
    (simulated,) = report["simulated"]  # the smoke keeps one scenario
    http = report["http"]
    for section in (simulated, http):
        assert [row["policy"] for row in section["top_rates"]] == POLICIES
        assert all(len(row["values"]) == 1 for row in section["top_rates"])  # one seed, one round
        assert set(section["ratios"]) == {
            "adaptive/fixed-delay",
            "adaptive/greedy",
            "adaptive/adaptive-no-adm",
            "adaptive-no-adm/fixed-delay",
        }
    assert http["offline_peak"] > 0
    assert [p["name"] for p in simulated["policies"]] == POLICIES
