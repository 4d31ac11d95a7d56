"""The run's summary figures, the self-contained HTML report, and the report folder's check."""

from __future__ import annotations

import base64
import dataclasses
import json
import re
from pathlib import Path

import pytest

from autoglm.config import ConfigError
from stack.loadgen import Totals
from stack.report import (
    Sample,
    ScaleEvent,
    check_report_dir,
    summarize,
    summary_lines,
    write_report,
)


def sample(
    t: float, workers: int, ready: int, util: float | None, best_effort: float = 0.0, done: int = 0
) -> Sample:
    return Sample(
        elapsed=t,
        target_rps=10.0,
        sent_rps=9.0,
        workers=workers,
        ready_workers=ready,
        desired_workers=workers,
        online_utilization=util,
        online_work=None if util is None else util * ready,
        best_effort_work=best_effort,
        best_effort_done=done,
        forecast_upper=120.0,
        forecast_for=t + 10,
        p99_seconds=0.05,
    )


SAMPLES = [
    sample(0, 1, 1, 50.0, best_effort=40.0, done=0),  # 10 s: 1 worker, 50 % online, 40 % job
    sample(10, 2, 1, 90.0, done=300),  # 10 s: 2 workers (one starting), one at 90 % online
    sample(20, 2, 2, 60.0, best_effort=50.0, done=320),  # 10 s: 2 workers at 60 % + 50 % job
    sample(30, 1, 1, None, done=500),
]
EVENTS = [
    ScaleEvent(10, 1, 2, "metric:online_busy/predictive", "above target"),
    ScaleEvent(30, 2, 1, "metric:online_busy/reactive", "below target"),
]


def totals() -> Totals:
    t = Totals(sent=200, within_slo=190)
    t.by_outcome.update(ok=195, shed=5)
    return t


def test_summary_integrates_over_time() -> None:
    s = summarize(SAMPLES, EVENTS, totals(), 0.25, 0.7, 0.2, (1.5, 2.0, 2.5), "utilization", 3.2)
    assert s.gpu_seconds == pytest.approx(10 * 1 + 10 * 2 + 10 * 2)
    # online busy GPU-seconds 5 + 9 + 12 = 26, best-effort 4 + 0 + 5 = 9, of 50 paid
    assert s.online_busy_share == pytest.approx(26 / 50)
    assert s.best_effort_busy_share == pytest.approx(9 / 50)
    assert s.busy_share == pytest.approx(35 / 50)
    # the online utilization is over ready workers only: 26 of 40 ready GPU-seconds
    assert s.online_utilization == pytest.approx(100 * 26 / 40)
    assert s.best_effort_done == 500
    assert s.slo_attainment == pytest.approx(0.95)
    assert (s.scale_ups, s.scale_downs, s.peak_workers) == (1, 1, 2)
    assert s.duration_seconds == 30
    lines = "\n".join(summary_lines(s))
    assert "95.0 %" in lines and "5 shed" in lines and "1 up, 1 down" in lines
    # one worker of two was starting for 10 s: 10 of the 50 paid GPU-seconds
    assert s.starting_share == pytest.approx(10 / 50)
    assert (
        "70.0 % of paid GPU-time (online 52.0 %, best-effort 18.0 %; 20.0 % was workers starting)"
        in lines
    )
    assert s.cpu_wait_per_run == 3.2 and "3.20 s waiting for a core per second" in lines
    assert s.batcher_slo_attainment is None and "own clock" not in lines
    assert "500 job requests" in lines and "(target 70.0 %)" in lines
    assert "1.50, 2.00, 2.50" in lines


def test_summary_shows_the_batchers_own_count_beside_the_clients() -> None:
    s = summarize(SAMPLES, EVENTS, totals(), 0.25, 0.7, 0.2, None, "utilization", None, 0.99)
    assert s.batcher_slo_attainment == 0.99
    lines = "\n".join(summary_lines(s))
    assert "95.0 % of online requests answered within 0.25 s" in lines
    assert "(99.0 % by the batchers' own clock)" in lines


def test_a_sample_knows_the_busy_share_of_its_paid_gpus() -> None:
    assert SAMPLES[2].busy_share == pytest.approx((120 + 50) / 200)
    assert SAMPLES[3].busy_share is None  # nothing read yet
    assert sample(0, 0, 0, 10.0).busy_share is None  # no worker, nothing paid


def test_report_is_html_with_an_embedded_png(tmp_path: Path) -> None:
    s = summarize(SAMPLES, EVENTS, totals(), 0.25, 0.7, 0.2)
    path = write_report(tmp_path / "out", SAMPLES, EVENTS, s)
    text = path.read_text()
    png = base64.b64decode(re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text).group(1))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "above target" in text and "1 &rarr; 2" in text and "predictive" in text
    data = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert data["scale_ups"] == 1 and len(data["samples"]) == 4
    assert data["busy_share"] == pytest.approx(0.7) and data["best_effort_done"] == 500


def test_report_dir_is_created_and_proven_writable(tmp_path: Path) -> None:
    path = check_report_dir(tmp_path / "a" / "b")
    assert path.is_dir() and list(path.iterdir()) == []  # the probe file is gone


@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda root: (root / "f").write_text("x") and root / "f", "is a file"),
        (lambda root: (root / "f").write_text("x") and root / "f" / "sub", "cannot be created"),
        (lambda root: (root / "r" / "report.html").mkdir(parents=True) or root / "r", "not a file"),
    ],
)
def test_report_dir_that_cannot_hold_the_report_is_refused(
    tmp_path: Path, make, words: str
) -> None:
    with pytest.raises(ConfigError, match=words):
        check_report_dir(make(tmp_path))


def test_summary_says_where_the_idle_paid_time_went_and_in_which_phase() -> None:
    throttled = [
        SAMPLES[0],
        dataclasses.replace(SAMPLES[1], idle_throttled_work=10.0),  # the ready one throttled
        *SAMPLES[2:],
    ]
    s = summarize(throttled, EVENTS, totals(), 0.25, 0.7, 0.2)
    # paid 50 GPU-s: busy 35, starting 10; idle 1 (allowed) + 1 (throttled) + 3 (allowed)
    assert s.idle_throttled_share == pytest.approx(1 / 50)
    assert s.idle_share_cut_share == pytest.approx(0.0)
    assert s.idle_allowed_share == pytest.approx(4 / 50)
    assert set(s.phases) == {"steady"}  # the target rate never moved
    assert s.phases["steady"]["gpu_seconds"] == pytest.approx(50)
    lines = "\n".join(summary_lines(s))
    assert "10.0 % of paid GPU-time on ready workers: 2.0 % with best-effort throttled" in lines
    assert "steady          30 s, 50 GPU-s: busy 70.0 %, starting 20.0 %" in lines


def test_summary_says_when_the_load_generator_fell_behind() -> None:
    late = summarize(SAMPLES, EVENTS, totals(), 0.25, 0.7, 0.2, generator_behind_seconds=1.5)
    assert late.generator_behind_seconds == 1.5
    assert "up to 1.50 s behind its schedule" in "\n".join(summary_lines(late))
    on_time = summarize(SAMPLES, EVENTS, totals(), 0.25, 0.7, 0.2, generator_behind_seconds=0.02)
    assert "behind its schedule" not in "\n".join(summary_lines(on_time))
