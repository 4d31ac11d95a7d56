"""Drive a JSONL file of inference requests through a batcher endpoint as best-effort traffic.

:func:`jobs.plan.prepare` checks everything it can before any work (files, journal, settings)
and opens the shard's result files where the journal says the last run stopped; the endpoint
checks its credentials, TLS and default model (:mod:`jobs.endpoint`). :class:`JobRunner` then
reads the shard's remaining lines, keeps as many lines open as the AIMD limit allows
(:mod:`jobs.concurrency`), sends each when ``--max-rate`` lets it (:mod:`jobs.pacing`),
retries what was refused or failed, and commits answers through the journal
(:mod:`jobs.results`). A stop (SIGTERM from Kubernetes, Ctrl-C) waits a short while for
requests in flight, commits, and exits 3: a rerun resumes. :func:`run_job` is the library call.

Exit codes (also :attr:`JobSummary.exit_code`): 0 every line answered; 1 every line done but
some are in the errors file (0 with ``--no-fail-on-invalid``); 2 bad settings, found before any
work; 3 stopped before the end (signal, patience exhausted, credentials refused) -- run again
with the same settings to resume.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry

from jobs.concurrency import AIMDLimit, InFlight, retry_delay
from jobs.config import JobConfig
from jobs.endpoint import Attempt, Endpoint
from jobs.input import MalformedLine, WorkItem, parse_line, shard_lines
from jobs.metrics import JobMetrics
from jobs.pacing import RatePacer
from jobs.plan import JobPlan, prepare
from jobs.progress import ProgressDisplay, RateWindow, Snapshot
from jobs.results import Completion

log = logging.getLogger(__name__)

EXIT_DONE = 0
EXIT_DONE_WITH_ERRORS = 1
EXIT_INCOMPLETE = 3
_DISPLAY_TICK_SECONDS = 0.5


@dataclass(frozen=True)
class JobSummary:
    """How a run ended; ``done`` counts earlier runs' lines too."""

    job_name: str
    total: int
    done: int
    ok: int
    invalid: int
    invalid_before: int
    refusals: int
    stopped: str  # "" when the shard was finished, else why the run stopped
    fail_on_invalid: bool = True

    @property
    def remaining(self) -> int:
        return self.total - self.done

    @property
    def exit_code(self) -> int:
        if self.remaining > 0:
            return EXIT_INCOMPLETE
        if self.fail_on_invalid and self.invalid + self.invalid_before:
            return EXIT_DONE_WITH_ERRORS
        return EXIT_DONE


class JobRunner:
    """One run over a prepared shard; :meth:`run` returns when it is done or stopped."""

    def __init__(
        self,
        plan: JobPlan,
        metrics: JobMetrics,
        display: ProgressDisplay,
        stop: threading.Event,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.plan = plan
        self.config = plan.config
        self.results = plan.results
        self.metrics = metrics
        self.display = display
        self.stop_requested = stop
        self.clock = clock
        config = self.config
        self.limit = AIMDLimit(
            minimum=config.min_concurrency,
            maximum=config.max_concurrency,
            initial=config.initial_concurrency,
        )
        self.pacer = RatePacer(config.max_rate)
        self.window = max(4 * config.max_concurrency, 2 * config.commit_every)
        # A line is open from when it is taken from the input until it is done; the limit
        # bounds open lines. An open line is in flight (sent, not yet answered), waiting for
        # its send slot under --max-rate, or waiting to be sent again after a refusal or a
        # failure; only requests in flight are evidence for the limit (InFlight).
        self.open_lines = 0
        self.flight = InFlight()
        self.parked = 0  # of the open lines, waiting out a refusal's Retry-After
        self.ok = 0
        self.invalid = 0
        self.refusals = 0
        self.stopped = ""
        self.rate = RateWindow()
        self._done_before = len(plan.resume.done)
        self._changed = asyncio.Event()
        self._stop = asyncio.Event()
        self._last_answer = clock()
        self._last_probe = -math.inf
        self._all_parked_since: float | None = None
        metrics.lines_in_shard.set(plan.total)
        metrics.lines_remaining.set(plan.total - self._done_before)
        metrics.concurrency.set(self.limit.limit)

    @property
    def in_flight(self) -> int:
        """Requests sent and not yet answered."""
        return self.flight.count

    @property
    def done(self) -> int:
        return self._done_before + self.ok + self.invalid

    async def run(self) -> JobSummary:
        config = self.config
        watcher = asyncio.create_task(self._watch_stop())
        try:
            async with Endpoint(config, self.clock) as endpoint:
                await endpoint.check()
                log.info(
                    "job started",
                    extra={
                        "job_name": config.name,
                        "shard": f"{config.shard_index}/{config.shard_count}",
                        "lines": self.plan.total,
                        "done_before": self._done_before,
                        "max_rate": config.max_rate or None,
                        "output": str(config.sharded_output),
                    },
                )
                self.display.start(self.plan.total, self._done_before)
                ticker = asyncio.create_task(self._tick())
                try:
                    await self._dispatch(endpoint)
                finally:
                    ticker.cancel()
                    self._commit()
                    self.display.update(self.clock(), self._snapshot(), force=True)
                    self.display.stop()
        finally:
            watcher.cancel()
            self.results.close()
        summary = JobSummary(
            job_name=config.name,
            total=self.plan.total,
            done=self.done,
            ok=self.ok,
            invalid=self.invalid,
            invalid_before=self.plan.invalid_before,
            refusals=self.refusals,
            stopped=self.stopped if self.done < self.plan.total else "",
            fail_on_invalid=config.fail_on_invalid,
        )
        log.info(
            "job finished" if summary.remaining == 0 else "job stopped; run again to resume",
            extra={
                "job_name": config.name,
                "done": summary.done,
                "total": summary.total,
                "ok": summary.ok,
                "invalid": summary.invalid + summary.invalid_before,
                "refusals": summary.refusals,
                "reason": summary.stopped,
                "exit_code": summary.exit_code,
            },
        )
        return summary

    # --- dispatch ---------------------------------------------------------------------------

    async def _dispatch(self, endpoint: Endpoint) -> None:
        config = self.config
        tasks: set[asyncio.Task[None]] = set()
        seq = 0
        lines = shard_lines(
            config.input, config.shard_index, config.shard_count, self.plan.resume.done
        )
        for line, raw in lines:
            if self._stop.is_set():
                break
            try:
                item = parse_line(raw, line, config.model, config.priority)
            except MalformedLine as exc:
                log.warning("malformed line", extra={"line": line, "error": str(exc)})
                record = {"line": line, "id": exc.id, "reason": "malformed", "error": str(exc)}
                self._complete(Completion(seq, line, "invalid", record))
                seq += 1
                continue
            await self._wait_for_slot(seq)
            if self._stop.is_set():
                break
            self.open_lines += 1
            task = asyncio.create_task(self._serve(endpoint, item, seq))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            seq += 1
        if not tasks:
            return
        if not self._stop.is_set():
            await asyncio.wait(set(tasks))
            return
        _, pending = await asyncio.wait(set(tasks), timeout=config.drain_seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    async def _wait_for_slot(self, seq: int) -> None:
        """Until the limit allows one more request, or a probe is due (:meth:`_probe_in`), and,
        in input order, the held results fit."""
        while not self._stop.is_set():
            ahead = seq - self.results.next_seq if self.results.ordered else 0
            if ahead < self.window:
                if self.open_lines < self.limit.limit:
                    return
                probe_in = self._probe_in()
                if probe_in <= 0:
                    self._last_probe = self.clock()
                    return
            else:
                probe_in = math.inf
            self._changed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), timeout=probe_in)

    def _probe_in(self) -> float:
        """Seconds until one more line may go out beyond the limit: only while every open line
        waits out a refusal's Retry-After, one ``probe_interval_seconds`` after they all
        began waiting and then at most one per interval.
        A Retry-After is one replica's word; behind a Service another replica (one just
        started, or one whose throttle lifted) may have idle capacity sooner, and only a
        request can find it. An answered probe starts the climb back (slow start); a refused
        one waits its Retry-After like any other."""
        interval = self.config.probe_interval_seconds
        if interval <= 0 or self.parked == 0 or self.parked < self.open_lines:
            self._all_parked_since = None
            return math.inf
        now = self.clock()
        if self._all_parked_since is None:
            self._all_parked_since = now
        return max(self._all_parked_since, self._last_probe) + interval - now

    async def _serve(self, endpoint: Endpoint, item: WorkItem, seq: int) -> None:
        """Send one line until it is answered, found invalid, or the job stops."""
        attempt = 0
        server_errors = 0
        try:
            while not self._stop.is_set():
                if wait := self.pacer.reserve(self.clock()):
                    await self._wait("rate_limit", wait)
                    if self._stop.is_set():  # a stop while held back sends nothing more
                        break
                attempt += 1
                epoch = self.limit.epoch
                result, saturated = await self._send(endpoint, item)
                if result.kind == "ok":
                    self.metrics.latency.observe(result.seconds)
                    self._last_answer = self.clock()
                    if self.limit.on_success(saturated):
                        self._limit_changed()
                    record = {"line": item.line, "id": item.id, **(result.answer or {})}
                    self._complete(Completion(seq, item.line, "ok", record))
                    return
                if result.kind == "invalid":
                    self._last_answer = self.clock()
                    self._complete_invalid(seq, item, "rejected", result)
                    return
                if result.kind == "denied":
                    log.error(
                        "the endpoint refused the job's credentials; stopping",
                        extra={"status": result.status, "error": result.message},
                    )
                    self._halt("credentials refused")
                    return
                if self.limit.on_refusal(epoch):
                    self._limit_changed()
                if result.kind == "refused":
                    self.refusals += 1
                    self.metrics.refusals.inc()
                    delay = retry_delay(attempt, result.retry_after)
                else:
                    self.metrics.failures[result.kind].inc()
                    log.debug(
                        "request failed; will retry",
                        extra={"line": item.line, "reason": result.kind, "error": result.message},
                    )
                    if result.kind == "server_error":
                        server_errors += 1
                        if server_errors >= self.config.max_server_errors:
                            self._complete_invalid(seq, item, "server_error", result)
                            return
                    if self.clock() - self._last_answer > self.config.patience_seconds:
                        log.error(
                            "no line answered within the patience; stopping",
                            extra={
                                "patience_seconds": self.config.patience_seconds,
                                "error": result.message,
                            },
                        )
                        self._halt("endpoint failing")
                        return
                    delay = retry_delay(attempt, None)
                await self._wait_out(delay, parked=result.kind == "refused")
        finally:
            self.open_lines -= 1
            self._changed.set()

    async def _send(self, endpoint: Endpoint, item: WorkItem) -> tuple[Attempt, bool]:
        """Send one request; returns what came back and whether the limit was full while it
        was in flight (only then may its success grow the limit)."""
        ticket = self.flight.send(self.limit.limit)
        self.metrics.in_flight.set(self.flight.count)
        try:
            result = await endpoint.infer(item)
        finally:
            saturated = self.flight.answered(ticket)
            self.metrics.in_flight.set(self.flight.count)
        return result, saturated

    async def _wait(self, reason: str, seconds: float) -> None:
        """Sleep before a send, counted in ``autoglm_job_waiting_requests{reason}``."""
        gauge = self.metrics.waiting[reason]
        gauge.inc()
        try:
            await self._sleep(seconds)
        finally:
            gauge.dec()

    async def _wait_out(self, seconds: float, parked: bool) -> None:
        """Sleep before sending a line again; ``parked`` (a refusal's Retry-After) counts it
        among the lines a probe may go out beside."""
        if not parked:
            await self._wait("retry", seconds)
            return
        self.parked += 1
        self._changed.set()
        try:
            await self._wait("retry", seconds)
        finally:
            self.parked -= 1

    def _complete_invalid(self, seq: int, item: WorkItem, reason: str, result: Attempt) -> None:
        log.warning(
            "line not answered",
            extra={
                "line": item.line,
                "reason": reason,
                "status": result.status,
                "error": result.message,
            },
        )
        record = {
            "line": item.line,
            "id": item.id,
            "reason": reason,
            "status": result.status,
            "error": result.message,
        }
        self._complete(Completion(seq, item.line, "invalid", record))

    def _complete(self, completion: Completion) -> None:
        self.results.add(completion)
        if self.results.staged >= self.config.commit_every:
            self._commit()

    def _commit(self) -> None:
        committed = self.results.commit()
        for completion in committed:
            self.metrics.lines[completion.outcome].inc()
            if completion.outcome == "ok":
                self.ok += 1
            else:
                self.invalid += 1
        if committed:
            self.metrics.lines_remaining.set(self.plan.total - self.done)
            self._changed.set()

    # --- stopping, pacing, display ----------------------------------------------------------

    def _halt(self, reason: str) -> None:
        self.stopped = self.stopped or reason
        self._stop.set()
        self._changed.set()

    async def _watch_stop(self) -> None:
        """Turn the thread-safe stop (set by a signal handler or a caller) into the loop's."""
        while not self.stop_requested.is_set():
            await asyncio.sleep(0.05)
        log.info("stop requested; committing what is answered")
        self._halt("stopped by signal")

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    def _limit_changed(self) -> None:
        self.metrics.concurrency.set(self.limit.limit)
        self._changed.set()

    async def _tick(self) -> None:
        last_commit = self.clock()
        while True:
            await asyncio.sleep(_DISPLAY_TICK_SECONDS)
            now = self.clock()
            if now - last_commit >= self.config.commit_interval_seconds:
                self._commit()
                last_commit = now
            self.rate.add(now, self.ok + self.invalid)
            self.display.update(now, self._snapshot())

    def _snapshot(self) -> Snapshot:
        return Snapshot(
            total=self.plan.total,
            done=self.done,
            ok=self.ok,
            invalid=self.invalid,
            in_flight=self.in_flight,
            concurrency=self.limit.limit,
            refusals=self.refusals,
            rate=self.rate.rate(),
        )


def run_job(
    config: JobConfig,
    *,
    stop: threading.Event | None = None,
    registry: CollectorRegistry | None = None,
    progress: str | None = None,
) -> JobSummary:
    """Run a job to its end or until ``stop`` is set; the library form of ``autoglm job run``.

    Raises :class:`ConfigError` for bad settings, before any line is sent.
    """
    plan = prepare(config)
    try:
        metrics = JobMetrics(registry or CollectorRegistry(), config.name)
        display = ProgressDisplay(
            progress or config.progress,
            config.progress_interval_seconds,
            config.name,
            sys.stderr.isatty(),
        )
        runner = JobRunner(plan, metrics, display, stop or threading.Event())
    except BaseException:
        plan.results.close()
        raise
    return asyncio.run(runner.run())
