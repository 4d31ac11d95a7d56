"""Where a run's paid GPU-time went (stack.paid_time), and the stack's reading of why idle time
stayed idle (stack.stack.idle_held_back)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from stack.paid_time import breakdown, by_phase, load_phases
from stack.stack import idle_held_back


@dataclass(frozen=True)
class Point:
    elapsed: float
    target_rps: float
    workers: int = 1
    ready_workers: int = 1
    online_work: float | None = 50.0
    best_effort_work: float | None = 0.0
    idle_throttled_work: float | None = None
    idle_share_cut_work: float | None = None


def test_every_paid_second_lands_in_one_state() -> None:
    samples = [
        # 10 s: two workers, one starting; the ready one 60 % online, best-effort throttled
        Point(0, 20, workers=2, online_work=60.0, idle_throttled_work=40.0),
        # 10 s: both ready, 120 % online, 50 % best-effort; one's share cut (20 % idle of it)
        Point(
            10,
            20,
            workers=2,
            ready_workers=2,
            online_work=120.0,
            best_effort_work=50.0,
            idle_share_cut_work=20.0,
        ),
        Point(20, 20),
    ]
    paid = breakdown(samples)
    assert paid.seconds == 20 and paid.gpu_seconds == 40
    assert paid.online == pytest.approx(6 + 12)
    assert paid.best_effort == pytest.approx(5)
    assert paid.starting == pytest.approx(10)
    assert paid.idle_throttled == pytest.approx(4)
    assert paid.idle_share_cut == pytest.approx(2)
    # the rest of the ready workers' idle time (30 % of 2 GPUs less the 20 % share cut) is
    # idle with best-effort allowed
    assert paid.idle_allowed == pytest.approx(1)
    total = sum(
        getattr(paid, s)
        for s in (
            "online",
            "best_effort",
            "starting",
            "idle_throttled",
            "idle_share_cut",
            "idle_allowed",
        )
    )
    assert total == pytest.approx(paid.gpu_seconds)
    assert paid.share("starting") == pytest.approx(0.25)


def test_idle_reasons_read_apart_from_the_busy_rates_never_exceed_the_idle_time() -> None:
    # busy 90 % of the one GPU, but the gauges say 30 % idle throttled and 10 % share cut:
    # only the 10 % idle is explained, split in the same proportion
    samples = [
        Point(0, 20, online_work=90.0, idle_throttled_work=30.0, idle_share_cut_work=10.0),
        Point(1, 20),
    ]
    paid = breakdown(samples)
    assert paid.idle_throttled == pytest.approx(0.075)
    assert paid.idle_share_cut == pytest.approx(0.025)
    assert paid.idle_allowed == pytest.approx(0.0)


def test_the_load_phase_follows_the_target_rate_trend() -> None:
    rates = (
        [20] * 10
        + [20 + 8 * i for i in range(1, 11)]
        + [100] * 10
        + [100 - 16 * i for i in range(1, 6)]
        + [20] * 10
    )
    samples = [Point(t, r) for t, r in enumerate(rates)]
    phases = load_phases(samples)
    assert phases[:7] == ["steady"] * 7
    assert phases[14] == "rising" and phases[25] == "steady" and phases[32] == "falling"
    assert phases[-1] == "steady"
    parts = by_phase(samples)
    assert set(parts) == {"steady", "rising", "falling"}
    assert sum(p.seconds for p in parts.values()) == pytest.approx(samples[-1].elapsed)


def test_a_flat_run_is_one_steady_phase() -> None:
    samples = [Point(t, 0.0) for t in range(5)]
    assert set(by_phase(samples)) == {"steady"}


def test_idle_held_back_splits_idle_time_by_the_batchers_share() -> None:
    throttled, share_cut = idle_held_back(
        {
            "a": (70.0, 0.0, 0.0),  # throttled: 30 % idle
            "b": (40.0, 40.0, 0.5),  # share cut: 20 % idle
            "c": (10.0, 80.0, 1.0),  # best-effort allowed: counted in neither
            "d": (None, 0.0, 0.0),  # not read yet: counted in neither
            "e": (60.0, 50.0, 0.0),  # busier than its GPU (rates read apart): no idle
        }
    )
    assert throttled == pytest.approx(30.0) and share_cut == pytest.approx(20.0)
