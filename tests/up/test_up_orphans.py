"""Nothing ``autoglm up`` started outlives it, even when it is killed with SIGKILL.

SIGKILL runs no cleanup, so the children must stop by themselves: Prometheus (in a session of its
own) is sent SIGTERM by the kernel when its parent dies (:mod:`autoglm.child_process`), and the
batcher workers notice with ``--exit-with-parent``. Before that, a killed ``autoglm up`` left its
Prometheus running for as long as the machine stayed up.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from autoglm.child_process import dies_with_this_process, start_child
from tests.up.test_up_cli import REPO, descendants_of, kill_tree, log_records, up_command
from tests.waiting import wait_until

linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="parent-death signals are Linux's"
)

# Seconds a child may take to notice that ``autoglm up`` died and stop (a batcher drains first).
GONE_SECONDS = 30.0
START_SECONDS = 240.0


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks since boot), None once it has exited (a zombie has: it
    only waits to be reaped); with the pid, it names one process even if the pid is reused."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else int(fields[19])


def running(processes: dict[int, int | None]) -> list[int]:
    return [pid for pid, started in processes.items() if started and start_time(pid) == started]


def wait_until_gone(processes: dict[int, int | None]) -> list[int]:
    """Those of ``processes`` still running after ``GONE_SECONDS``, killed then (a failing test
    leaves nothing behind)."""
    with contextlib.suppress(TimeoutError):
        wait_until(
            lambda: not running(processes),
            timeout=GONE_SECONDS,
            what="the processes to be gone",
            interval=0.2,
        )
    left = running(processes)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def command_line(pid: int) -> str:
    with contextlib.suppress(OSError):
        return Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    return ""


def assert_the_child_dies_with_its_parent(parent_code: str) -> None:
    """Run ``parent_code`` (it starts a child, prints the child's pid, then sleeps), check that the
    child runs, SIGKILL the parent: the child must stop by itself."""
    parent = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(parent_code)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        processes = {child: start_time(child)}
        time.sleep(1.0)  # a child tied to a thread that ended would be stopped by now
        assert running(processes) == [child]
    finally:
        parent.kill()
        parent.wait()
    assert wait_until_gone(processes) == []


@linux_only
def test_a_child_started_on_the_main_thread_stops_when_its_parent_is_killed() -> None:
    assert_the_child_dies_with_its_parent(
        """
        import subprocess, sys, time
        from autoglm.child_process import dies_with_this_process
        child = subprocess.Popen(
            ["sleep", "600"], start_new_session=True, preexec_fn=dies_with_this_process()
        )
        print(child.pid, flush=True)
        time.sleep(600)
        """
    )


@linux_only
def test_a_child_started_from_a_thread_outlives_the_thread_and_dies_with_the_process() -> None:
    """``start_child`` from a thread that then ends (a scaling loop's): the child keeps running
    while the process lives, and is stopped when the process is killed."""
    assert_the_child_dies_with_its_parent(
        """
        import subprocess, sys, threading, time
        from autoglm.child_process import start_child
        started = []
        thread = threading.Thread(
            target=lambda: started.append(
                start_child(["sleep", "600"], start_new_session=True, stdin=subprocess.DEVNULL)
            )
        )
        thread.start()
        thread.join()
        print(started[0].pid, flush=True)
        time.sleep(600)
        """
    )


def test_start_child_raises_popen_errors_on_the_calling_thread() -> None:
    raised: list[BaseException] = []

    def start() -> None:
        try:
            start_child(["/nonexistent/autoglm-worker"])
        except OSError as exc:
            raised.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    thread.join()
    assert len(raised) == 1 and isinstance(raised[0], FileNotFoundError)


def test_a_child_started_on_another_thread_is_not_tied_to_that_thread() -> None:
    """The signal comes when the forking thread ends: from a thread that may end before the
    process, the child is started as before, without it."""
    found: list[object] = []
    thread = threading.Thread(target=lambda: found.append(dies_with_this_process()))
    thread.start()
    thread.join()
    assert found == [None]


@linux_only
@pytest.mark.slow
@pytest.mark.timeout(420)
def test_sigkill_of_up_stops_prometheus_and_the_workers(tmp_path: Path) -> None:
    report_dir = tmp_path / "report"
    log_path = tmp_path / "stderr.log"
    command = up_command(report_dir, "--no-job", "--duration", "600")
    with open(log_path, "w") as stderr:
        proc = subprocess.Popen(
            command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=stderr, text=True
        )
        try:

            def started() -> bool:
                log = log_path.read_text()
                if any(r.get("msg") == "stack started" for r in log_records(log)):
                    return True
                assert proc.poll() is None, log_path.read_text()[-3000:]
                return False

            wait_until(started, timeout=START_SECONDS, what="the stack to start", interval=0.5)
            processes = {pid: start_time(pid) for pid in descendants_of(proc.pid)}
            names = {pid: command_line(pid) for pid in processes}
            assert any("prometheus" in name.split(" ")[0] for name in names.values()), names
            assert any("batcher.cli" in name for name in names.values()), names
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        finally:
            if proc.poll() is None:
                kill_tree(proc)
    left = wait_until_gone(processes)
    assert left == [], {pid: names[pid] for pid in left}
