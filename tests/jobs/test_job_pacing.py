"""The job's request-rate cap (``--max-rate``), on times passed in."""

from __future__ import annotations

import pytest

from jobs.pacing import RatePacer


def test_sends_asked_together_are_spread_one_interval_apart() -> None:
    pacer = RatePacer(rate=4.0)
    assert [pacer.reserve(10.0) for _ in range(4)] == [0.0, 0.25, 0.5, 0.75]


def test_a_quiet_spell_earns_no_burst() -> None:
    pacer = RatePacer(rate=2.0)
    assert pacer.reserve(0.0) == 0.0
    assert pacer.reserve(100.0) == 0.0  # long after the last send: at once
    assert pacer.reserve(100.0) == pytest.approx(0.5)  # but the next one still waits


def test_a_send_that_comes_late_waits_only_for_what_is_left() -> None:
    pacer = RatePacer(rate=10.0)
    pacer.reserve(1.0)
    assert pacer.reserve(1.04) == pytest.approx(0.06)


def test_no_rate_holds_nothing_back() -> None:
    pacer = RatePacer(rate=0.0)
    assert [pacer.reserve(5.0) for _ in range(100)] == [0.0] * 100
