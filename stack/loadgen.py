"""Open-loop load generator: KServe v2 requests to the workers at the profile's rate.

Open loop means arrivals do not wait for answers (as real users do not): requests arrive as a
Poisson process whose rate follows the profile, and a slow fleet shows up as growing latency and
SLO misses rather than as a politely lower rate. Requests go round-robin to the workers that are
ready (the job of a Kubernetes Service), over loopback only. At most ``max_in_flight`` requests
are open at once; an arrival beyond that is shed and counted as a miss, so the generator itself
never grows without bound.

Each request ends in one outcome (``autoglm_loadgen_requests_total{outcome}``, the summary's
counts): ``ok``; ``rejected``, a 429 -- the batcher refused it at admission (its queue full, or
the answer would come past the deadline), as its own ``autoglm_batcher_requests_total`` counts
it; ``error``, any other answer or a failed connection (a 503 too: a draining worker's refusal
and a request dropped by its drain look alike from here); ``timeout``, no answer within
``REQUEST_TIMEOUT_SECONDS``; ``shed``, over ``max_in_flight`` and never sent; ``no_worker``,
no worker ready.

The pure parts -- arrivals, round-robin, the request log and its statistics -- take explicit
times and a seeded random generator; only :class:`LoadGenerator` touches sockets and clocks.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from stack.profiles import RateProfile

log = logging.getLogger(__name__)

OUTCOMES = ("ok", "rejected", "error", "timeout", "shed", "no_worker")
REJECTED_STATUS = 429  # the batcher's refusal at admission (queue full, past the deadline)
FEATURES = 16
REQUEST_TIMEOUT_SECONDS = 10.0
BEHIND_WARNING_SECONDS = 1.0  # a request this late against its schedule is logged, once
_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Arrivals:
    """Poisson arrivals with a time-varying rate, by thinning (Lewis and Shedler).

    Candidates come at the profile's peak rate; each is kept with probability
    ``rate(t) / peak``, which gives exactly the profile's rate at every instant.
    """

    def __init__(self, profile: RateProfile, rng: random.Random) -> None:
        self.profile, self.rng = profile, rng
        self.bound = profile.peak_rps

    def next_after(self, t: float) -> float:
        """Time of the first arrival after ``t`` (seconds since the start)."""
        while True:
            t += self.rng.expovariate(self.bound)
            if self.rng.random() * self.bound < self.profile.rate(t):
                return t


class RoundRobin:
    """Endpoints in turn; the list can change at any time (workers come and go)."""

    def __init__(self) -> None:
        self._endpoints: list[str] = []
        self._next = 0

    def set(self, endpoints: Sequence[str]) -> None:
        self._endpoints = list(endpoints)

    @property
    def size(self) -> int:
        return len(self._endpoints)

    def pick(self) -> str | None:
        if not self._endpoints:
            return None
        endpoint = self._endpoints[self._next % len(self._endpoints)]
        self._next += 1
        return endpoint


@dataclass(frozen=True)
class WindowStats:
    """What happened to the requests sent in a window of time."""

    sent: int
    ok: int
    within_slo: int
    p99_seconds: float | None
    rate_rps: float


@dataclass
class Totals:
    sent: int = 0
    within_slo: int = 0
    by_outcome: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0))

    @property
    def attainment(self) -> float | None:
        """Share of sent requests answered correctly within the SLO."""
        return self.within_slo / self.sent if self.sent else None


class RequestLog:
    """Every request's send time, outcome and latency for the last ``keep_seconds``, plus
    running totals for the whole run."""

    def __init__(self, slo_seconds: float, keep_seconds: float = 120.0) -> None:
        self.slo_seconds, self.keep_seconds = slo_seconds, keep_seconds
        self._recent: deque[tuple[float, str, float | None]] = deque()
        self.totals = Totals()
        self._lock = threading.Lock()

    def record(self, sent_at: float, outcome: str, latency: float | None) -> None:
        within = outcome == "ok" and latency is not None and latency <= self.slo_seconds
        with self._lock:
            self._recent.append((sent_at, outcome, latency))
            while self._recent and self._recent[0][0] < sent_at - self.keep_seconds:
                self._recent.popleft()
            self.totals.sent += 1
            self.totals.within_slo += within
            self.totals.by_outcome[outcome] += 1

    def window(self, now: float, seconds: float) -> WindowStats:
        """Requests sent in ``(now - seconds, now]``; p99 over the answered ones."""
        with self._lock:
            rows = [r for r in self._recent if now - seconds < r[0] <= now]
        latencies = sorted(r[2] for r in rows if r[1] == "ok" and r[2] is not None)
        within = sum(1 for lat in latencies if lat <= self.slo_seconds)
        return WindowStats(
            sent=len(rows),
            ok=len(latencies),
            within_slo=within,
            p99_seconds=percentile(latencies, 0.99),
            rate_rps=len(rows) / seconds,
        )


def percentile(ordered: Sequence[float], q: float) -> float | None:
    """The ``q`` quantile of sorted values (nearest rank); None for no values."""
    if not ordered:
        return None
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]


def outcome_of(status: int) -> str:
    """The outcome of a request the worker answered with HTTP ``status``."""
    if status == 200:
        return "ok"
    return "rejected" if status == REJECTED_STATUS else "error"


def infer_body(rng: random.Random) -> bytes:
    """One KServe v2 request for the workers' model: a single item of ``FEATURES`` floats."""
    data = [round(rng.uniform(-1.0, 1.0), 4) for _ in range(FEATURES)]
    request = {
        "inputs": [{"name": "input", "shape": [1, FEATURES], "datatype": "FP32", "data": data}]
    }
    return json.dumps(request).encode()


class LoadGenMetrics:
    """``autoglm_loadgen_*``: what was offered and what came back, as a client sees it."""

    def __init__(self, registry: CollectorRegistry, slo_seconds: float) -> None:
        self.requests = Counter(
            "autoglm_loadgen_requests",
            "Requests sent by the local load generator, by outcome: ok, rejected (429: refused "
            "at admission, queue full or past the deadline), error (any other answer, or no "
            "connection), timeout, shed (over --max-in-flight, not sent), no_worker.",
            ["outcome"],
            registry=registry,
        )
        for outcome in OUTCOMES:
            self.requests.labels(outcome)
        self.latency = Histogram(
            "autoglm_loadgen_request_latency_seconds",
            "Client-side latency of answered requests.",
            buckets=sorted({*_LATENCY_BUCKETS, round(slo_seconds, 6)}),
            registry=registry,
        )
        self.target_rate = Gauge(
            "autoglm_loadgen_target_requests_per_second",
            "Request rate the profile asks for now.",
            registry=registry,
        )
        self.in_flight = Gauge(
            "autoglm_loadgen_in_flight_requests",
            "Requests sent and not yet answered.",
            registry=registry,
        )
        self.behind = Gauge(
            "autoglm_loadgen_behind_seconds",
            "How late the last request left against its Poisson schedule (a starved machine).",
            registry=registry,
        )


class LoadGenerator:
    """Sends the profile's load from a background thread with its own event loop."""

    def __init__(
        self,
        profile: RateProfile,
        model: str,
        log_: RequestLog,
        metrics: LoadGenMetrics,
        max_in_flight: int = 256,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.profile, self.model, self.log, self.metrics = profile, model, log_, metrics
        self.max_in_flight = max_in_flight
        self.rng = random.Random(seed)
        self.arrivals = Arrivals(profile, self.rng)
        self.router = RoundRobin()
        self.clock = clock
        self.started_at: float | None = None
        self.in_flight = 0
        self.max_behind_seconds = 0.0  # the latest a request left against its schedule
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._done: asyncio.Event | None = None

    def set_endpoints(self, endpoints: Sequence[str]) -> None:
        """``HOST:PORT`` of the workers to send to (the ready ones)."""
        self.router.set(endpoints)

    def elapsed(self) -> float:
        return 0.0 if self.started_at is None else self.clock() - self.started_at

    def start(self) -> None:
        started = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            asyncio.set_event_loop(loop)
            started.set()
            try:
                loop.run_until_complete(self._run())
            finally:
                loop.close()

        self._thread = threading.Thread(target=run, name="autoglm-up-loadgen", daemon=True)
        self._thread.start()
        started.wait()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop sending, wait (bounded) for answers to what is in flight, end the thread."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    async def _run(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.max_in_flight)
        timeout = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_SECONDS)
        tasks: set[asyncio.Task] = set()
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            self.started_at = self.clock()
            next_at = self.arrivals.next_after(0.0)
            while not self._stopping.is_set():
                now = self.elapsed()
                self.metrics.target_rate.set(self.profile.rate(now))
                if now < next_at:
                    await asyncio.sleep(min(0.1, next_at - now))
                    continue
                self._note_behind(now - next_at)
                task = asyncio.ensure_future(self._send(session, self.clock()))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                next_at = self.arrivals.next_after(next_at)
            if tasks:
                _, pending = await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_SECONDS)
                for task in pending:
                    task.cancel()

    def _note_behind(self, seconds: float) -> None:
        """Record how late a request leaves. When this thread does not get the CPU in time the
        offered load arrives late and in bursts; the summary says so, since its figures then
        describe a different load than the profile's (latencies stay measured from the send)."""
        self.metrics.behind.set(seconds)
        if seconds >= BEHIND_WARNING_SECONDS > self.max_behind_seconds:
            log.warning(
                "load generator behind its schedule; the machine is starved",
                extra={"behind_seconds": round(seconds, 3)},
            )
        self.max_behind_seconds = max(self.max_behind_seconds, seconds)

    async def _send(self, session: aiohttp.ClientSession, sent_at: float) -> None:
        endpoint = self.router.pick()
        if endpoint is None:
            self._finish(sent_at, "no_worker", None)
            return
        if self.in_flight >= self.max_in_flight:
            self._finish(sent_at, "shed", None)
            return
        self.in_flight += 1
        self.metrics.in_flight.set(self.in_flight)
        url = f"http://{endpoint}/v2/models/{self.model}/infer"
        try:
            async with session.post(url, data=infer_body(self.rng)) as response:
                await response.read()
                outcome = outcome_of(response.status)
        except TimeoutError:
            outcome = "timeout"
        except aiohttp.ClientError:
            outcome = "error"
        finally:
            self.in_flight -= 1
            self.metrics.in_flight.set(self.in_flight)
        latency = self.clock() - sent_at
        self._finish(sent_at, outcome, latency if outcome == "ok" else None)

    def _finish(self, sent_at: float, outcome: str, latency: float | None) -> None:
        self.log.record(sent_at, outcome, latency)
        self.metrics.requests.labels(outcome).inc()
        if latency is not None:
            self.metrics.latency.observe(latency)
