"""The pure decisions: dispatch timing, adaptive cap, admission, cost model. No clock."""

from __future__ import annotations

import math

import pytest

from batcher.cost_model import FORGET_AFTER, CostModel
from batcher.policy import (
    BATCH_BUDGET_FRACTION,
    AdaptiveCap,
    DeadlinePolicy,
    DispatchState,
    FixedDelayPolicy,
    Pending,
    admission_refusal,
    arrival_rate,
    dispatch_deadline,
    fitting_prefix,
    next_start_for_utilization,
    split_index,
)


def linear(c: float, a: float):
    return lambda b: c + a * b


def waiting(*arrivals: float, slo: float = 1.0, size: int = 1) -> list[Pending]:
    return [Pending(size, t, dispatch_deadline(t, slo, 30.0)) for t in arrivals]


class TestDeadlinePolicy:
    policy = DeadlinePolicy()

    def test_full_batch_starts_at_once(self) -> None:
        state = DispatchState(waiting(0.0, 0.0, 0.0, 0.0), now=0.0, cap=4, arrival_rate=1e6)
        assert self.policy.decide(state, linear(0.01, 0.001)).take == 4

    def test_partial_batch_waits_until_the_last_safe_moment(self) -> None:
        # deadline 0.8 s after the first arrival, 3 items take 0.013 s: start by 0.787.
        state = DispatchState(waiting(0.0, 0.1, 0.2), now=0.3, cap=8, arrival_rate=100.0)
        decision = self.policy.decide(state, linear(0.01, 0.001))
        assert decision.take == 0
        assert decision.wake_at == pytest.approx(0.8 - 0.013)

    def test_partial_batch_starts_once_the_last_safe_moment_has_come(self) -> None:
        state = DispatchState(waiting(0.0, 0.1, 0.2), now=0.787, cap=8, arrival_rate=100.0)
        assert self.policy.decide(state, linear(0.01, 0.001)).take == 3

    def test_no_waiting_for_a_batch_that_cannot_fill_in_time(self) -> None:
        # 10 requests/s and 0.49 s of slack: about 5 more expected, the cap of 8 is out of reach.
        state = DispatchState(waiting(0.0, 0.2), now=0.3, cap=8, arrival_rate=10.0)
        assert self.policy.decide(state, linear(0.01, 0.001)).take == 2
        # at 20 requests/s about 10 more are expected: worth waiting for the full batch.
        state = DispatchState(waiting(0.0, 0.2), now=0.3, cap=8, arrival_rate=20.0)
        assert self.policy.decide(state, linear(0.01, 0.001)).take == 0

    def test_batch_is_the_prefix_that_fits_the_cap(self) -> None:
        queue = [Pending(3, 0.0, 0.8), Pending(3, 0.0, 0.8), Pending(3, 0.0, 0.8)]
        state = DispatchState(queue, now=0.0, cap=7, arrival_rate=1e6)
        assert self.policy.decide(state, linear(0.01, 0.001)).take == 2

    def test_earliest_deadline_in_the_batch_governs(self) -> None:
        queue = [Pending(1, 0.5, 1.3), Pending(1, 0.0, 0.2)]  # second has a short timeout
        state = DispatchState(queue, now=0.1, cap=8, arrival_rate=1e6)
        decision = self.policy.decide(state, linear(0.05, 0.0))
        assert decision.wake_at == pytest.approx(0.15)

    def test_utilization_cap_delays_the_start(self) -> None:
        state = DispatchState(
            waiting(0.0, 0.0, 0.0, 0.0), now=1.0, cap=4, earliest_start=1.2, arrival_rate=1e6
        )
        assert self.policy.decide(state, linear(0.01, 0.001)) == self.policy.decide(
            state, linear(0.5, 0.5)
        )
        assert self.policy.decide(state, linear(0.01, 0.001)).wake_at == 1.2

    def test_empty_queue_waits_for_arrivals(self) -> None:
        decision = self.policy.decide(DispatchState([], now=0.0, cap=4), linear(0.01, 0.001))
        assert decision.take == 0 and decision.wake_at is None


class TestFixedDelayPolicy:
    def test_waits_the_configured_delay_then_starts(self) -> None:
        policy = FixedDelayPolicy(max_delay=0.05, preferred=8)
        early = policy.decide(DispatchState(waiting(0.0, 0.01), now=0.02, cap=8), linear(0, 0))
        assert early.take == 0 and early.wake_at == pytest.approx(0.05)
        late = policy.decide(DispatchState(waiting(0.0, 0.01), now=0.05, cap=8), linear(0, 0))
        assert late.take == 2

    def test_preferred_size_starts_at_once(self) -> None:
        policy = FixedDelayPolicy(max_delay=10.0, preferred=2)
        state = DispatchState(waiting(0.0, 0.0, 0.0), now=0.0, cap=8)
        assert policy.decide(state, linear(0, 0)).take == 3


class TestAdaptiveCap:
    def test_backs_off_when_a_batch_runs_past_the_slo(self) -> None:
        cap = AdaptiveCap(64)
        cap.on_batch(
            64,
            started=0.0,
            compute_seconds=0.6,
            worst_latency=1.2,
            slo_seconds=1.0,
            backlog=False,
            cost_bound=64,
        )
        assert cap.value == 48

    def test_backs_off_once_per_batch_generation(self) -> None:
        cap = AdaptiveCap(64)
        for _ in range(3):  # three batches that started before the first back-off
            cap.on_batch(
                64,
                started=0.0,
                compute_seconds=0.6,
                worst_latency=1.2,
                slo_seconds=1.0,
                backlog=False,
                cost_bound=64,
            )
        assert cap.value == 48
        cap.on_batch(
            48,
            started=1.0,
            compute_seconds=0.6,
            worst_latency=1.2,
            slo_seconds=1.0,
            backlog=False,
            cost_bound=64,
        )
        assert cap.value == 36

    def test_grows_on_slack_only_when_the_cap_was_the_limit(self) -> None:
        cap = AdaptiveCap(64, initial=16)
        cap.on_batch(
            5,
            started=0.0,
            compute_seconds=0.1,
            worst_latency=0.2,
            slo_seconds=1.0,
            backlog=False,
            cost_bound=64,
        )
        assert cap.value == 16
        cap.on_batch(
            16,
            started=0.0,
            compute_seconds=0.1,
            worst_latency=0.2,
            slo_seconds=1.0,
            backlog=False,
            cost_bound=64,
        )
        assert cap.value == 18

    def test_waiting_behind_a_backlog_grows_instead_of_shrinking(self) -> None:
        cap = AdaptiveCap(64, initial=16)
        cap.on_batch(
            16,
            started=0.0,
            compute_seconds=0.1,
            worst_latency=1.5,
            slo_seconds=1.0,
            backlog=True,
            cost_bound=64,
        )
        assert cap.value == 18

    def test_never_exceeds_the_maximum_or_the_cost_bound(self) -> None:
        cap = AdaptiveCap(20, initial=19)
        for _ in range(10):
            cap.on_batch(
                cap.value,
                started=0.0,
                compute_seconds=0.1,
                worst_latency=0.1,
                slo_seconds=1.0,
                backlog=False,
                cost_bound=64,
            )
        assert cap.value == 20
        assert cap.effective(cost_bound=7) == 7

    def test_out_of_memory_halves_and_holds_a_ceiling_until_memory_is_released(self) -> None:
        cap = AdaptiveCap(64)
        cap.on_oom(64)
        assert cap.value == 32 and cap.ceiling == 48
        for _ in range(50):
            cap.on_batch(
                cap.effective(64),
                started=0.0,
                compute_seconds=0.1,
                worst_latency=0.1,
                slo_seconds=1.0,
                backlog=False,
                cost_bound=64,
            )
        assert cap.effective(64) == 48
        cap.on_memory_released()
        assert cap.ceiling == 64


class TestAdmission:
    def test_full_queue_is_refused(self) -> None:
        reason = admission_refusal(
            queued_items=100,
            items_ahead=100,
            size=1,
            max_queue=100,
            cap=10,
            cost=linear(0.01, 0.0),
            busy_for=0.0,
            timeout_seconds=30.0,
        )
        assert reason is not None and "queue full" in reason

    def test_work_ahead_longer_than_the_timeout_is_refused(self) -> None:
        # 50 items ahead in batches of 10 at 0.1 s each, plus 0.2 s left on the running batch.
        reason = admission_refusal(
            queued_items=50,
            items_ahead=50,
            size=1,
            max_queue=1000,
            cap=10,
            cost=linear(0.1, 0.0),
            busy_for=0.2,
            timeout_seconds=0.6,
        )
        assert reason is not None and "0.700 s" in reason
        assert (
            admission_refusal(
                queued_items=50,
                items_ahead=50,
                size=1,
                max_queue=1000,
                cap=10,
                cost=linear(0.1, 0.0),
                busy_for=0.2,
                timeout_seconds=0.8,
            )
            is None
        )

    def test_lower_priority_work_does_not_count_ahead(self) -> None:
        assert (
            admission_refusal(
                queued_items=500,
                items_ahead=0,
                size=1,
                max_queue=1000,
                cap=10,
                cost=linear(0.1, 0.0),
                busy_for=0.0,
                timeout_seconds=0.5,
            )
            is None
        )


def test_fitting_prefix_takes_an_oversized_head_alone() -> None:
    assert fitting_prefix([Pending(9, 0, 1), Pending(1, 0, 1)], cap=4) == (1, 9, True)
    assert fitting_prefix([Pending(1, 0, 1), Pending(1, 0, 1)], cap=4) == (2, 2, False)


@pytest.mark.parametrize(
    ("sizes", "first"),
    [([1, 1, 1, 1], 2), ([5, 1, 1], 1), ([1, 1, 5], 2), ([1, 1], 1), ([2, 3, 1, 1, 1], 2)],
)
def test_split_index_halves_items_and_leaves_no_half_empty(sizes: list[int], first: int) -> None:
    assert split_index(sizes) == first


def test_utilization_cap_idles_in_proportion() -> None:
    assert next_start_for_utilization(10.0, 0.2, 1.0) == 10.0
    assert next_start_for_utilization(10.0, 0.2, 0.5) == pytest.approx(10.2)
    assert next_start_for_utilization(10.0, 0.2, 0.25) == pytest.approx(10.6)


def test_arrival_rate_decays_while_nothing_arrives() -> None:
    assert arrival_rate(0.01, 0.001) == pytest.approx(100.0)
    assert arrival_rate(0.01, 2.0) == pytest.approx(0.5)
    assert arrival_rate(math.inf, 0.0) == 0.0


class TestCostModel:
    def test_recovers_a_line_exactly(self) -> None:
        model = CostModel()
        for b in (1, 2, 4, 8, 16, 32) * 5:
            model.observe(b, 0.010 + 0.002 * b)
        assert model.fixed_seconds == pytest.approx(0.010)
        assert model.per_item_seconds == pytest.approx(0.002)
        assert model.mean(64) == pytest.approx(0.010 + 0.002 * 64)
        # The margin still remembers the first, badly predicted batches; it fades with more.
        assert model.estimate(64) > model.mean(64)
        for b in (1, 2, 4, 8, 16, 32) * 30:
            model.observe(b, 0.010 + 0.002 * b)
        assert model.estimate(64) == pytest.approx(0.010 + 0.002 * 64, rel=1e-4)

    def test_noise_makes_the_estimate_conservative(self) -> None:
        model = CostModel()
        for i in range(200):
            b = 1 + i % 16
            model.observe(b, 0.010 + 0.002 * b + (0.003 if i % 2 else -0.003))
        assert model.estimate(8) > model.mean(8) + 0.005

    def test_one_size_known_scales_proportionally(self) -> None:
        model = CostModel()
        model.observe(4, 0.02)
        assert model.estimate(8) == pytest.approx(0.04)
        assert model.estimate(2) == pytest.approx(0.02)

    def test_nothing_known_estimates_zero_and_allows_the_limit(self) -> None:
        model = CostModel()
        assert not model.known and model.estimate(10) == 0.0
        assert model.largest_within(0.1, 32) == 32

    def test_largest_within_the_budget(self) -> None:
        model = CostModel()
        for b in (1, 8, 16) * 40:
            model.observe(b, 0.005 + 0.002 * b)
        assert model.largest_within(BATCH_BUDGET_FRACTION * 0.1, 64) == 17

    def test_forgets_sizes_no_longer_executed(self) -> None:
        model = CostModel()
        for b in (8, 16, 24) * 10:
            model.observe(b, 0.005 + 0.002 * b)  # fast device
        for _ in range(FORGET_AFTER + 1):
            model.observe(2, 3 * (0.005 + 0.002 * 2))  # three times slower, small batches
        assert model.mean(8) == pytest.approx(3 * 0.009 * 4)  # proportional from size 2 alone
        assert model.estimate(8) >= model.mean(8)
