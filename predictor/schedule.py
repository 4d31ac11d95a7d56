"""The running predictor's timetable: a refit at once and every refit interval, and a poll every
update interval, each on apscheduler's background thread, never two of one kind at a time."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any


class Schedule:
    """Runs ``refit`` and ``poll`` in the background between :meth:`start` and :meth:`stop`."""

    def __init__(self, refit: Callable[[], None], poll: Callable[[], None]) -> None:
        self._refit = refit
        self._poll = poll
        self._scheduler: Any = None

    def start(self, refit_seconds: float, update_seconds: float) -> None:
        """Start the jobs; the first refit runs now."""
        from apscheduler.schedulers.background import BackgroundScheduler

        scheduler = BackgroundScheduler(daemon=True)
        scheduler.add_job(
            self._refit,
            "interval",
            seconds=refit_seconds,
            id="refit",
            max_instances=1,
            coalesce=True,
            next_run_time=datetime.now(UTC),
        )
        scheduler.add_job(
            self._poll,
            "interval",
            seconds=update_seconds,
            id="poll",
            max_instances=1,
            coalesce=True,
        )
        scheduler.start()
        self._scheduler = scheduler

    def stop(self) -> None:
        """Stop the jobs, waiting for a running one to finish."""
        if self._scheduler is not None:
            self._scheduler.shutdown(wait=True)
            self._scheduler = None
