"""Progress, rate and ETA of a job, on a terminal bar or as periodic log lines.

The rate is measured over a recent window rather than since the start, so the ETA follows the
fleet's idle capacity as it changes (a best-effort job slows down when online traffic rises).
"""

from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

log = logging.getLogger(__name__)


class RateWindow:
    """Lines per second over the last ``window_seconds``; time is passed in, never read."""

    def __init__(self, window_seconds: float = 30.0) -> None:
        self.window_seconds = window_seconds
        self._samples: deque[tuple[float, int]] = deque()

    def add(self, now: float, completed: int) -> None:
        """Record the running count of completed lines at time ``now``."""
        self._samples.append((now, completed))
        while len(self._samples) > 2 and now - self._samples[1][0] >= self.window_seconds:
            self._samples.popleft()

    def rate(self) -> float:
        if len(self._samples) < 2:
            return 0.0
        (t0, c0), (t1, c1) = self._samples[0], self._samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else 0.0


def eta_seconds(remaining: int, rate: float) -> float:
    """Seconds left at ``rate`` lines/s; infinite while nothing is being answered."""
    if remaining <= 0:
        return 0.0
    return remaining / rate if rate > 0 else math.inf


def format_duration(seconds: float) -> str:
    if math.isinf(seconds):
        return "unknown"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


@dataclass
class Snapshot:
    """What the display shows at one instant."""

    total: int
    done: int
    ok: int
    invalid: int
    in_flight: int
    concurrency: int
    refusals: int
    rate: float

    @property
    def remaining(self) -> int:
        return self.total - self.done

    @property
    def eta(self) -> float:
        return eta_seconds(self.remaining, self.rate)


class ProgressDisplay:
    """A rich progress bar on a terminal, structured log lines elsewhere, or nothing."""

    def __init__(self, mode: str, interval_seconds: float, job_name: str, is_tty: bool) -> None:
        if mode == "auto":
            mode = "bar" if is_tty else "lines"
        self.mode = mode
        self.interval_seconds = interval_seconds
        self.job_name = job_name
        self._last_line = -math.inf
        self._bar: Progress | None = None
        self._task: TaskID | None = None

    def start(self, total: int, done: int) -> None:
        if self.mode != "bar":
            return
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]:.1f} lines/s"),
            TextColumn("concurrency {task.fields[concurrency]}"),
            TextColumn("refused {task.fields[refusals]}"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
            transient=False,
        )
        self._bar.start()
        self._task = self._bar.add_task(
            self.job_name, total=total, completed=done, rate=0.0, concurrency=0, refusals=0
        )

    def update(self, now: float, snap: Snapshot, force: bool = False) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.update(
                self._task,
                completed=snap.done,
                rate=snap.rate,
                concurrency=snap.concurrency,
                refusals=snap.refusals,
            )
        elif self.mode == "lines" and (force or now - self._last_line >= self.interval_seconds):
            self._last_line = now
            log.info(
                "progress",
                extra={
                    "job_name": self.job_name,
                    "done": snap.done,
                    "total": snap.total,
                    "ok": snap.ok,
                    "invalid": snap.invalid,
                    "in_flight": snap.in_flight,
                    "concurrency": snap.concurrency,
                    "refusals": snap.refusals,
                    "rate_lines_per_second": round(snap.rate, 2),
                    "eta": format_duration(snap.eta),
                },
            )

    def stop(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None
