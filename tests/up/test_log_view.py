"""``autoglm up --no-tui`` logs a ``status`` line when the run's phase changes (workers, the
first readings) and every ten seconds otherwise, not once a second: an hour's log held 3600
status lines that buried the scale decisions."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from stack.report import Sample
from stack.view import LogView

QUIET = Sample(
    elapsed=0.0,
    target_rps=10.0,
    sent_rps=10.0,
    workers=1,
    ready_workers=1,
    desired_workers=1,
    online_utilization=40.0,
    online_work=40.0,
    best_effort_work=None,
    best_effort_done=0,
    forecast_upper=None,
    forecast_for=None,
    p99_seconds=0.05,
)


def logged_at(samples: list[Sample], caplog: pytest.LogCaptureFixture) -> list[float]:
    """The elapsed seconds of the status lines logged for ``samples``, shown in order."""
    view = LogView()
    with caplog.at_level(logging.INFO, logger="autoglm.up"):
        for sample in samples:
            view.show(sample)
    return [r.elapsed_s for r in caplog.records if r.getMessage() == "status"]


def test_a_steady_run_logs_a_status_line_every_ten_seconds(caplog) -> None:
    samples = [replace(QUIET, elapsed=float(t), sent_rps=10.0 + t % 3) for t in range(60)]
    assert logged_at(samples, caplog) == [0.0, 10.0, 20.0, 30.0, 40.0, 50.0]


def scaling_up(t: int) -> Sample:
    """A run that decides a second worker at 3 s, starts it at 6 s, has it ready (and the first
    forecast) at 8 s and the job's first answers at 25 s."""
    sample = replace(QUIET, elapsed=float(t), desired_workers=2 if t >= 3 else 1)
    if t >= 6:
        sample = replace(sample, workers=2)
    if t >= 8:
        sample = replace(sample, ready_workers=2, forecast_upper=55.0)
    if t >= 25:
        sample = replace(sample, best_effort_done=3)
    return sample


def test_a_change_of_phase_is_logged_at_once(caplog) -> None:
    samples = [scaling_up(t) for t in range(30)]
    assert logged_at(samples, caplog) == [0.0, 3.0, 6.0, 8.0, 18.0, 25.0]
