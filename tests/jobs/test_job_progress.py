"""Rate and ETA of the progress display: pure arithmetic on given times."""

from __future__ import annotations

import logging
import math

from jobs.progress import ProgressDisplay, RateWindow, Snapshot, eta_seconds, format_duration


def test_rate_follows_the_recent_window_not_the_whole_run() -> None:
    window = RateWindow(window_seconds=30)
    assert window.rate() == 0.0
    for t in range(0, 61, 5):  # 10 lines/s for the first minute
        window.add(float(t), t * 10)
    assert window.rate() == 10.0
    for t in range(65, 121, 5):  # then 2 lines/s
        window.add(float(t), 600 + (t - 60) * 2)
    assert math.isclose(window.rate(), 2.0)


def test_eta_is_unknown_while_nothing_is_answered_and_zero_when_done() -> None:
    assert eta_seconds(100, 4.0) == 25.0
    assert eta_seconds(100, 0.0) == math.inf
    assert eta_seconds(0, 0.0) == 0.0
    assert [format_duration(s) for s in (0, 75, 3725, math.inf)] == [
        "0:00",
        "1:15",
        "1:02:05",
        "unknown",
    ]


def test_plain_lines_come_at_most_once_per_interval(caplog) -> None:
    display = ProgressDisplay("auto", 10.0, "nightly", is_tty=False)
    snap = Snapshot(total=50, done=10, ok=9, invalid=1, in_flight=2, concurrency=4,
                    refusals=3, rate=2.0)  # fmt: skip
    with caplog.at_level(logging.INFO, logger="jobs.progress"):
        for now in (0.0, 4.0, 9.9, 10.0, 15.0):
            display.update(now, snap)
        display.update(16.0, snap, force=True)
    records = [r for r in caplog.records if r.getMessage() == "progress"]
    assert len(records) == 3  # at 0, at 10 and the forced final one
    assert records[0].eta == "0:20"
    assert (records[0].done, records[0].total, records[0].refusals) == (10, 50, 3)
