"""The run's summary figures and the self-contained HTML report."""

from __future__ import annotations

import base64
import json
import re
from pathlib import Path

import pytest

from autoglm.up.loadgen import Totals
from autoglm.up.report import Sample, ScaleEvent, summarize, summary_lines, write_report


def sample(t: float, workers: int, ready: int, util: float | None) -> Sample:
    return Sample(
        elapsed=t,
        target_rps=10.0,
        sent_rps=9.0,
        workers=workers,
        ready_workers=ready,
        desired_workers=workers,
        mean_utilization=util,
        total_busy=None if util is None else util * ready,
        forecast_upper=120.0,
        forecast_for=t + 10,
        p99_seconds=0.05,
    )


SAMPLES = [
    sample(0, 1, 1, 50.0),  # 10 s of 1 worker at 50 %
    sample(10, 2, 1, 90.0),  # 10 s of 2 workers, one ready at 90 %
    sample(20, 2, 2, 60.0),  # 10 s of 2 workers at 60 %
    sample(30, 1, 1, None),
]
EVENTS = [
    ScaleEvent(10, 1, 2, "metric:gpu_util/reactive", "above target"),
    ScaleEvent(30, 2, 1, "metric:gpu_util/reactive", "below target"),
]


def totals() -> Totals:
    t = Totals(sent=200, within_slo=190)
    t.by_outcome.update(ok=195, shed=5)
    return t


def test_summary_integrates_over_time() -> None:
    s = summarize(SAMPLES, EVENTS, totals(), 0.25, 70.0, 0.2)
    assert s.gpu_seconds == pytest.approx(10 * 1 + 10 * 2 + 10 * 2)
    # busy GPU-seconds 5 + 9 + 12 = 26 over 40 ready GPU-seconds
    assert s.mean_utilization == pytest.approx(100 * 26 / 40)
    assert s.slo_attainment == pytest.approx(0.95)
    assert (s.scale_ups, s.scale_downs, s.peak_workers) == (1, 1, 2)
    assert s.duration_seconds == 30
    lines = "\n".join(summary_lines(s))
    assert "95.0 %" in lines and "5 shed" in lines and "1 up, 1 down" in lines


def test_report_is_html_with_an_embedded_png(tmp_path: Path) -> None:
    s = summarize(SAMPLES, EVENTS, totals(), 0.25, 70.0, 0.2)
    path = write_report(tmp_path / "out", SAMPLES, EVENTS, s)
    text = path.read_text()
    png = base64.b64decode(re.search(r"data:image/png;base64,([A-Za-z0-9+/=]+)", text).group(1))
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "above target" in text and "1 &rarr; 2" in text
    data = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert data["scale_ups"] == 1 and len(data["samples"]) == 4
