"""The CPU-wait ledger: schedstat read per thread, summed over processes, ended ones kept."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from stack.cpu_wait import CpuTimes, CpuWaitLedger, process_cpu_times


def fake_proc(root: Path, pid: int, threads: dict[int, tuple[int, int]]) -> None:
    for tid, (run_ns, wait_ns) in threads.items():
        task = root / str(pid) / "task" / str(tid)
        task.mkdir(parents=True, exist_ok=True)
        (task / "schedstat").write_text(f"{run_ns} {wait_ns} 7\n")


def test_threads_are_summed(tmp_path: Path) -> None:
    fake_proc(
        tmp_path, 10, {10: (2_000_000_000, 1_000_000_000), 11: (1_000_000_000, 5_000_000_000)}
    )
    times = process_cpu_times(10, tmp_path)
    assert times == CpuTimes(3.0, 6.0)
    assert times.wait_per_run == pytest.approx(2.0)
    assert process_cpu_times(99, tmp_path) is None  # gone
    assert CpuTimes(0.0, 0.0).wait_per_run is None


def test_a_process_that_ended_keeps_its_last_reading(tmp_path: Path) -> None:
    ledger = CpuWaitLedger(tmp_path)
    assert ledger.totals() is None
    fake_proc(tmp_path, 1, {1: (1_000_000_000, 0)})
    fake_proc(tmp_path, 2, {2: (1_000_000_000, 500_000_000)})
    ledger.observe([1, 2])
    fake_proc(tmp_path, 1, {1: (3_000_000_000, 1_000_000_000)})  # ran on and waited
    shutil.rmtree(tmp_path / "2")  # worker 2 stopped
    ledger.observe([1, 2])
    assert ledger.totals() == CpuTimes(4.0, 1.5)


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path(f"/proc/{os.getpid()}/schedstat").exists(),
    reason="schedstat is Linux's",
)
def test_this_process_has_run() -> None:
    times = process_cpu_times(os.getpid())
    assert times is not None and times.run_seconds > 0 and times.wait_seconds >= 0
