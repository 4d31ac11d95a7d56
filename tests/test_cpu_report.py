"""tests/cpu_report.py counts a test's child processes' CPU on that test, and prints the largest."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BURN_SECONDS = 0.3


@pytest.mark.slow  # a pytest of its own in a child process
def test_a_childs_cpu_counts_on_the_test_that_reaped_it(tmp_path: Path) -> None:
    (tmp_path / "test_sample.py").write_text(
        textwrap.dedent(
            f"""
            import subprocess, sys

            BURN = "import time\\nend = time.process_time() + {BURN_SECONDS}\\n" \\
                "while time.process_time() < end: pass"

            def test_idle():
                pass

            def test_burns_in_a_child():
                subprocess.run([sys.executable, "-c", BURN], check=True)
            """
        )
    )
    report = tmp_path / "cpu.jsonl"
    run = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"),
            *("-p", "tests.cpu_report", "--cpu-report", str(report)),
            *("--rootdir", str(tmp_path), str(tmp_path / "test_sample.py")),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    records = {
        r["test"].split("::")[1]: r for r in map(json.loads, report.read_text().splitlines())
    }
    assert set(records) == {"test_idle", "test_burns_in_a_child"}
    burn, idle = records["test_burns_in_a_child"], records["test_idle"]
    assert burn["children_cpu_seconds"] >= BURN_SECONDS * 0.9
    assert burn["cpu_seconds"] >= burn["children_cpu_seconds"]
    assert idle["children_cpu_seconds"] == 0
    summary = run.stdout.split("CPU seconds (own + reaped children)")[1]
    assert "in 2 tests" in summary
    first = summary.splitlines()[2]  # after the title's rest and the total
    assert first.endswith("test_burns_in_a_child"), summary
