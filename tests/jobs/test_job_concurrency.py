"""The AIMD limit and the retry delay: pure arithmetic, no clock."""

from __future__ import annotations

import random

import pytest

from jobs.concurrency import AIMDLimit, InFlight, parse_retry_after, retry_delay


def test_limit_grows_by_one_per_window_of_limit_successes() -> None:
    limit = AIMDLimit(minimum=1, maximum=10, initial=3)
    grew = [limit.on_success(True) for _ in range(3)]
    assert grew == [False, False, True] and limit.limit == 4
    grew = [limit.on_success(True) for _ in range(4)]
    assert grew == [False, False, False, True] and limit.limit == 5


def test_limit_never_exceeds_the_maximum() -> None:
    limit = AIMDLimit(minimum=1, maximum=5, initial=5)
    for _ in range(100):
        assert not limit.on_success(True)
    assert limit.limit == 5


def test_a_refusal_halves_the_limit_down_to_the_minimum() -> None:
    limit = AIMDLimit(minimum=2, maximum=64, initial=40)
    assert limit.on_refusal(limit.epoch) and limit.limit == 20
    assert limit.on_refusal(limit.epoch) and limit.limit == 10
    for _ in range(5):
        limit.on_refusal(limit.epoch)
    assert limit.limit == 2


def test_refusals_of_requests_sent_before_a_decrease_count_once() -> None:
    limit = AIMDLimit(minimum=1, maximum=64, initial=32)
    sent = [limit.epoch] * 32  # a whole window in flight, all refused together
    decreases = [limit.on_refusal(epoch) for epoch in sent]
    assert decreases.count(True) == 1 and limit.limit == 16
    # A request sent after that decrease, refused again: a new congestion event.
    assert limit.on_refusal(limit.epoch) and limit.limit == 8


def test_a_refusal_restarts_the_success_window() -> None:
    limit = AIMDLimit(minimum=1, maximum=64, initial=4)
    for _ in range(3):
        limit.on_success(True)
    limit.on_refusal(limit.epoch)  # limit 2; the 3 successes before do not carry over
    assert not limit.on_success(True) and limit.on_success(True) and limit.limit == 3


def test_after_refusals_with_no_answer_between_the_limit_climbs_fast_to_half_its_old_level() -> (
    None
):
    limit = AIMDLimit(minimum=1, maximum=64, initial=16)
    limit.on_success(True)
    for _ in range(4):  # throttled: every request refused, none answered
        limit.on_refusal(limit.epoch)
    assert limit.limit == 1 and limit.slow_start_threshold == 8
    grew = [limit.on_success(True) for _ in range(7)]
    assert all(grew) and limit.limit == 8  # one per answer up to the threshold
    assert [limit.on_success(True) for _ in range(8)] == [False] * 7 + [True]  # then one per window
    assert limit.limit == 9


def test_a_refusal_after_an_answer_lowers_the_threshold() -> None:
    limit = AIMDLimit(minimum=1, maximum=64, initial=16)
    limit.on_refusal(limit.epoch)
    assert limit.slow_start_threshold == 8
    limit.on_refusal(limit.epoch)  # no answer between: capacity closed, not measured smaller
    assert limit.limit == 4 and limit.slow_start_threshold == 8
    limit.on_success(True)  # 5
    limit.on_refusal(limit.epoch)  # refused after an answer: this much no longer fits
    assert limit.limit == 2 and limit.slow_start_threshold == 2


def test_successes_below_the_limit_never_grow_it() -> None:
    """Answers that came while fewer than ``limit`` requests were out (a job held back by its
    --max-rate) are no evidence that more would fit: no growth, in a window or in slow start."""
    limit = AIMDLimit(minimum=1, maximum=64, initial=4)
    assert not any(limit.on_success(False) for _ in range(1000))
    assert limit.limit == 4
    limit.on_refusal(limit.epoch)
    limit.on_refusal(limit.epoch)  # throttled: 1, slow start back to the threshold of 2
    assert not any(limit.on_success(False) for _ in range(100)) and limit.limit == 1
    assert limit.on_success(True) and limit.limit == 2
    # unsaturated answers do not fill the window either
    for _ in range(10):
        limit.on_success(False)
    assert [limit.on_success(True) for _ in range(2)] == [False, True] and limit.limit == 3


def test_in_flight_counts_sent_requests_until_they_come_back() -> None:
    flight = InFlight()
    tickets = [flight.send(limit=4) for _ in range(3)]
    assert flight.count == 3
    flight.answered(tickets[0])
    assert flight.count == 2
    for ticket in tickets[1:]:
        flight.answered(ticket)
    assert flight.count == 0
    with pytest.raises(RuntimeError):
        flight.answered(0)


def test_requests_one_at_a_time_never_saw_the_limit_full() -> None:
    """A rate-capped job: each request is answered before the next goes out."""
    flight = InFlight()
    assert not any(flight.answered(flight.send(limit=4)) for _ in range(100))
    # at a limit of one, each of them alone fills it
    assert all(flight.answered(flight.send(limit=1)) for _ in range(3))


def test_every_request_out_while_the_limit_was_full_saw_it_full() -> None:
    """Answers of one batch come back together: each of them was out when the fourth send
    filled the limit of four, not only the first one answered."""
    flight = InFlight()
    batch = [flight.send(limit=4) for _ in range(4)]
    assert [flight.answered(ticket) for ticket in batch] == [True] * 4
    # one sent after the limit was full and answered alone did not see it full
    early = flight.send(limit=4)
    assert not flight.answered(early)
    # one sent early that was still out when a later send filled the limit did
    early = flight.send(limit=3)
    later = [flight.send(limit=3) for _ in range(2)]
    assert flight.answered(early)
    assert [flight.answered(ticket) for ticket in later] == [True, True]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"minimum": 0}, "minimum"),
        ({"minimum": 5, "maximum": 4}, "minimum"),
        ({"decrease_factor": 1.0}, "decrease_factor"),
    ],
)
def test_bad_bounds_are_refused(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        AIMDLimit(**kwargs)


def test_initial_limit_is_clamped_into_the_bounds() -> None:
    assert AIMDLimit(minimum=3, maximum=8, initial=1).limit == 3
    assert AIMDLimit(minimum=3, maximum=8, initial=50).limit == 8


def test_retry_after_is_honoured_and_capped() -> None:
    assert retry_delay(1, 2.0) == 2.0
    assert retry_delay(7, 0.0) == 0.0
    assert retry_delay(1, 3600.0, cap=30.0) == 30.0


def test_backoff_without_retry_after_grows_with_attempts_within_jitter() -> None:
    rng = random.Random(0)
    for attempt, ceiling in [(1, 0.5), (2, 1.0), (3, 2.0), (10, 30.0)]:
        delays = [retry_delay(attempt, None, base=0.5, cap=30.0, rng=rng) for _ in range(50)]
        assert all(ceiling / 2 <= d <= ceiling for d in delays), attempt
        assert max(delays) - min(delays) > 0  # jittered, so refused pods spread out


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("1", 1.0),
        (" 3 ", 3.0),
        ("0.5", 0.5),
        (None, None),
        ("-1", None),
        ("soon", None),
        ("Wed, 21 Oct 2026 07:28:00 GMT", None),
        ("inf", None),
    ],
)
def test_retry_after_header_parsing(header: str | None, seconds: float | None) -> None:
    assert parse_retry_after(header) == seconds
