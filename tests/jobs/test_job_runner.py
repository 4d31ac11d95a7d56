"""The job runner against the real batcher over HTTP (and a scripted endpoint for 5xx/401)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry

from autoglm.config import ConfigError
from autoglm.webconfig import WebConfig
from jobs import JobConfig, run_job
from jobs.pacing import RatePacer
from tests.jobs.conftest import (
    MALFORMED,
    assert_answers_match,
    expected_logits,
    records,
    write_requests,
)
from tests.selfsigned import ScratchCA
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(180)


def job(tmp_path: Path, endpoint: str, **settings: object) -> JobConfig:
    settings.setdefault("input", str(tmp_path / "in.jsonl"))
    settings.setdefault("model", "demo")
    settings.setdefault("output", str(tmp_path / "out.jsonl"))
    settings.setdefault("progress", "off")
    return JobConfig(endpoint=endpoint, **settings)


def sample(registry: CollectorRegistry, name: str, **labels: str) -> float:
    value = registry.get_sample_value(name, {"job_name": "in", **labels})
    assert value is not None, name
    return value


def batcher_metric(url: str, line_start: str) -> float:
    text = requests.get(f"{url}/metrics", timeout=10).text
    lines = [line for line in text.splitlines() if line.startswith(line_start)]
    assert len(lines) == 1, (line_start, lines)
    return float(lines[0].rsplit(" ", 1)[1])


def test_every_line_is_answered_once_in_input_order_as_best_effort(tmp_path, batcher) -> None:
    source = write_requests(tmp_path / "in.jsonl", 120)
    server = batcher()
    registry = CollectorRegistry()
    summary = run_job(job(tmp_path, server.url, max_concurrency=16), registry=registry)

    out = records(tmp_path / "out.jsonl")
    expected = expected_logits(source)
    assert [r["line"] for r in out] == sorted(expected)  # input order, none missing or twice
    assert [r["id"] for r in out] == [f"r{n}" for n in sorted(expected)]
    assert_answers_match(out, expected)
    errors = records(tmp_path / "out.errors.jsonl")
    assert [(e["line"], e["reason"]) for e in errors] == [(5, "malformed"), (9, "malformed")]
    assert errors[1]["id"] == "no-inputs" and "inputs" in errors[1]["error"]
    assert (summary.ok, summary.invalid, summary.remaining, summary.exit_code) == (118, 2, 0, 1)
    # The batcher saw every request as best-effort, none as online.
    prefix = 'autoglm_batcher_class_requests_total{class="%s",model="demo",outcome="ok"}'
    assert batcher_metric(server.url, prefix % "best_effort") == 118
    assert batcher_metric(server.url, prefix % "online") == 0
    assert sample(registry, "autoglm_job_lines_total", outcome="ok") == 118
    assert sample(registry, "autoglm_job_lines_total", outcome="invalid") == 2
    assert sample(registry, "autoglm_job_lines_remaining") == 0
    assert sample(registry, "autoglm_job_lines_in_shard") == 120


def test_a_rate_capped_job_paces_every_send_and_still_answers_every_line_once(
    tmp_path, batcher, monkeypatch
) -> None:
    """The cap only delays sends: nothing is skipped, sent twice or reordered."""
    waits: list[float] = []
    reserve = RatePacer.reserve

    def recorded(pacer: RatePacer, now: float) -> float:
        waits.append(reserve(pacer, now))
        return waits[-1]

    monkeypatch.setattr(RatePacer, "reserve", recorded)
    source = write_requests(tmp_path / "in.jsonl", 20, malformed={})
    server = batcher()
    config = job(tmp_path, server.url, max_rate=50.0, initial_concurrency=8, max_concurrency=8)
    summary = run_job(config)
    out = records(tmp_path / "out.jsonl")
    assert [r["line"] for r in out] == list(range(1, 21))
    assert_answers_match(out, expected_logits(source))
    assert (summary.ok, summary.remaining) == (20, 0)
    # One reservation a send (none was refused, so one a line); of the eight lines sent at
    # the start, all but the first are held back.
    assert len(waits) == 20 and any(w > 0 for w in waits)


def test_a_stop_while_sends_are_held_back_sends_nothing_more(tmp_path, batcher) -> None:
    """At one request every 30 s, four lines go out at 0, 30, 60 and 90 s. A stop after the
    first answer must end the job at once, with the three held back never sent, however long
    the drain would wait for requests in flight."""
    write_requests(tmp_path / "in.jsonl", 4, malformed={})
    server = batcher()
    registry = CollectorRegistry()
    stop = threading.Event()
    config = job(tmp_path, server.url, max_rate=1 / 30, initial_concurrency=4, drain_seconds=300.0)
    result: list[object] = []
    runner = threading.Thread(
        target=lambda: result.append(run_job(config, stop=stop, registry=registry))
    )
    runner.start()
    try:
        wait_until(
            lambda: registry.get_sample_value(
                "autoglm_job_lines_total", {"job_name": "in", "outcome": "ok"}
            ),
            timeout=60,
            what="the job's first answer",
        )
    finally:
        stop.set()
        runner.join(timeout=120)
    assert not runner.is_alive(), "the job kept waiting after the stop"
    (summary,) = result
    assert (summary.ok, summary.remaining, summary.exit_code) == (1, 3, 3)
    sent = 'autoglm_batcher_class_requests_total{class="best_effort",model="demo",outcome="ok"}'
    assert batcher_metric(server.url, sent) == 1


def test_completion_order_keys_each_answer_by_line_and_id(tmp_path, batcher) -> None:
    source = write_requests(tmp_path / "in.jsonl", 60, malformed={})
    server = batcher()
    summary = run_job(job(tmp_path, server.url, order="completion", max_concurrency=16))
    out = records(tmp_path / "out.jsonl")
    assert sorted(r["line"] for r in out) == list(range(1, 61))
    assert all(r["id"] == f"r{r['line']}" for r in out)
    assert_answers_match(out, expected_logits(source))
    assert summary.exit_code == 0 and not records(tmp_path / "out.errors.jsonl")


def test_refused_best_effort_requests_make_the_job_back_off_and_retry(tmp_path, batcher) -> None:
    # A best-effort queue of one item: most of 16 concurrent requests are refused (429).
    write_requests(tmp_path / "in.jsonl", 80, malformed={})
    server = batcher(best_effort_max_queue=1)
    registry = CollectorRegistry()
    config = job(tmp_path, server.url, initial_concurrency=16, max_concurrency=16)
    summary = run_job(config, registry=registry)

    assert summary.exit_code == 0
    assert sorted(r["line"] for r in records(tmp_path / "out.jsonl")) == list(range(1, 81))
    refused = batcher_metric(
        server.url, 'autoglm_batcher_best_effort_refusals_total{model="demo",reason="queue_full"}'
    )
    assert refused > 0 and summary.refusals == refused
    assert sample(registry, "autoglm_job_refusals_total") == refused
    assert sample(registry, "autoglm_job_concurrency") < 16  # halved, not yet grown back


def test_retry_after_is_honoured_for_each_refused_request(tmp_path, scripted) -> None:
    endpoint = scripted(
        lambda body, attempt: (429, {"Retry-After": "0.3"}) if attempt == 1 else (200, {})
    )
    write_requests(tmp_path / "in.jsonl", 12, malformed={})
    summary = run_job(job(tmp_path, endpoint.url, model="fake", initial_concurrency=4))
    assert summary.exit_code == 0 and summary.refusals == 12
    assert len(endpoint.attempts) == 12
    for times in endpoint.attempts.values():
        assert len(times) == 2 and times[1] - times[0] >= 0.3
    assert endpoint.max_in_flight <= 4
    assert all(r["outputs"][0]["data"] == [2] for r in records(tmp_path / "out.jsonl"))


def probed_job(tmp_path: Path, scripted, probe_interval: float) -> dict[str, list[float]]:
    """A job whose first four lines are refused with a long Retry-After and every other
    request answered; the endpoint's attempt times per line id."""
    endpoint = scripted(
        lambda body, attempt: (
            (429, {"Retry-After": "3"}) if attempt == 1 and body["id"] <= "r4" else (200, {})
        )
    )
    write_requests(tmp_path / "in.jsonl", 9, malformed={})
    config = job(
        tmp_path,
        endpoint.url,
        model="fake",
        initial_concurrency=4,
        probe_interval_seconds=probe_interval,
    )
    summary = run_job(config)
    assert summary.exit_code == 0 and summary.refusals == 4 and summary.ok == 9
    return endpoint.attempts


def test_a_job_parked_on_retry_after_probes_for_capacity_elsewhere(tmp_path, scripted) -> None:
    # Every request in flight waits out a refusal: one more line goes out (a probe), is
    # answered, and the rest of the file follows before the refused lines come back.
    attempts = probed_job(tmp_path, scripted, probe_interval=0.2)
    retried = min(attempts[f"r{line}"][1] for line in range(1, 5))
    assert all(attempts[f"r{line}"][0] < retried for line in range(5, 10))
    # with probes off, nothing goes out until the Retry-After has passed
    (tmp_path / "off").mkdir()
    attempts = probed_job(tmp_path / "off", scripted, probe_interval=0)
    retried = min(attempts[f"r{line}"][1] for line in range(1, 5))
    assert attempts["r5"][0] >= retried


def test_bad_requests_and_failing_lines_go_to_the_errors_file(tmp_path, scripted) -> None:
    def decide(body: dict, attempt: int) -> tuple[int, dict[str, str]]:
        if body["id"] == "r2":
            return 400, {}
        if body["id"] == "r3":
            return 500, {}
        if body["id"] == "r4" and attempt == 1:
            return 502, {}  # a transient failure: tried again
        return 200, {}

    endpoint = scripted(decide)
    write_requests(tmp_path / "in.jsonl", 6, malformed={})
    summary = run_job(job(tmp_path, endpoint.url, model="fake", max_server_errors=2))
    errors = {e["line"]: e for e in records(tmp_path / "out.errors.jsonl")}
    assert sorted(errors) == [2, 3]
    assert errors[2]["reason"] == "rejected" and errors[2]["status"] == 400
    assert errors[3]["reason"] == "server_error" and errors[3]["status"] == 500
    assert len(endpoint.attempts["r3"]) == 2 and len(endpoint.attempts["r4"]) == 2
    assert [r["line"] for r in records(tmp_path / "out.jsonl")] == [1, 4, 5, 6]
    assert summary.exit_code == 1


def test_an_endpoint_that_keeps_failing_stops_the_job_resumably(tmp_path, scripted) -> None:
    endpoint = scripted(lambda body, attempt: (502, {}))
    write_requests(tmp_path / "in.jsonl", 3, malformed={})
    config = job(tmp_path, endpoint.url, model="fake", patience_seconds=0.5, max_server_errors=99)
    summary = run_job(config)
    assert summary.exit_code == 3 and summary.stopped == "endpoint failing"
    assert summary.remaining == 3 and not records(tmp_path / "out.jsonl")


def test_refused_credentials_are_a_setting_error_before_any_line(tmp_path, scripted) -> None:
    endpoint = scripted(lambda body, attempt: (200, {}), metadata_status=401)
    write_requests(tmp_path / "in.jsonl", 3, malformed={})
    with pytest.raises(ConfigError, match="refused the credentials"):
        run_job(job(tmp_path, endpoint.url, model="fake"))
    assert not endpoint.attempts


def test_an_unknown_default_model_is_a_setting_error(tmp_path, batcher) -> None:
    write_requests(tmp_path / "in.jsonl", 3, malformed={})
    with pytest.raises(ConfigError, match="--model 'nope' is not served"):
        run_job(job(tmp_path, batcher().url, model="nope"))


def test_shards_split_the_file_and_keep_their_own_files(tmp_path, batcher) -> None:
    source = write_requests(tmp_path / "in.jsonl", 50, malformed={})
    server = batcher()
    for index in range(3):
        summary = run_job(job(tmp_path, server.url, shard_index=index, shard_count=3))
        assert summary.total == len(range(index, 50, 3)) and summary.exit_code == 0
    seen = []
    for index in range(3):
        out = records(tmp_path / f"out-{index:05d}-of-00003.jsonl")
        assert all((r["line"] - 1) % 3 == index for r in out)
        assert (tmp_path / f"out-{index:05d}-of-00003.jsonl.journal").exists()
        seen += [r["line"] for r in out]
    assert sorted(seen) == list(range(1, 51))
    assert_answers_match(records(tmp_path / "out-00001-of-00003.jsonl"), expected_logits(source))


def test_tls_and_basic_auth_toward_the_batcher(tmp_path, batcher) -> None:
    ca = ScratchCA(tmp_path)
    cert = ca.server()
    client = ca.client("job-client", "job.example")
    web = tmp_path / "web.yml"
    web.write_text(
        yaml.safe_dump(
            {
                "tls_server_config": {
                    "cert_file": str(cert.cert),
                    "key_file": str(cert.key),
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": str(ca.cert_file),
                },
                "basic_auth_users": {"job": bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()},
            }
        )
    )
    server = batcher(web_config=WebConfig.load(web))
    url = f"https://127.0.0.1:{server.server.port}"
    write_requests(tmp_path / "in.jsonl", 10, malformed={})
    password = tmp_path / "password"
    password.write_text("pw\n")
    tls = {"ca_file": str(ca.cert_file), "cert_file": str(client.cert), "key_file": str(client.key)}
    summary = run_job(job(tmp_path, url, username="job", password_file=str(password), **tls))
    assert summary.exit_code == 0 and len(records(tmp_path / "out.jsonl")) == 10

    password.write_text("wrong\n")
    with pytest.raises(ConfigError, match="refused the credentials"):
        run_job(
            job(
                tmp_path,
                url,
                output=str(tmp_path / "other.jsonl"),
                username="job",
                password_file=str(password),
                **tls,
            )
        )
    with pytest.raises(ConfigError, match="TLS with --endpoint"):
        run_job(job(tmp_path, url, output=str(tmp_path / "third.jsonl")))


def test_a_finished_job_run_again_sends_nothing(tmp_path, scripted) -> None:
    endpoint = scripted(lambda body, attempt: (200, {}))
    write_requests(tmp_path / "in.jsonl", 10)
    first = run_job(job(tmp_path, endpoint.url, model="fake"))
    again = run_job(job(tmp_path, endpoint.url, model="fake"))
    assert first.exit_code == again.exit_code == 1  # the malformed lines stay reported
    assert again.invalid_before == len(MALFORMED) and again.ok == 0 and again.done == 10
    assert all(len(times) == 1 for times in endpoint.attempts.values())
    assert len(records(tmp_path / "out.jsonl")) == 10 - len(MALFORMED)
    lenient = run_job(job(tmp_path, endpoint.url, model="fake", fail_on_invalid=False))
    assert lenient.exit_code == 0 and lenient.invalid_before == len(MALFORMED)
    header = json.loads((tmp_path / "out.jsonl.journal").read_text().splitlines()[0])
    assert header == {"journal": 1, "shard_index": 0, "shard_count": 1, "order": "input"}


def test_the_terminal_bar_shows_lines_rate_and_refusals(tmp_path, scripted, capsys) -> None:
    endpoint = scripted(
        lambda body, attempt: (429, {"Retry-After": "0"}) if attempt == 1 else (200, {})
    )
    write_requests(tmp_path / "in.jsonl", 30, malformed={})
    summary = run_job(job(tmp_path, endpoint.url, model="fake"), progress="bar")
    assert summary.exit_code == 0
    err = capsys.readouterr().err
    assert "30/30" in err and "lines/s" in err and "refused 30" in err
