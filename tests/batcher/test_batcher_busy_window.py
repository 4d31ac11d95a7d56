"""BusyWindow's running total gives what summing the window's intervals gives."""

from __future__ import annotations

import random

import pytest

from batcher.busy_window import BusyWindow


def summed(runs: list[tuple[float, float]], now: float, seconds: float) -> float:
    since = now - seconds
    return sum(end - max(start, since) for start, end in runs if end >= since)


@pytest.mark.parametrize("seed", range(5))
def test_running_total_matches_the_sum_over_the_window(seed) -> None:
    rng = random.Random(seed)
    window = BusyWindow(2.0)
    runs: list[tuple[float, float]] = []
    clock = 0.0
    for _ in range(3000):
        clock += rng.expovariate(50.0)  # idle gap
        started, clock = clock, clock + rng.expovariate(200.0)  # one batch
        window.add(started, clock)
        runs.append((started, clock))
        now = clock + rng.choice([0.0, rng.uniform(0, 3.0)])
        assert window.busy_seconds(now) == pytest.approx(summed(runs, now, 2.0), abs=1e-9)
        clock = max(clock, now)


def test_an_interval_straddling_the_window_start_counts_only_its_inside() -> None:
    window = BusyWindow(10.0)
    window.add(0.0, 4.0)
    window.add(5.0, 6.0)
    assert window.busy_seconds(12.0) == pytest.approx(2.0 + 1.0)  # [2, 4] and [5, 6]
    assert window.busy_seconds(15.5) == pytest.approx(0.5)  # [5.5, 6]
    assert window.busy_seconds(100.0) == 0.0
    assert window.ratio(100.0) == 0.0
