"""How long the stack's own processes waited for a CPU core: the machine's share of a run's result.

Every part of ``autoglm up`` is a Python process on the same cores: the load generator, the job
runner, the Service and the autoscaler in the stack's process, one process per batcher worker.
On a busy machine they queue for a core, and that queueing shows up as the product's fault: a
late answer, a worker slow to start, a best-effort request sent late. Linux counts it per
thread (``/proc/PID/task/TID/schedstat``: nanoseconds on a CPU, then nanoseconds runnable but
waiting in a run queue), so a run can say how much of its time was the machine's: the seconds
its threads waited for a core, per second they ran. Near 0 on an idle machine; above 1 the
stack spent more time waiting for a core than running.

Counters are cumulative per process and vanish with it, so :class:`CpuWaitLedger` keeps the last
reading of every process it has seen and sums them. Off Linux there is nothing to read and the
figures stay ``None``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")


@dataclass(frozen=True)
class CpuTimes:
    """Seconds on a CPU and seconds runnable but waiting for one, summed over threads."""

    run_seconds: float
    wait_seconds: float

    @property
    def wait_per_run(self) -> float | None:
        """Seconds waited for a core per second run (None before anything ran)."""
        return self.wait_seconds / self.run_seconds if self.run_seconds > 0 else None


def process_cpu_times(pid: int, proc: Path = PROC) -> CpuTimes | None:
    """The process's threads' times so far; None when it is gone or there is no schedstat."""
    run = wait = read = 0
    try:
        tasks = list((proc / str(pid) / "task").iterdir())
    except OSError:
        return None
    for task in tasks:
        try:
            fields = (task / "schedstat").read_text().split()
        except OSError:
            continue  # a thread that ended meanwhile
        if len(fields) >= 2:
            run += int(fields[0])
            wait += int(fields[1])
            read += 1
    return CpuTimes(run / 1e9, wait / 1e9) if read else None


class CpuWaitLedger:
    """The last reading of every process seen; :meth:`totals` sums them, ended ones included."""

    def __init__(self, proc: Path = PROC) -> None:
        self.proc = proc
        self._last: dict[int, CpuTimes] = {}

    def observe(self, pids: Iterable[int]) -> None:
        """Read the processes now (those gone keep their last reading)."""
        for pid in pids:
            times = process_cpu_times(pid, self.proc)
            if times is not None:
                self._last[pid] = times

    def totals(self) -> CpuTimes | None:
        """Summed over every process seen; None when none could be read."""
        if not self._last:
            return None
        return CpuTimes(
            sum(t.run_seconds for t in self._last.values()),
            sum(t.wait_seconds for t in self._last.values()),
        )
