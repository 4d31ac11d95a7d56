"""Load generator and rate profiles: the pure parts, with seeded randomness and given times."""

from __future__ import annotations

import itertools
import random
import threading
import time
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from autoglm.config import ConfigError
from autoglm.datasets import expected_path, fetch_hint
from autoglm.web.exchange import Request, Response
from autoglm.web.server import HTTPServer
from batcher.oip import parse_infer_request
from stack.config import UpConfig
from stack.data import derive
from stack.loadgen import (
    Arrivals,
    LoadGenerator,
    LoadGenMetrics,
    RequestLog,
    RoundRobin,
    infer_body,
    outcome_of,
    percentile,
)
from stack.model import factory
from stack.profiles import (
    RAMP_SHAPE,
    ShapeProfile,
    TraceProfile,
    profile_from_config,
    read_trace,
)
from stack.report import summarize, summary_lines

REPO = Path(__file__).resolve().parents[2]
TRACE = expected_path("genai-requests")


def test_arrivals_follow_a_changing_rate() -> None:
    profile = ShapeProfile("step", base_rps=5.0, peak_rps=50.0, day_seconds=100.0)
    arrivals = Arrivals(profile, random.Random(7))
    times, t = [], 0.0
    while t < 1000.0:  # ten compressed days
        t = arrivals.next_after(t)
        times.append(t)
    # the step holds its peak for 20..50 % of each day: 10 days x 30 s at 50/s, 70 s at 5/s
    high = sum(1 for x in times if x < 1000 and 20 <= x % 100 < 50)
    low = sum(1 for x in times if x < 1000 and not 20 <= x % 100 < 50)
    assert high == pytest.approx(10 * 30 * 50, rel=0.05)
    assert low == pytest.approx(10 * 70 * 5, rel=0.08)
    assert times == sorted(times)


def test_round_robin_takes_turns_and_follows_changes() -> None:
    router = RoundRobin()
    assert router.pick() is None
    router.set(["a", "b", "c"])
    assert [router.pick() for _ in range(6)] == ["a", "b", "c", "a", "b", "c"]
    router.set(["a", "b"])
    assert {router.pick() for _ in range(4)} == {"a", "b"}


def test_request_log_window_and_totals() -> None:
    log = RequestLog(slo_seconds=0.25, keep_seconds=60)
    for i in range(100):
        log.record(float(i) / 10, "ok", 0.01 * (i + 1))  # latencies 0.01 .. 1.0
    log.record(9.95, "shed", None)
    log.record(9.96, "no_worker", None)
    stats = log.window(now=10.0, seconds=5.0)  # sent in (5, 10]: i = 51..99 and the 2 misses
    assert stats.sent == 51 and stats.ok == 49
    assert stats.within_slo == 0  # all of those took 0.52 s or more
    assert stats.p99_seconds == pytest.approx(1.0)
    assert stats.rate_rps == pytest.approx(51 / 5)
    assert log.totals.sent == 102
    assert log.totals.within_slo == 25
    assert log.totals.attainment == pytest.approx(25 / 102)
    assert log.totals.by_outcome["shed"] == 1 and log.totals.by_outcome["no_worker"] == 1


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 0.99) is None
    assert percentile([1.0], 0.99) == 1.0
    assert percentile([float(i) for i in range(1, 101)], 0.99) == 99.0


def test_request_body_is_valid_kserve_v2_for_the_worker_model() -> None:
    model = factory()
    request = parse_infer_request(
        infer_body(random.Random(1)), None, model.input_specs, model.output_specs
    )
    assert request.size == 1
    (result,) = model([request.inputs])
    assert result.shape == (1, 4)


def test_trace_profile_compresses_a_day_and_peaks_at_peak_rps() -> None:
    times, counts = read_trace(None)
    assert len(times) == 4 * 96 and max(counts) > 0
    day = 240.0
    profile = TraceProfile(times, counts, peak_rps=100.0, day_seconds=day, start_seconds=0.0)
    # one wall-clock day later the profile is one trace day later: bin 96 (same time, next day)
    assert profile.rate(day) == pytest.approx(100.0 * counts[96] / max(counts))
    rates = [profile.rate(t) for t in range(0, 4 * 240)]
    assert max(rates) == pytest.approx(100.0, rel=0.02) and min(rates) >= 0.0
    # the trace loops after four days
    assert profile.rate(4 * day + 10) == pytest.approx(profile.rate(10))


def test_shape_profiles() -> None:
    diurnal = ShapeProfile("diurnal", 10.0, 90.0, day_seconds=24.0)
    assert diurnal.rate(14.0) == pytest.approx(90.0)  # 14:00 on a 24 s day
    assert diurnal.rate(2.0) == pytest.approx(10.0)
    spike = ShapeProfile("spike", 1.0, 50.0, day_seconds=100.0)
    assert [spike.rate(t) for t in (10, 46, 49, 51)] == [1.0, 50.0, 50.0, 1.0]


def test_ramp_day_is_quiet_then_rises_holds_falls_and_is_quiet_again() -> None:
    ramp = ShapeProfile("ramp", 20.0, 100.0, day_seconds=100.0)
    rates = [ramp.rate(t) for t in range(100)]
    rise, top, fall, bottom = (round(100 * x) for x in RAMP_SHAPE)
    assert set(rates[:rise]) == {20.0} and set(rates[bottom:]) == {20.0}
    assert set(rates[top:fall]) == {100.0}
    assert rates[rise : top + 1] == sorted(rates[rise : top + 1])  # a rise, not a jump
    assert rates[fall : bottom + 1] == sorted(rates[fall : bottom + 1], reverse=True)
    assert len(set(rates[rise + 1 : top])) == top - rise - 1
    assert ramp.rate(100.0 + 50.0) == ramp.rate(50.0)  # every day the same
    # The default stack plays it so the rise, the peak and the fall come within two minutes.
    default = profile_from_config(UpConfig())
    assert default.name == "ramp"
    assert default.rate(30.0) == UpConfig().base_rps
    assert max(default.rate(float(t)) for t in range(40, 100)) == UpConfig().peak_rps
    assert default.rate(110.0) == UpConfig().base_rps


def test_bad_trace_files_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "t.csv"
    for text, words in [
        ("time,count\n0,1\n", "header"),
        ("offset_seconds,requests\n0,1\n0,2\n", "increase"),
        ("offset_seconds,requests\n0,x\n", "two numbers"),
        ("offset_seconds,requests\n0,0\n10,0\n", "some requests"),
    ]:
        bad.write_text(text)
        with pytest.raises(ConfigError, match=words):
            profile_from_config(UpConfig(profile="trace", trace_file=str(bad)))
    with pytest.raises(ConfigError, match=r"missing\.csv does not exist, and no trace or excerpt"):
        read_trace(tmp_path / "missing.csv")


@pytest.mark.skipif(
    not TRACE.is_file(), reason=f"needs the whole trace: {fetch_hint('genai-requests')}"
)
def test_shipped_excerpt_is_derived_from_the_trace() -> None:
    shipped = (REPO / "stack/data/genai_requests_15min.csv").read_text()
    assert derive.derive(TRACE) == shipped


def test_a_starved_generator_says_how_late_its_requests_left(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Its clock jumps 2 s ahead, as when the thread got no CPU for 2 s: the arrivals due meanwhile
    go at once, the lag is exported and logged once, and the summary's figure holds it."""
    jump = [0.0]
    generator = LoadGenerator(
        ShapeProfile("step", base_rps=50.0, peak_rps=50.0, day_seconds=100.0),
        "reference",
        RequestLog(0.25),
        LoadGenMetrics(registry := CollectorRegistry(), 0.25),
        clock=lambda: time.monotonic() + jump[0],
    )
    generator.start()  # no endpoints: every request is answered "no_worker", no sockets
    try:
        time.sleep(0.3)
        jump[0] = 2.0
        time.sleep(0.3)
    finally:
        generator.stop()
    assert generator.max_behind_seconds == pytest.approx(2.0, abs=0.3)
    assert generator.log.totals.by_outcome["no_worker"] >= 100  # the 2 s of arrivals went
    exported = registry.get_sample_value("autoglm_loadgen_behind_seconds")
    assert exported is not None and 0 <= exported < generator.max_behind_seconds
    warnings = [r for r in caplog.records if "behind its schedule" in r.getMessage()]
    assert len(warnings) == 1


def test_a_429_is_a_rejection_and_other_failed_answers_are_errors() -> None:
    assert outcome_of(200) == "ok"
    assert outcome_of(429) == "rejected"  # refused at admission, as the batcher counts it
    assert [outcome_of(status) for status in (400, 500, 502, 503, 504)] == ["error"] * 5


def test_rejections_are_counted_apart_from_errors_up_to_the_summary() -> None:
    """Against a worker that answers, refuses at admission (429) and fails (500) in turn, the
    metric and the run's totals keep the three apart, and the summary line names each."""
    answers = itertools.cycle([200, 429, 429, 500])
    lock = threading.Lock()

    def infer(request: Request) -> Response:
        with lock:
            status = next(answers)
        if status == 429:
            body = {"error": "queue full; retry later"}
            return Response.json(body, 429).with_header("Retry-After", "1")
        return Response.json({"outputs": []} if status == 200 else {"error": "boom"}, status)

    worker = HTTPServer(
        "127.0.0.1:0", {"POST /v2/models/reference/infer": infer}, component="fake-worker"
    )
    worker.start()
    registry = CollectorRegistry()
    generator = LoadGenerator(
        ShapeProfile("step", base_rps=40.0, peak_rps=40.0, day_seconds=100.0),
        "reference",
        RequestLog(0.25),
        LoadGenMetrics(registry, 0.25),
        seed=3,
    )
    generator.set_endpoints([f"127.0.0.1:{worker.port}"])
    generator.start()
    try:
        deadline = time.monotonic() + 30
        while generator.log.totals.sent < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        generator.stop()
        worker.stop()
    totals = generator.log.totals
    counts = {o: registry.get_sample_value("autoglm_loadgen_requests_total", {"outcome": o})
              for o in ("ok", "rejected", "error", "timeout", "shed", "no_worker")}  # fmt: skip
    assert counts == {o: float(n) for o, n in totals.by_outcome.items()}
    ok, rejected, error = (totals.by_outcome[o] for o in ("ok", "rejected", "error"))
    assert ok + rejected + error == totals.sent >= 20
    # the worker's answers went 200, 429, 429, 500 in turn, over every request sent
    assert rejected == pytest.approx(2 * ok, abs=2) and error == pytest.approx(ok, abs=1)
    assert totals.within_slo <= ok
    summary = summarize([], [], totals, 0.25, 0.7, 0.2, None, "utilization", 0.0)
    line = summary_lines(summary)[0]
    assert f"{totals.sent} sent, {ok} answered ({rejected} rejected, {error} error)" in line
