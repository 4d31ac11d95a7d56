"""The shared poll helper: what it returns, and how it gives up."""

from __future__ import annotations

import pytest

from tests.waiting import wait_until


def test_returns_the_first_truthy_value() -> None:
    answers = iter([None, 0, "", ["ready"]])
    assert wait_until(lambda: next(answers), timeout=10, what="an answer", interval=0) == ["ready"]


def test_gives_up_naming_what_it_waited_for() -> None:
    with pytest.raises(TimeoutError, match=r"gave up after 0\.01 s waiting for the moon"):
        wait_until(lambda: False, timeout=0.01, what="the moon", interval=0.001)


def test_appends_the_detail_when_it_gives_up() -> None:
    with pytest.raises(TimeoutError, match="waiting for the server\nlast status 503"):
        wait_until(lambda: None, timeout=0, what="the server", detail=lambda: "last status 503")


def test_checks_once_even_with_no_time_to_wait() -> None:
    calls: list[int] = []
    assert wait_until(lambda: calls.append(1) or len(calls), timeout=0, what="one call") == 1
    with pytest.raises(TimeoutError):
        wait_until(lambda: calls.append(1), timeout=0, what="a check that never holds")
    assert len(calls) == 2
