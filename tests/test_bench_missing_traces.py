"""The trace-driven benches refuse a missing trace with one line and exit 2, before any work,
as the commands that read traces do."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(
    "args",
    [
        ["bench/autoscaler.py", "--json", "{out}/a.json", "--plot", "{out}/a.png"],
        ["bench/predictor.py", "--smoke", "--traces", "{traces}", "--json", "{out}/p.json"],
    ],
    ids=["autoscaler", "predictor"],
)
def test_a_bench_without_its_trace_names_the_fetch_command(tmp_path: Path, args) -> None:
    traces = tmp_path / "traces"
    traces.mkdir()
    argv = [a.format(out=tmp_path, traces=traces) for a in args]
    env = {**os.environ, "AUTOGLM_TRACES_DIR": str(traces)}
    done = subprocess.run(
        [sys.executable, *argv], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert done.stdout == ""
    (line,) = done.stderr.splitlines()
    assert "genai-requests" in line and "autoglm datasets fetch genai-requests" in line
    assert not list(tmp_path.glob("*.json")), "a bench wrote results without its trace"
