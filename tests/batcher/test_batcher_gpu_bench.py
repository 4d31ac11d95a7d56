"""The GPU benchmark script, run in its CPU mode: it must work the first time it meets an H200.

A session with a GPU has a few minutes of device time, so ``bench/batcher_gpu.py`` has to run
end to end unattended. Its ``--device cpu --smoke`` mode runs the same code with a small model and
a few short points: seven real servers, the HTTP sweep and top-rate round, both memory
configurations, the JSON. The deadline is generous: on a busy machine the servers start slowly.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.live
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_smoke_cpu_mode_runs_the_sweep_and_both_memory_configurations(tmp_path: Path) -> None:
    out = tmp_path / "gpu.json"
    run = subprocess.run(
        [sys.executable, "bench/batcher_gpu.py", "--device", "cpu", "--smoke", "--json", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    report = json.loads(out.read_text())

    sweep = report["sweep"]
    assert sweep["device"] == "cpu" and sweep["offline_peak"] > 0
    # the smoke's two policies (the five run through the same code in bench/batcher.py's smoke)
    assert [row["policy"] for row in sweep["top_rates"]] == ["fixed-delay", "adaptive"]
    assert all(len(row["values"]) == 1 for row in sweep["top_rates"])  # one round
    assert set(sweep["ratios"]) == {"adaptive/fixed-delay"}
    assert set(sweep["goals"]) == {
        "adaptive >= 0.85 offline peak",
        "adaptive ahead of fixed-delay",
    }

    compaction, none = report["memory"]
    assert (compaction["config"], none["config"]) == ("compaction", "none")
    assert compaction["pad_buckets"]  # padding on: the warm-up's buckets
    assert none["pad_buckets"] is None  # padding off
    assert "--no-expandable-segments" in none["flags"]
    for run_ in (compaction, none):
        assert len(run_["points"]) > 0 and all(p["ok"] > 0 for p in run_["points"])
        assert run_["peaks"] == {}  # no caching allocator on a CPU: absent, not zero
    assert "no caching allocator on this device" in run.stdout
