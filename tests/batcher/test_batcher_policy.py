"""The pure decisions: dispatch timing, adaptive cap, admission, cost model. No clock."""

from __future__ import annotations

import math

import pytest

from batcher.cost_model import FORGET_AFTER, CostModel
from batcher.policy import (
    BATCH_BUDGET_FRACTION,
    AdaptiveCap,
    Backlog,
    DeadlinePolicy,
    DispatchState,
    FixedDelayPolicy,
    Pending,
    admission_refusal,
    arrival_rate,
    broken_by_execution,
    dispatch_deadline,
    fitting_prefix,
    lookahead_at,
    next_start_for_utilization,
    predicted_finish,
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

    def test_partial_batch_that_keeps_up_with_arrivals_starts_at_once(self) -> None:
        # 3 items in 13 ms serve 230 items/s: more than 1.5 x the 100/s arriving: no waiting.
        state = DispatchState(waiting(0.0, 0.1, 0.2), now=0.3, cap=8, arrival_rate=100.0)
        assert self.policy.decide(state, linear(0.01, 0.001)).take == 3

    def test_partial_batch_under_load_waits_to_fill_until_the_last_safe_moment(self) -> None:
        # A slow device: 3 items in 0.53 s serve 5.7/s, under 1.5 x the 4.5/s arriving, so the
        # batch waits to fill; full batches (8 in 0.58 s) would keep the device only 33% busy,
        # so the device has time to spare. It would run at the cap, so it must start by
        # 0.8 - 0.58.
        state = DispatchState(waiting(0.0, 0.05, 0.1), now=0.15, cap=8, arrival_rate=4.5)
        decision = self.policy.decide(state, linear(0.5, 0.01))
        assert decision.take == 0
        assert decision.wake_at == pytest.approx(0.8 - 0.58)

    def test_partial_batch_starts_once_the_last_safe_moment_has_come(self) -> None:
        state = DispatchState(waiting(0.0, 0.05, 0.1), now=0.221, cap=8, arrival_rate=4.5)
        assert self.policy.decide(state, linear(0.5, 0.01)).take == 3

    def test_partial_batch_starts_at_once_when_full_batches_would_saturate_the_device(
        self,
    ) -> None:
        # 1000/s arrive and even full batches (8 in 0.58 s) serve 14/s: the device is the
        # bottleneck, so leaving it idle to fill the batch only adds latency (self-clocking).
        state = DispatchState(waiting(0.0, 0.05, 0.1), now=0.15, cap=8, arrival_rate=1000.0)
        assert self.policy.decide(state, linear(0.5, 0.01)).take == 3
        # Full batches would keep the device 33% busy (4.5/s x 0.58 s / 8): it waits to fill.
        state = DispatchState(waiting(0.0, 0.05, 0.1), now=0.15, cap=8, arrival_rate=4.5)
        assert self.policy.decide(state, linear(0.5, 0.01)).take == 0

    def test_never_waits_longer_than_a_full_batch_takes(self) -> None:
        # t(8) = 18 ms: waiting past 18 ms after the oldest arrival would not pay.
        state = DispatchState(waiting(0.0, 0.001), now=0.005, cap=8, arrival_rate=130.0)
        assert self.policy.decide(state, linear(0.01, 0.001)).wake_at == pytest.approx(0.018)
        state = DispatchState(waiting(0.0, 0.001), now=0.0181, cap=8, arrival_rate=130.0)
        assert self.policy.decide(state, linear(0.01, 0.001)).take == 2

    def test_keeping_up_is_judged_on_the_expected_time_not_the_margin(self) -> None:
        # With the noise margin one item takes 40 ms (25/s); expected, 10 ms (100/s).
        state = DispatchState(waiting(0.0), now=0.0, cap=8, arrival_rate=50.0)
        assert self.policy.decide(state, linear(0.04, 0.0)).take == 0
        assert self.policy.decide(state, linear(0.04, 0.0), linear(0.01, 0.0)).take == 1

    def test_waiting_uses_the_time_of_the_size_it_would_run(self) -> None:
        # Padding: 2 items would run alone in 0.2 s, but the batch waits to fill the cap of 16,
        # which takes 0.5 s: the deadline math must use t(16).
        padded = {2: 0.2, 16: 0.5}
        state = DispatchState(waiting(0.0, 0.0), now=0.0, cap=16, arrival_rate=9.0)
        decision = self.policy.decide(state, lambda n: padded[n])
        assert decision.wake_at == pytest.approx(0.8 - 0.5)

    def test_batch_is_the_prefix_that_fits_the_cap(self) -> None:
        queue = [Pending(3, 0.0, 0.8), Pending(3, 0.0, 0.8), Pending(3, 0.0, 0.8)]
        state = DispatchState(queue, now=0.0, cap=7, arrival_rate=1e6)
        assert self.policy.decide(state, linear(0.01, 0.001)).take == 2

    def test_earliest_deadline_in_the_batch_governs(self) -> None:
        queue = [Pending(1, 0.0, 1.3), Pending(1, 0.0, 0.4)]  # second has a short timeout
        state = DispatchState(queue, now=0.0, cap=8, arrival_rate=6.0)
        decision = self.policy.decide(state, linear(0.3, 0.0))
        assert decision.wake_at == pytest.approx(0.1)

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


class TestFillingPolicy:
    """``fill``: no early start while a batch can still grow within the SLO."""

    policy = DeadlinePolicy(fill=True)

    def test_a_batch_that_keeps_up_waits_to_fill_for_a_full_batchs_time(self) -> None:
        # Eager starts these 3 at once (they serve 230/s against 100/s arriving); filling waits
        # until a full batch's time (t(8) = 18 ms) after the oldest arrival.
        state = DispatchState(waiting(0.0, 0.001, 0.002), now=0.003, cap=8, arrival_rate=100.0)
        assert DeadlinePolicy().decide(state, linear(0.01, 0.001)).take == 3
        decision = self.policy.decide(state, linear(0.01, 0.001))
        assert decision.take == 0 and decision.wake_at == pytest.approx(0.018)

    def test_under_a_light_load_it_starts_as_eager_does(self) -> None:
        # 10/s: full batches would keep the device 2% busy, under FILL_FROM_BUSY: nobody is held
        # for company while the CPU has time to spare.
        state = DispatchState(waiting(0.0, 0.001, 0.002), now=0.003, cap=8, arrival_rate=10.0)
        assert self.policy.decide(state, linear(0.01, 0.001)).take == 3

    def test_a_loaded_device_does_not_start_early_either(self) -> None:
        # Self-clocking would start these at once (1000/s against 14/s at full batches).
        state = DispatchState(waiting(0.0, 0.05, 0.1), now=0.15, cap=8, arrival_rate=1000.0)
        decision = self.policy.decide(state, linear(0.5, 0.01))
        assert decision.take == 0 and decision.wake_at == pytest.approx(0.8 - 0.58)

    def test_full_batches_and_the_last_safe_moment_still_start_at_once(self) -> None:
        full = DispatchState(waiting(0.0, 0.0, 0.0, 0.0), now=0.0, cap=4, arrival_rate=1.0)
        assert self.policy.decide(full, linear(0.01, 0.001)).take == 4
        due = DispatchState(waiting(0.0, 0.05, 0.1), now=0.221, cap=8, arrival_rate=1000.0)
        assert self.policy.decide(due, linear(0.5, 0.01)).take == 3


@pytest.mark.parametrize(
    ("dispatch", "model_device", "fills"),
    [
        ("auto", "cpu", True),
        ("auto", "cuda", False),
        ("auto", "cuda:1", False),
        ("eager", "cpu", False),
        ("fill", "cuda", True),
    ],
)
def test_from_config_fills_on_the_cpu_unless_told(dispatch, model_device, fills) -> None:
    from batcher.config import BatcherConfig
    from batcher.engine import from_config
    from batcher.models.simulated import SimulatedModel

    batcher = from_config(
        SimulatedModel(0.01, 0.001), BatcherConfig(dispatch=dispatch), model_device=model_device
    )
    assert batcher.policy == DeadlinePolicy(fill=fills)


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


def finished(cap: AdaptiveCap, size: int, **kwargs) -> None:
    """Report one batch to ``cap``: by default planned 0.1 s, ran 0.1 s, waits 0.1 s, SLO 1 s."""
    kwargs.setdefault("started", 0.0)
    kwargs.setdefault("waits", [0.1])
    kwargs.setdefault("compute_seconds", 0.1)
    kwargs.setdefault("planned_seconds", 0.1)
    kwargs.setdefault("slo_seconds", 1.0)
    kwargs.setdefault("cost_bound", 64)
    cap.on_batch(size, **kwargs)


class TestAdaptiveCap:
    def test_backs_off_when_a_batch_overruns_its_plan_and_misses_the_slo(self) -> None:
        cap = AdaptiveCap(64)
        # waited 0.5 s, planned 0.3 s (would finish at 0.8), ran 0.6 s (finished at 1.1)
        finished(cap, 64, waits=[0.5], planned_seconds=0.3, compute_seconds=0.6)
        assert cap.value == 48

    def test_never_backs_off_below_the_size_that_keeps_up_with_arrivals(self) -> None:
        cap = AdaptiveCap(64)
        overrun = {"waits": [0.5], "planned_seconds": 0.3, "compute_seconds": 0.6}
        finished(cap, 64, floor=56, **overrun)
        assert cap.value == 56  # 48 would not keep up: stop at the floor
        assert not cap.on_batch(
            56, started=1.0, slo_seconds=1.0, cost_bound=64, floor=56, **overrun
        )
        assert cap.value == 56
        # the OOM halving is not bounded by it: memory is a hard limit, throughput is not
        cap.on_oom(56)
        assert cap.value == 28

    def test_overload_misses_never_shrink_the_cap(self) -> None:
        cap = AdaptiveCap(64, initial=16)
        # waited 2 s behind a backlog: late whatever the batch did; the batch ran as planned
        finished(cap, 16, waits=[2.0, 1.5], planned_seconds=0.3, compute_seconds=0.35)
        assert cap.value == 18  # limited by the cap: grows, to drain the backlog faster

    def test_a_slow_batch_that_breaks_nothing_does_not_back_off(self) -> None:
        cap = AdaptiveCap(64)
        finished(cap, 64, waits=[0.1], planned_seconds=0.2, compute_seconds=0.5)
        assert cap.value == 64

    def test_backs_off_once_per_batch_generation(self) -> None:
        cap = AdaptiveCap(64)
        for _ in range(3):  # three batches that started before the first back-off
            finished(cap, 64, waits=[0.5], planned_seconds=0.3, compute_seconds=0.6)
        assert cap.value == 48
        finished(cap, 48, started=1.0, waits=[0.5], planned_seconds=0.3, compute_seconds=0.6)
        assert cap.value == 36

    def test_grows_only_when_the_cap_was_the_limit(self) -> None:
        cap = AdaptiveCap(64, initial=16)
        finished(cap, 5)
        assert cap.value == 16
        finished(cap, 16)
        assert cap.value == 18

    def test_with_buckets_the_cap_is_a_bucket_and_a_full_bucket_counts_as_limited(self) -> None:
        cap = AdaptiveCap(64, initial=24)
        assert cap.effective(64, allowed=(1, 16, 32, 64)) == 16
        finished(cap, 16, allowed=(1, 16, 32, 64))
        assert cap.value == 27
        assert cap.effective(64, allowed=(1, 16, 32, 64)) == 16
        assert cap.effective(64, allowed=(16, 32)) == 16
        assert AdaptiveCap(8).effective(64, allowed=(16, 32)) == 16  # smallest bucket at least

    def test_never_exceeds_the_maximum_or_the_cost_bound(self) -> None:
        cap = AdaptiveCap(20, initial=19)
        for _ in range(10):
            finished(cap, cap.value)
        assert cap.value == 20
        assert cap.effective(cost_bound=7) == 7

    def test_out_of_memory_halves_and_holds_a_ceiling_until_memory_is_released(self) -> None:
        cap = AdaptiveCap(64)
        cap.on_oom(64)
        assert cap.value == 32 and cap.ceiling == 48
        for _ in range(50):
            finished(cap, cap.effective(64))
        assert cap.effective(64) == 48
        cap.on_memory_released()
        assert cap.ceiling == 64


def test_broken_by_execution_separates_overruns_from_backlog() -> None:
    # planned 0.2, ran 0.5, SLO 1: a request that waited in (0.5, 0.8] was broken by the overrun
    assert broken_by_execution([0.6], 0.5, 0.2, 1.0)
    assert not broken_by_execution([0.4], 0.5, 0.2, 1.0)  # finished in time anyway
    assert not broken_by_execution([0.9], 0.5, 0.2, 1.0)  # late even had the plan held
    assert broken_by_execution([0.9, 0.6, 0.1], 0.5, 0.2, 1.0)


def backlog(ahead: int, cap: int = 10, busy_for: float = 0.0, rate: float = 0.0) -> Backlog:
    return Backlog(
        queued_items=ahead, items_ahead=ahead, cap=cap, busy_for=busy_for, arrival_rate=rate
    )


class TestAdmission:
    def test_full_queue_is_refused_with_the_time_until_room(self) -> None:
        # 100 items queued in batches of 10 at 0.01 s: one batch frees room for the newcomer.
        refusal = admission_refusal(backlog(100), 1, 100, linear(0.01, 0.0), 30.0)
        assert refusal is not None and refusal.reason == "queue_full"
        assert "queue full" in refusal.message
        assert refusal.retry_after == pytest.approx(0.01)

    def test_work_ahead_that_cannot_start_within_the_timeout_is_refused(self) -> None:
        # 50 items ahead in batches of 10 at 0.1 s each, plus 0.2 s left on the running batch.
        ahead = backlog(50, busy_for=0.2)
        refusal = admission_refusal(ahead, 1, 1000, linear(0.1, 0.0), 0.6)
        assert refusal is not None and refusal.reason == "past_deadline"
        assert "0.700 s" in refusal.message
        assert refusal.retry_after == pytest.approx(0.1)
        assert admission_refusal(ahead, 1, 1000, linear(0.1, 0.0), 0.8) is None

    def test_predicted_finish_past_the_slo_is_refused_naming_finish_slo_and_fix(self) -> None:
        # 0.2 s running, 5 full batches of 10 ahead (0.5 s), then its own batch (0.1 s): 0.8 s.
        ahead = backlog(50, busy_for=0.2)
        cost = linear(0.1, 0.0)
        refusal = admission_refusal(ahead, 1, 1000, cost, 30.0, slo_seconds=0.75)
        assert refusal is not None and refusal.reason == "past_deadline"
        assert "0.800 s" in refusal.message and "0.750 s" in refusal.message
        assert "another replica" in refusal.message and "--slo-seconds" in refusal.message
        assert refusal.retry_after == pytest.approx(0.05)
        assert admission_refusal(ahead, 1, 1000, cost, 30.0, slo_seconds=0.85) is None

    def test_the_slo_rule_predicts_with_the_expected_cost_not_the_margin(self) -> None:
        ahead = backlog(50, busy_for=0.2)
        pessimistic, expected = linear(0.2, 0.0), linear(0.1, 0.0)
        assert (
            admission_refusal(
                ahead, 1, 1000, pessimistic, 30.0, expected=expected, slo_seconds=0.85
            )
            is None
        )
        assert admission_refusal(ahead, 1, 1000, pessimistic, 30.0, slo_seconds=0.85) is not None

    def test_its_own_batch_fills_with_what_arrives_before_it_starts(self) -> None:
        # Nothing queued, 0.2 s left on the running batch, 50 items/s arriving: by the time the
        # device frees, 10 more wait and its batch runs full (0.15 s), not alone (0.06 s).
        cost = linear(0.05, 0.01)
        assert predicted_finish(backlog(0, busy_for=0.2), 1, cost) == pytest.approx((0.2, 0.26))
        busy = backlog(0, busy_for=0.2, rate=50.0)
        assert predicted_finish(busy, 1, cost) == pytest.approx((0.2, 0.35))
        assert admission_refusal(busy, 1, 1000, cost, 30.0, slo_seconds=0.3) is not None
        assert (
            admission_refusal(backlog(0, busy_for=0.2), 1, 1000, cost, 30.0, slo_seconds=0.3)
            is None
        )

    def test_a_request_the_model_cannot_serve_within_the_slo_even_alone_is_served(self) -> None:
        # An SLO below the model's own time would otherwise refuse every request.
        cost = linear(0.3, 0.0)
        assert (
            admission_refusal(backlog(5, busy_for=0.2), 1, 1000, cost, 30.0, slo_seconds=0.25)
            is None
        )

    def test_without_the_slo_rule_only_the_timeout_judges(self) -> None:
        # A request with its own 10 s timeout (or with the rule off) tolerates a late answer.
        ahead = backlog(50, busy_for=0.2)
        assert admission_refusal(ahead, 1, 1000, linear(0.1, 0.0), 10.0) is None

    def test_lower_priority_work_does_not_count_ahead(self) -> None:
        behind = Backlog(queued_items=500, items_ahead=0, cap=10, busy_for=0.0)
        cost = linear(0.1, 0.0)
        assert admission_refusal(behind, 1, 1000, cost, 0.5, slo_seconds=0.25) is None


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
    assert arrival_rate(0.01, 0.001, 0.05) == pytest.approx(100.0)
    assert arrival_rate(0.01, 0.03, 0.05) == pytest.approx(1 / 0.011)  # one long gap: a nudge
    assert arrival_rate(0.01, 2.0, 0.05) == pytest.approx(1 / (0.01 + 0.05 * 1.99))
    assert arrival_rate(0.01, 20.0, 0.05) < 1.0  # a long silence: the rate falls towards 0
    assert arrival_rate(math.inf, 0.0, 0.05) == 0.0


class TestCostModel:
    def test_recovers_a_line_exactly(self) -> None:
        model = CostModel()
        for b in (1, 2, 4, 8, 16, 32) * 5:
            model.observe(b, 0.010 + 0.002 * b)
        assert model.fixed_seconds == pytest.approx(0.010)
        assert model.per_item_seconds == pytest.approx(0.002)
        assert model.mean(64) == pytest.approx(0.010 + 0.002 * 64)  # unseen: the line
        assert model.estimate(64) == pytest.approx(model.mean(64))  # no noise, no margin

    def test_measured_sizes_override_the_line(self) -> None:
        # A CPU-like device: 8 rows cost more than 16.
        costs = {1: 0.05, 2: 0.06, 4: 0.15, 8: 0.18, 16: 0.08, 32: 0.115}
        model = CostModel()
        for b, t in costs.items():
            model.observe(b, t)
        assert model.measured() == pytest.approx(costs)
        assert model.mean(8) == 0.18 and model.mean(16) == 0.08
        # As buckets, 32 serves most per second (278/s) and fits a 0.2 s budget.
        assert model.best_size(0.2, 32, allowed=(1, 2, 16, 32)) == 32
        assert model.best_size(0.1, 32, allowed=(1, 2, 16, 32)) == 16

    def test_noise_is_spread_around_each_sizes_own_mean(self) -> None:
        model = CostModel()
        for _ in range(200):
            for b, t in ((1, 0.05), (4, 0.15), (16, 0.08)):  # far from any line: no noise
                model.observe(b, t)
        assert model.relative_noise == 0.0
        for i in range(200):
            model.observe(16, 0.08 * (1.1 if i % 2 else 0.9))
        assert model.relative_noise == pytest.approx(0.1, rel=0.2)
        assert model.estimate(16) > model.mean(16) * 1.25  # three deviations of ~10%
        assert model.estimate(16, stddevs=1.0) < model.estimate(16)

    def test_one_size_known_scales_proportionally(self) -> None:
        model = CostModel()
        model.observe(4, 0.02)
        assert model.estimate(8) == pytest.approx(0.04)
        assert model.estimate(2) == pytest.approx(0.02)

    def test_nothing_known_estimates_zero_and_allows_the_limit(self) -> None:
        model = CostModel()
        assert not model.known and model.estimate(10) == 0.0
        assert model.largest_within(0.1, 32) == 32
        assert model.best_size(0.1, 32, allowed=(1, 8, 32)) == 32

    def test_largest_within_the_budget(self) -> None:
        model = CostModel()
        for b in (1, 8, 16) * 40:
            model.observe(b, 0.005 + 0.002 * b)
        assert model.largest_within(BATCH_BUDGET_FRACTION * 0.1, 64) == 22  # 5 + 2*22 <= 50 ms
        assert model.best_size(BATCH_BUDGET_FRACTION * 0.1, 64) == 22

    def test_smallest_size_serving_a_rate(self) -> None:
        model = CostModel()
        for b in (1, 8, 16) * 40:
            model.observe(b, 0.005 + 0.002 * b)
        # b / (5 ms + 2 ms b): 3 items serve 273/s, 4 items 308/s
        assert model.smallest_serving(300.0, 64) == 4
        assert model.smallest_serving(300.0, 64, allowed=(1, 2, 8, 16)) == 8
        assert model.smallest_serving(1e6, 64) == 64  # nothing is fast enough: the limit
        assert CostModel().smallest_serving(300.0, 64) == 64  # nothing known yet

    def test_stale_slow_entries_give_way_after_a_speed_up(self) -> None:
        model = CostModel()
        for b in (8, 16, 32) * 10:
            model.observe(b, 3 * (0.005 + 0.002 * b))  # slow device
        for _ in range(FORGET_AFTER + 1):
            for b in (2, 4):
                model.observe(b, 0.005 + 0.002 * b)  # fast again, small batches only
        # 32 was last measured slow; the line through the recent sizes says fast: trust that.
        assert model.mean(32) == pytest.approx(0.005 + 0.002 * 32)

    def test_stale_fast_entries_are_kept_when_the_recent_line_extrapolates_worse(self) -> None:
        model = CostModel()
        for b in (1, 2, 4, 8, 16, 32) * 5:
            model.observe(b, 0.03 + 0.0025 * b)
        for _ in range(FORGET_AFTER + 1):
            model.observe(1, 0.0325)
            model.observe(2, 0.0325 + 0.01)  # a noisy quiet period: steep line through 1 and 2
        assert model.mean(32) == pytest.approx(0.03 + 0.0025 * 32)

    def test_one_recent_size_keeps_the_lines_shape(self) -> None:
        model = CostModel()
        for b in (8, 16, 24) * 10:
            model.observe(b, 0.005 + 0.002 * b)
        for _ in range(FORGET_AFTER + 1):
            model.observe(2, 3 * (0.005 + 0.002 * 2))  # three times slower, size 2 only
        # The prior passes through what is measured now and keeps a fixed part, so a large
        # batch is predicted far below proportional scaling from size 2 (16 x 27 ms).
        assert model.fixed_seconds + 2 * model.per_item_seconds == pytest.approx(0.027)
        assert model.fixed_seconds > 0 and model.per_item_seconds > 0
        assert model.mean(32) < 0.5 * 16 * 0.027


def test_the_next_batch_is_formed_a_quarter_of_the_running_ones_time_early() -> None:
    assert lookahead_at(10.0, 0.020) == pytest.approx(10.015)
    assert lookahead_at(10.0, 0.002) == pytest.approx(10.001)  # at least a millisecond early
    assert lookahead_at(10.0, 0.0005) == 10.0  # shorter than that: at once
