"""The real exporter as a child process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


class ExporterProcess:
    """``python -m exporter.cli ARGS --listen 127.0.0.1:0``; the port comes from its start log."""

    def __init__(self, args: Sequence[str]) -> None:
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        self.process = subprocess.Popen(
            [sys.executable, "-m", "exporter.cli", *args, "--listen", "127.0.0.1:0"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self.log_lines: list[str] = []
        self._started = threading.Event()
        self.address = ""
        self._reader = threading.Thread(target=self._read_logs, daemon=True)
        self._reader.start()
        if not self._started.wait(timeout=30):
            self.stop()
            raise RuntimeError("exporter did not start:\n" + "\n".join(self.log_lines[-20:]))
        self.url = f"http://{self.address}"

    def _read_logs(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            self.log_lines.append(line)
            try:
                record = json.loads(line)
            except ValueError:
                continue
            if record.get("msg") == "exporter started":
                self.address = record["listen"]
                self._started.set()

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Send ``sig`` and return the exit code (kills the process if it does not stop)."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._reader.join(timeout=5)
        return self.process.returncode
