"""``autoglm up`` end to end: the real stack in a subprocess, its summary, report and shutdown.

One run replays a step profile (a plateau of high load in the middle of a one-minute "day") so
the autoscaler must scale up and, once the load falls and the stabilization window passes, back
down; it scales through the real Prometheus the stack starts, and the best-effort job fills the
idle time. One runs the default profile, which must show a scale event and a forecast. One is
stopped with Ctrl-C (SIGINT) as soon as it reads online work. Each must leave no process behind:
every worker's pid (from the structured logs) must be gone once ``autoglm up`` has exited.

The runs that wait for events do not run for a fixed time: on a busy machine every part runs
late (worker starts, scrapes, decisions, the job's first answers), so a run of fixed length can
end before the stack got to scale. They run with a generous ``--duration`` (several compressed
days, each with its peak) and are stopped with Ctrl-C as soon as their log shows what the test
asserts on; the assertions are then made on the summary and report, which a stack that no
longer scales or runs no best-effort work still fails, at the deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from stack.cli import main
from tests.waiting import wait_until

REPO = Path(__file__).resolve().parents[2]
# Seconds ``autoglm up`` may take to stop and write its report after Ctrl-C or its duration.
STOP_SECONDS = 180
VIEW_LOGGER = "autoglm.up"  # stack.view.LogView: the status and scaled lines scripts read


def up_command(report_dir: Path, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "autoglm.cli",
        "up",
        "--no-tui",
        "--port-base",
        "0",
        "--report-dir",
        str(report_dir),
        "--max-workers",
        "3",
        *extra,
    ]


def worker_pids(stderr: str) -> list[int]:
    return [int(r["pid"]) for r in log_records(stderr) if r.get("msg") == "worker started"]


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie has exited: it only waits to be reaped)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def log_records(text: str) -> list[dict]:
    """The structured log lines of ``text`` (a worker's plain output lines are skipped)."""
    records = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict):
                records.append(record)
    return records


def scaled(records: list[dict]) -> list[str]:
    """Directions of the stack's ``scaled`` events logged so far, in order (the reconciler
    logs its own ``scaled`` line too, without a direction)."""
    return [
        r["direction"]
        for r in records
        if r.get("msg") == "scaled" and r.get("logger") == VIEW_LOGGER
    ]


def statuses(records: list[dict]) -> list[dict]:
    """The stack's ``status`` lines logged so far (on a change of phase, else every 10 s)."""
    return [r for r in records if r.get("msg") == "status" and r.get("logger") == VIEW_LOGGER]


@dataclass(frozen=True)
class UpRun:
    returncode: int
    stdout: str
    stderr: str


def run_up_until(command: list[str], log_path: Path, seen: Callable[[list[dict]], bool]) -> UpRun:
    """Run ``autoglm up`` (with a ``--duration`` as its deadline) until its log shows what
    ``seen`` looks for, then stop it with Ctrl-C; or until the duration ends it by itself."""
    with open(log_path, "w") as stderr:
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=stderr, text=True)
        try:
            while proc.poll() is None:
                if seen(log_records(log_path.read_text())):
                    proc.send_signal(signal.SIGINT)
                    break
                time.sleep(0.5)
            out, _ = proc.communicate(timeout=STOP_SECONDS)
        finally:
            if proc.poll() is None:
                kill_tree(proc)
    return UpRun(proc.returncode, out, log_path.read_text())


def online_work_seen(stderr: str) -> bool:
    """Whether a status line has read the workers' online work."""
    return any(s.get("online_work_pct") is not None for s in statuses(log_records(stderr)))


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            stat = (entry / "stat").read_text()
            if int(stat[stat.rindex(")") + 2 :].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def descendants_of(pid: int) -> list[int]:
    """Every process below ``pid``, children first: the stack's Prometheus runs in a session of
    its own, so killing ``autoglm up`` alone would leave it (and the batchers) running."""
    found = []
    for child in children_of(pid):
        found += [child, *descendants_of(child)]
    return found


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL ``proc`` and everything it started (a test that gives up on a run must not leave
    its stack behind)."""
    below = descendants_of(proc.pid)
    proc.kill()
    for pid in below:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    proc.wait()


def scraping_each_endpoint_once(
    scraped: dict[str, str], seen: Callable[[list[dict]], bool]
) -> Callable[[list[dict]], bool]:
    """``seen``, which also fetches the /metrics of each HTTP endpoint the log says serves
    (twice: the second fetch finds the first counted), into ``scraped`` by server name."""

    def check(records: list[dict]) -> bool:
        for record in records:
            server = record.get("server")
            if record.get("msg") == "serving HTTP" and server not in scraped:
                url = f"http://{record['listen']}/metrics"
                with contextlib.suppress(requests.RequestException):
                    requests.get(url, timeout=10)
                    scraped[server] = requests.get(url, timeout=10).text
        return seen(records)

    return check


def up_then_down_and_best_effort_done(records: list[dict]) -> bool:
    """What the step run asserts on has happened: a scale-up, a scale-down after it, and
    best-effort job lines answered."""
    directions = scaled(records)
    return (
        "up" in directions
        and "down" in directions[directions.index("up") :]
        and any((s.get("best_effort_done") or 0) > 0 for s in statuses(records))
    )


@pytest.mark.timeout(600)
def test_up_scales_up_and_down_and_reports(tmp_path: Path) -> None:
    report_dir = tmp_path / "report"
    scraped: dict[str, str] = {}
    run = run_up_until(
        up_command(
            report_dir,
            "--duration",
            "240",  # the deadline: four compressed days, each with its peak
            "--profile",
            "step",
            "--time-compression",
            "1440",  # one day = 60 s: base load, 12..30 s at the peak, base again
            "--peak-rps",
            "80",
            "--base-rps",
            "4",
            "--target-utilization",
            "0.5",
            "--scale-down-stabilization",
            "10",
            # The HPA rule alone: a forecast's upper bound, wide after a step, would rightly hold
            # the workers longer than this short run (the default-profile test covers it).
            "--no-prediction",
        ),
        tmp_path / "stderr.log",
        scraping_each_endpoint_once(scraped, up_then_down_and_best_effort_done),
    )
    assert run.returncode == 0, run.stderr[-3000:]
    # Every endpoint says which build runs; the one autoscaler acts without an election.
    assert set(scraped) >= {"autoglm-exporter", "autoglm-predictor", "autoglm-autoscaler"}
    for server, text in scraped.items():
        assert "autoglm_build_info{" in text and "process_start_time_seconds" in text, server
        if server != "autoglm-exporter":  # it serves the snapshot of its last collection
            assert 'autoglm_http_requests_total{code="200",path="/metrics"}' in text, server
    assert "autoglm_autoscaler_leader 1.0" in scraped["autoglm-autoscaler"]
    out = run.stdout
    for field in ("SLO attainment", "GPU-seconds", "busy", "best-effort work", "scale events"):
        assert field in out, out
    report = Path(re.search(r"report\s+(\S+report\.html)", out).group(1))
    assert report.is_file() and "data:image/png;base64," in report.read_text()

    summary = json.loads((report_dir / "summary.json").read_text())
    directions = [e["direction"] for e in summary["scale_events"]]
    assert "up" in directions and "down" in directions[directions.index("up") :], directions
    assert summary["peak_workers"] >= 2
    assert summary["requests_sent"] > 500 and summary["requests_ok"] > 0
    assert 0 < summary["slo_attainment"] <= 1
    # At least one worker the whole time, and more than one for a while.
    assert all(s["workers"] >= 1 for s in summary["samples"])
    assert summary["gpu_seconds"] > summary["duration_seconds"]
    assert f"{summary['scale_ups']} up, {summary['scale_downs']} down" in out
    # The scaling read the local Prometheus, with the GPUAutoscaler's PromQL on online work.
    assert "the autoscaler and the predictor read Prometheus at" in run.stderr
    # Each move is the metric's, or a limit on the metric's move: a behavior policy (the HPA's
    # scale-down rate limit can cut a large scale-down into steps), the scale-down stabilization
    # window (a step down to the highest recommendation still inside the window) or the replica
    # bounds (a scale-up the metric asks past --max-workers is capped there).
    drivers = [e["driver"] for e in summary["scale_events"]]
    limits = ("metric:online_busy/", "policy:", "stabilization", "max_replicas", "min_replicas")
    assert all(d.startswith(limits) for d in drivers), drivers
    assert any(d.startswith("metric:online_busy/") for d in drivers), drivers
    config = (report_dir / "prometheus" / "prometheus.yml").read_text()
    assert "autoglm-batcher" in config and "autoglm-job" in config
    # The best-effort job ran through the job runner and its answers are in the run's folder.
    assert summary["best_effort_done"] > 0 and summary["best_effort_busy_share"] > 0
    answered = sum(
        len(p.read_text().splitlines()) for p in (report_dir / "job").glob("answers-*.jsonl")
    )
    assert answered >= summary["best_effort_done"]
    assert 0 < summary["online_busy_share"] < summary["busy_share"] <= 1.0
    assert f"{summary['best_effort_done']} job requests answered" in out
    # the simulated-GPU notice is printed once
    assert run.stderr.count("simulating 3 NVIDIA") == 1  # logged once, not printed again

    pids = worker_pids(run.stderr)
    assert len(pids) >= 2
    assert [p for p in pids if alive(p)] == []


def scaled_forecast_and_best_effort_done(records: list[dict]) -> bool:
    """What the default run asserts on has happened: a scale event, a forecast and
    best-effort job lines answered."""
    return (
        bool(scaled(records))
        and any((s.get("best_effort_done") or 0) > 0 for s in statuses(records))
        and any(s.get("forecast_upper") is not None for s in statuses(records))
    )


@pytest.mark.timeout(720)
def test_the_default_profile_scales_and_forecasts(tmp_path: Path) -> None:
    report_dir = tmp_path / "report"
    run = run_up_until(
        # The deadline: two default days of 180 s, each ramping to its peak 72..83 s into it.
        up_command(report_dir, "--duration", "360", "--max-workers", "4"),
        tmp_path / "stderr.log",
        scaled_forecast_and_best_effort_done,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.loads((report_dir / "summary.json").read_text())
    assert summary["scale_ups"] + summary["scale_downs"] >= 1, summary["scale_events"]
    assert summary["best_effort_done"] > 0
    # The predictor pulled the online work from Prometheus and forecast it within the run.
    assert any(s["forecast_upper"] is not None for s in summary["samples"])
    assert [p for p in worker_pids(run.stderr) if alive(p)] == []


def slo_decided_after_20_s(records: list[dict]) -> bool:
    """What the SLO-sizing run asserts on has happened: samples past 20 s (about one a second,
    fewer on a busy machine; status lines come every 10 s or on a change) and a decision sized
    from the service model."""
    past_20_s = any(s["elapsed_s"] > 20 for s in statuses(records))
    return past_20_s and "slo" in decision_drivers(records)


def decision_drivers(records: list[dict]) -> set[str]:
    return {
        r["driver"] for r in records if r.get("msg") in ("decision", "scaled") and "driver" in r
    }


@pytest.mark.timeout(600)
def test_slo_sizing_decides_from_the_batchers_measured_cost(tmp_path: Path) -> None:
    report_dir = tmp_path / "report"
    run = run_up_until(
        up_command(
            report_dir,
            "--duration",
            "240",  # the deadline
            "--sizing",
            "slo",
            "--profile",
            "step",
            "--time-compression",
            "1440",
            "--peak-rps",
            "80",
            "--no-job",
        ),
        tmp_path / "stderr.log",
        slo_decided_after_20_s,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    drivers = decision_drivers(log_records(run.stderr))
    assert "slo" in drivers, drivers  # sized from the service model, not the fallback rule
    summary = json.loads((report_dir / "summary.json").read_text())
    assert summary["sizing"] == "slo" and summary["samples"][-1]["elapsed"] > 20
    assert "sized for the p99 within 0.25 s" in run.stdout


@pytest.mark.timeout(420)
def test_ctrl_c_stops_everything_cleanly(tmp_path: Path) -> None:
    """Also the fallback without Prometheus: the autoscaler reads the embedded window."""
    report_dir = tmp_path / "report"
    log_path = tmp_path / "stderr.log"
    command = up_command(report_dir, "--profile", "diurnal", "--peak-rps", "20", "--no-job")
    with open(log_path, "w") as stderr:
        proc = subprocess.Popen(
            [*command, "--no-prometheus"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
        try:

            def reading_online_work() -> bool:
                if online_work_seen(log_path.read_text()):
                    return True
                assert proc.poll() is None, log_path.read_text()[-3000:]
                return False

            wait_until(
                reading_online_work,
                timeout=180,
                what="the stack to start and read online work",
                interval=0.5,
            )
            workers = children_of(proc.pid)
            assert workers, "a worker process should be running"
            proc.send_signal(signal.SIGINT)
            out, _ = proc.communicate(timeout=180)
        finally:
            if proc.poll() is None:
                kill_tree(proc)
    assert proc.returncode == 0, log_path.read_text()[-3000:]
    assert "summary after" in out and (report_dir / "report.html").is_file()
    assert "--no-prometheus: the autoscaler reads an embedded metrics window" in (
        log_path.read_text()
    )
    assert not (report_dir / "prometheus").exists() and not (report_dir / "job").exists()
    pids = worker_pids(log_path.read_text())
    assert [p for p in set(pids) | set(workers) if alive(p)] == []


def test_bad_values_get_one_line_and_exit_2(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    taken = tmp_path / "a-file"
    taken.write_text("not a directory")
    for argv, words in [
        (["--target-utilization", "0"], "--target-utilization"),
        (["--target-utilization", "70"], "a fraction of 1 in (0, 1], got 70; give 0.7 for 70 %"),
        (["--target-utilization", "1.5"], "in (0, 1], got 1.5; give e.g. 0.7 for 70 %"),
        (["--target-utilization", "nan"], "--target-utilization: 'nan' is not a finite number"),
        (["--peak-rps", "inf"], "--peak-rps: 'inf' is not a finite number"),
        (["--report-dir", str(taken)], "is a file"),
        (["--sizing", "slo", "--no-prometheus"], "--sizing slo reads the batchers'"),
        (["--max-workers", "1", "--min-workers", "2"], "--max-workers 1 is below"),
        (["--profile", "sawtooth"], "sawtooth"),
        (["--duration", "soon"], "--duration"),
        (["--worker-model", "no.such:factory"], "no module 'no.such' can be found"),
    ]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_a_taken_port_gets_one_line_and_exit_2(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        base = sock.getsockname()[1]
    if base > 65535 - 200:
        base -= 200
    with socket.socket() as taken:
        # The exporter's, the first port checked: no port another process happens to hold
        # among the stack's others can be named instead.
        taken.bind(("127.0.0.1", base))
        taken.listen()
        # The console script's entry point, saying afterwards whether the stack was imported.
        entry = (
            "import sys; from autoglm.cli import main; code = main(sys.argv[1:]); "
            "print('imported the stack:', 'stack.stack' in sys.modules); sys.exit(code)"
        )
        run = subprocess.run(
            [
                sys.executable,
                "-c",
                entry,
                "up",
                "--no-tui",
                "--port-base",
                str(base),
                "--report-dir",
                str(tmp_path),
            ],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=180,
        )
    assert run.returncode == 2
    assert f"port {base} (exporter)" in run.stderr and "--port-base" in run.stderr
    assert run.stderr.strip().splitlines()[-1].startswith("autoglm up: error:")
    assert "worker started" not in run.stderr  # nothing was started
    assert os.listdir(tmp_path) == []
    # Refused before the stack's imports (torch, the predictor's models: seconds of CPU).
    assert "imported the stack: False" in run.stdout
