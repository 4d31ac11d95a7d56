"""The best-effort class's pure rules: request classes, quantum sizing, the slack controller.

No clock and no engine: every rule is given a time, a cost line or a slack and its answer read.
"""

from __future__ import annotations

import math

import pytest

from autoglm.config import ConfigError
from batcher.best_effort import (
    BEST_EFFORT,
    ONLINE,
    SHARE_STEP,
    LatencyWindow,
    PriorityError,
    RequestClass,
    SlackController,
    classify_priority,
    effective_quantum,
    next_start_for_share,
    quantum_batch_limit,
    queue_full_retry_after,
    throttled_retry_after,
)
from batcher.config import BatcherConfig


@pytest.mark.parametrize(
    ("priority", "expected"),
    [
        (0, RequestClass(ONLINE, 2)),  # the default level
        ("online", RequestClass(ONLINE, 2)),
        (1, RequestClass(ONLINE, 1)),
        (3, RequestClass(ONLINE, 3)),
        (5, RequestClass(BEST_EFFORT, 0)),
        (2**32 - 1, RequestClass(BEST_EFFORT, 0)),  # tritonclient's priority is a uint64
        ("best-effort", RequestClass(BEST_EFFORT, 0)),
    ],
)
def test_priorities_map_to_classes(priority: int | str, expected: RequestClass) -> None:
    assert classify_priority(priority, 3, 2, 5) == expected


@pytest.mark.parametrize(
    ("priority", "reason"),
    [
        (4, "priority 4 is neither an online level"),  # between the levels and best-effort
        ("batch", "'batch' is not a request class"),
        ("best_effort", "is not a request class"),  # the wire name has a hyphen
    ],
)
def test_unknown_priorities_are_refused_with_the_reason(priority: int | str, reason: str) -> None:
    with pytest.raises(PriorityError, match=reason):
        classify_priority(priority, 3, 2, 5)


def test_default_mapping_is_two_and_up_best_effort_with_one_level() -> None:
    assert classify_priority(1, 1, 1, 2).name == ONLINE
    assert classify_priority(2, 1, 1, 2).name == BEST_EFFORT


def test_quantum_is_a_tenth_of_the_slo_by_default_and_never_below_one_item() -> None:
    assert effective_quantum(0.0, 0.25, 0.001) == pytest.approx(0.025)
    assert effective_quantum(0.04, 0.25, 0.001) == pytest.approx(0.04)
    assert effective_quantum(0.0, 0.25, 0.030) == pytest.approx(0.030)


def test_quantum_batch_is_the_largest_whose_cost_fits() -> None:
    def line(items: int) -> float:
        return 0.010 + 0.001 * items

    assert quantum_batch_limit(line, 0.025, 32) == 15
    assert quantum_batch_limit(line, 0.100, 32) == 32  # the maximum bounds it
    assert quantum_batch_limit(line, 0.005, 32) == 1  # one item cannot be cut
    assert quantum_batch_limit(line, 0.025, 32, allowed=(1, 2, 4, 8, 16, 32)) == 8
    assert quantum_batch_limit(line, 0.005, 32, allowed=(4, 8)) == 4


def test_latency_window_p99_forgets_old_latencies() -> None:
    window = LatencyWindow(seconds=10.0)
    assert window.p99(0.0) is None
    for i in range(99):
        window.add(1.0 + i * 0.01, 0.010)
    window.add(2.0, 0.500)
    assert window.p99(2.0) == pytest.approx(0.500)
    window.add(11.5, 0.020)
    # at 12.1 the samples up to 2.0 are older than 10 s: only the 20 ms one is left
    assert window.p99(12.1) == pytest.approx(0.020)


def test_window_clears_when_the_last_slow_latency_leaves() -> None:
    window = LatencyWindow(seconds=10.0)
    window.add(1.0, 0.300)
    window.add(3.0, 0.300)
    window.add(4.0, 0.010)
    assert window.clears_at(5.0, 0.2) == pytest.approx(13.0)
    assert window.clears_at(5.0, 0.4) == pytest.approx(5.0)


def test_controller_steps_only_once_per_interval() -> None:
    controller = SlackController(margin_seconds=0.02, interval_seconds=1.0)
    assert controller.step(0.0, -1.0) is not None
    assert controller.step(0.5, 1.0) is None
    assert controller.share == 0.0
    assert controller.step(1.0, 1.0) is not None
    assert controller.share == pytest.approx(SHARE_STEP)


def test_share_halves_under_the_margin_down_to_zero_and_grows_back_additively() -> None:
    controller = SlackController(margin_seconds=0.02, interval_seconds=1.0)
    shares = []
    for t in range(6):
        change = controller.step(float(t), 0.01)  # slack positive but under the margin
        shares.append(change.after)
    assert shares[:4] == [0.5, 0.25, 0.125, 0.0625]
    assert shares[4] == 0.0  # 0.03125 is under the floor: throttled
    assert controller.throttled
    change = controller.step(6.0, 0.05)
    assert change.after == pytest.approx(SHARE_STEP) and change.throttle_changed
    for t in range(7, 20):
        controller.step(float(t), 0.05)
    assert controller.share == 1.0


def test_a_broken_slo_zeroes_the_share_at_once() -> None:
    controller = SlackController(margin_seconds=0.02, interval_seconds=1.0)
    change = controller.step(0.0, -0.001)
    assert (change.before, change.after) == (1.0, 0.0)
    assert change.throttled and change.throttle_changed
    assert not controller.step(1.0, -0.5).throttle_changed  # still throttled: no change


def test_share_paces_best_effort_batches() -> None:
    assert next_start_for_share(10.0, 0.02, 1.0) == 10.0
    assert next_start_for_share(10.0, 0.02, 0.25) == pytest.approx(10.06)
    assert next_start_for_share(10.0, 0.02, 0.0) == math.inf


def test_retry_after_is_derived_from_the_window_and_the_queue() -> None:
    assert throttled_retry_after(13.0, 5.0, 1.0) == pytest.approx(9.0)
    assert throttled_retry_after(5.0, 5.0, 1.0) == pytest.approx(1.0)
    # 20 items over a bound, batches of 8 taking 25 ms at share 0.5, after 10 ms still running
    assert queue_full_retry_after(20, 8, 0.025, 0.5, 0.010) == pytest.approx(0.010 + 3 * 0.05)
    assert queue_full_retry_after(20, 8, 0.025, 1.0, 0.0) < queue_full_retry_after(
        20, 8, 0.025, 0.25, 0.0
    )


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        ({"priority_levels": 3, "best_effort_priority": 2}, "--best-effort-priority must be"),
        ({"best_effort_quantum_seconds": -0.1}, "--best-effort-quantum-seconds must be >= 0"),
        ({"best_effort_max_queue": -1}, "--best-effort-max-queue must be >= 0"),
        ({"best_effort_slack_margin": 1.0}, "--best-effort-slack-margin must be < 1, got 1.0"),
        ({"best_effort_window_seconds": 0.0}, "--best-effort-window-seconds must be > 0"),
    ],
)
def test_bad_best_effort_settings_are_refused_at_start(settings: dict, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        BatcherConfig(**settings)
