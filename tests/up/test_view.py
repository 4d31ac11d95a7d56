"""The live view draws what a newcomer must see: the work split by class, the busy share of the
paid GPUs against the target, and each scale decision with its driver and reason."""

from __future__ import annotations

import io
import logging

from rich.console import Console

from stack.report import Sample, ScaleEvent
from stack.view import LogView, TerminalView

SAMPLE = Sample(
    elapsed=52.0,
    target_rps=60.0,
    sent_rps=58.0,
    workers=3,
    ready_workers=2,
    desired_workers=3,
    online_utilization=75.0,
    online_work=150.0,
    best_effort_work=60.0,
    best_effort_done=1234,
    forecast_upper=230.0,
    forecast_for=60.0,
    p99_seconds=0.12,
)
EVENT = ScaleEvent(48.0, 2, 3, "metric:online_busy/predictive", "forecast above target")


def test_terminal_view_shows_classes_busy_share_and_reasons() -> None:
    view = TerminalView(0.7, 0.25, 4, 100.0, ["no NVIDIA GPU found: simulating 4 GPUs"])
    view.console = Console(file=io.StringIO(), width=160, record=True)
    view.show(SAMPLE)
    view.event(EVENT)
    view.console.print(view._render())
    text = view.console.export_text()
    assert "online work" in text and "150 %" in text and "forecast 230 %" in text
    assert "1234 job requests done" in text
    assert "75.0 %" in text and "target 70 %" in text
    assert "70.0 %" in text  # busy: (150 + 60) of 300 paid
    assert "metric:online_busy/predictive" in text and "forecast above target" in text
    assert "simulating 4 GPUs" in text


def test_log_view_writes_one_status_line_with_the_split(caplog) -> None:
    view = LogView()
    with caplog.at_level(logging.INFO, logger="autoglm.up"):
        view.show(SAMPLE)
        view.event(EVENT)
    status, scaled = caplog.records
    assert status.best_effort_work_pct == 60.0 and status.busy_share == 0.7
    assert status.online_utilization_pct == 75.0 and status.best_effort_done == 1234
    assert scaled.driver == EVENT.driver and scaled.direction == "up"
