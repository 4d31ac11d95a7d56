"""One ``autoglm-batcher`` child process for the benchmarks, its JSON log followed.

A batcher told to listen on ``127.0.0.1:0`` says where it listens only in its log, and the
benches also read their start-up facts there (the warm-up's batch timings, the gRPC port), so
every bench that starts one needs the same three things: start it, follow its log on a thread,
and wait for its ``serving`` line. This is that, once.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class BatcherProcess:
    """``python -m batcher.cli ARGS --log-format json`` from the repository root.

    ``startup`` holds the log records up to and including the ``serving`` line; ``port`` is the
    HTTP port that line names; ``root`` is the source tree it runs from (another revision's, for an
    A/B comparison). A process that exits or stays silent past ``start_timeout``
    seconds raises RuntimeError (and is stopped).
    """

    def __init__(
        self, args: Sequence[str], start_timeout: float = 300.0, root: Path = ROOT
    ) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "batcher.cli", *args, "--log-format", "json"],
            cwd=root,
            # the root first (another revision's wins), then the caller's own path: the device
            # check's wheels (bench/device-check-serving) are found there
            env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), *_caller_path()])),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict] = queue.Queue()
        self.startup: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.port = self._wait_serving(start_timeout)

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                self.lines.put(json.loads(line))
            except json.JSONDecodeError:
                self.lines.put({"msg": line.strip()})

    def _wait_serving(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                record = self.lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            self.startup.append(record)
            if record.get("msg") == "serving":
                return int(record["port"])
        self.stop()
        raise RuntimeError("the batcher did not start")

    def startup_record(self, msg: str) -> dict | None:
        """The last start-up log record with this message, if the process logged one."""
        return next((r for r in reversed(self.startup) if r.get("msg") == msg), None)

    def stop(self) -> None:
        stop_process(self.proc)


def histogram_totals(port: int, name: str, label: str = "") -> tuple[float, float]:
    """(sum, count) of one of a batcher's histograms (``autoglm_batcher_batch_size_items``: items
    and batches run so far), from its ``/metrics`` on 127.0.0.1; of its series with ``label``
    (``cause="turnaround"``) when the histogram has more than one."""
    url = f"http://127.0.0.1:{port}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    found = {"sum": 0.0, "count": 0.0}
    for line in text.splitlines():
        for key in found:
            if line.startswith(f"{name}_{key}{{") and label in line:
                found[key] = float(line.rsplit(" ", 1)[1])
    return found["sum"], found["count"]


def _caller_path() -> list[str]:
    return [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, so a server drains and exits as it would in production; SIGKILL after 120 s."""
    proc.terminate()
    try:
        proc.wait(timeout=120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def start_with_port_file(
    command: Sequence[str], port_file: Path, what: str, timeout: float = 60.0
) -> tuple[subprocess.Popen, str]:
    """Start ``command`` (a bench's own server in a child process, from the repository root) and
    wait until it writes where it listens to ``port_file``; the process and what it wrote. A
    child that exits or stays silent past ``timeout`` is stopped, and the bench told which."""
    proc = subprocess.Popen(list(command), cwd=ROOT)
    deadline = time.monotonic() + timeout
    while not port_file.exists() or not port_file.read_text():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop_process(proc)
            raise RuntimeError(f"the {what} did not start")
        time.sleep(0.05)
    return proc, port_file.read_text()
