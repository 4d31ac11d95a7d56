"""The runner under ``--max-rate``, on a fake clock: what is in flight, and what grows the limit.

The whole run happens on an event loop whose clock only moves when nothing is ready to run (it
jumps to the next timer), against a fake endpoint that answers after a set latency. So a run of
seconds takes milliseconds, and no scheduling hiccup of a busy machine can change what the
runner sees.
"""

from __future__ import annotations

import asyncio
import selectors
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from jobs import JobConfig
from jobs.endpoint import Attempt
from jobs.input import WorkItem
from jobs.metrics import JobMetrics
from jobs.plan import prepare
from jobs.progress import ProgressDisplay
from jobs.runner import JobRunner, JobSummary
from tests.jobs.conftest import records, write_requests

JOB = {"job_name": "in"}


class _JumpingSelector(selectors.SelectSelector):
    """Never blocks: when nothing is ready it moves the clock by the time it would wait."""

    def __init__(self, advance: Callable[[float], None]) -> None:
        super().__init__()
        self._advance = advance

    def select(self, timeout: float | None = None) -> list:
        ready = super().select(0)
        if ready or timeout == 0:
            return ready
        if timeout is None:
            raise RuntimeError("nothing scheduled and nothing ready: the run would hang")
        self._advance(timeout)
        return []


class FakeTimeLoop(asyncio.SelectorEventLoop):
    def __init__(self) -> None:
        self.now = 0.0
        super().__init__(_JumpingSelector(self._advance))

    def _advance(self, seconds: float) -> None:
        self.now += seconds

    def time(self) -> float:
        return self.now


@dataclass
class Seen:
    """What the job's own metrics said at each send, as its /metrics would have."""

    registry: CollectorRegistry
    in_flight: list[float | None] = field(default_factory=list)
    rate_limited: list[float | None] = field(default_factory=list)
    concurrency: list[float | None] = field(default_factory=list)
    sends: list[float] = field(default_factory=list)

    def value(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, {**JOB, **labels})

    def note(self, now: float) -> None:
        self.sends.append(now)
        self.in_flight.append(self.value("autoglm_job_in_flight_requests"))
        self.rate_limited.append(self.value("autoglm_job_waiting_requests", reason="rate_limit"))
        self.concurrency.append(self.value("autoglm_job_concurrency"))


def run_fake(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lines: int, latency: float, **settings: Any
) -> tuple[JobSummary, Seen, JobRunner]:
    """Run a job of ``lines`` lines against an endpoint that answers each request ``latency``
    seconds after it was sent, on the fake clock."""
    loop = FakeTimeLoop()
    registry = CollectorRegistry()
    seen = Seen(registry)

    class FakeEndpoint:
        def __init__(self, config: JobConfig, clock: Callable[[], float]) -> None:
            self.clock = clock

        async def __aenter__(self) -> FakeEndpoint:
            return self

        async def __aexit__(self, *exc: object) -> None:
            return None

        async def check(self) -> None:
            return None

        async def infer(self, item: WorkItem) -> Attempt:
            seen.note(self.clock())
            await asyncio.sleep(latency)
            return Attempt("ok", 200, {"outputs": []}, seconds=latency)

    monkeypatch.setattr("jobs.runner.Endpoint", FakeEndpoint)
    write_requests(tmp_path / "in.jsonl", lines, malformed={})
    config = JobConfig(
        endpoint="http://127.0.0.1:1",
        input=str(tmp_path / "in.jsonl"),
        output=str(tmp_path / "out.jsonl"),
        model="demo",
        progress="off",
        **settings,
    )
    plan = prepare(config)
    metrics = JobMetrics(registry, "in")
    display = ProgressDisplay("off", 10.0, "in", is_tty=False)
    runner = JobRunner(plan, metrics, display, threading.Event(), clock=loop.time)
    try:
        summary = loop.run_until_complete(runner.run())
    finally:
        loop.close()
    assert summary.exit_code == 0
    assert [r["line"] for r in records(tmp_path / "out.jsonl")] == list(range(1, lines + 1))
    return summary, seen, runner


def test_requests_held_back_by_the_rate_cap_are_not_in_flight(tmp_path, monkeypatch) -> None:
    """The audit's case: 25 requests a second answered in 3 ms. One request at a time is in
    flight; the other open lines wait for their send slot, and say so in their own gauge."""
    summary, seen, runner = run_fake(
        tmp_path, monkeypatch, 200, latency=0.003, max_rate=25.0, initial_concurrency=4
    )
    assert summary.ok == 200
    assert seen.sends[-1] - seen.sends[0] == pytest.approx(199 / 25)  # paced, evenly
    assert set(seen.in_flight) == {1}  # up to 19 before: every open line counted
    assert set(seen.rate_limited) == {0, 1, 2, 3}  # the other three open lines wait for their slot
    assert seen.value("autoglm_job_in_flight_requests") == 0
    assert seen.value("autoglm_job_waiting_requests", reason="rate_limit") == 0
    assert seen.value("autoglm_job_waiting_requests", reason="retry") == 0
    assert runner.open_lines == 0 and runner.in_flight == 0


def test_answers_that_never_filled_the_limit_do_not_grow_it(tmp_path, monkeypatch) -> None:
    """At one request in flight at a time nothing says four, let alone 64, would fit."""
    _, seen, runner = run_fake(
        tmp_path,
        monkeypatch,
        200,
        latency=0.003,
        max_rate=25.0,
        initial_concurrency=4,
        max_concurrency=64,
    )
    assert set(seen.concurrency) == {4}  # reached 20 before: a step per window of answers
    assert runner.limit.limit == 4 and seen.value("autoglm_job_concurrency") == 4


def test_under_a_rate_cap_the_limit_grows_only_to_what_the_cap_lets_be_in_flight(
    tmp_path, monkeypatch
) -> None:
    """100 requests a second at 50 ms each is 5 in flight. The limit grows while it holds the
    job back, and stops a step or two above: the rate cap, not the limit, is what binds."""
    _, seen, runner = run_fake(
        tmp_path,
        monkeypatch,
        400,
        latency=0.05,
        max_rate=100.0,
        initial_concurrency=2,
        max_concurrency=64,
    )
    assert 3.99 <= seen.sends[-1] - seen.sends[0] < 4.2  # the cap binds
    assert 5 <= runner.limit.limit <= 7  # reached 28 before: every answer counted
    assert max(n or 0 for n in seen.in_flight) == 5  # one slot held back for the cap


def test_without_a_cap_the_limit_climbs_on_answers_at_the_limit(tmp_path, monkeypatch) -> None:
    """The evidence rule costs nothing when the limit is what binds: it climbs to the maximum."""
    _, seen, runner = run_fake(
        tmp_path, monkeypatch, 300, latency=0.01, initial_concurrency=2, max_concurrency=16
    )
    assert runner.limit.limit == 16
    assert 16 in seen.in_flight
    assert seen.concurrency == sorted(seen.concurrency, key=float)
    assert set(seen.rate_limited) == {0}
