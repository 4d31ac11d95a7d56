"""Bounded request load on a batcher over KServe v2 HTTP, from threads of the test process.

``Load.steady(rate)`` paces one client at about ``rate`` requests per second; ``Load.burst``
runs closed-loop clients that send back to back, which a tiny queue cannot absorb. Every load
stops by itself at its deadline, so a failing test never leaves a client running; ``stop``
ends it earlier. Answers are counted by HTTP status. ``Overload`` runs bursts from several child
processes: closed-loop clients in one interpreter send only as fast as its one core lets them,
and on a loaded machine a tiny model's server then keeps up with them.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import requests


def body(rows: int = 1) -> str:
    """A request of ``rows`` rows for the demo model (16 features each)."""
    tensor = {"name": "input", "shape": [rows, 16], "datatype": "FP32", "data": [0.5] * 16 * rows}
    return json.dumps({"inputs": [tensor]})


class Load:
    """One load pattern against ``url`` (``.../v2/models/NAME/infer``) until ``stop``."""

    def __init__(
        self, url: str, clients: int, interval: float, max_seconds: float, rows: int = 1
    ) -> None:
        self.url = url
        self.body = body(rows)
        self.interval = interval
        self.deadline = time.monotonic() + max_seconds
        self.statuses: collections.Counter[int] = collections.Counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._client, name=f"load-{i}", daemon=True)
            for i in range(clients)
        ]

    @classmethod
    def steady(cls, url: str, rate: float, max_seconds: float) -> Load:
        return cls(url, clients=1, interval=1.0 / rate, max_seconds=max_seconds).start()

    @classmethod
    def burst(cls, url: str, clients: int, max_seconds: float, rows: int = 1) -> Load:
        return cls(url, clients, interval=0.0, max_seconds=max_seconds, rows=rows).start()

    def start(self) -> Load:
        for thread in self._threads:
            thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def _client(self) -> None:
        session = requests.Session()
        headers = {"Content-Type": "application/json"}
        next_at = time.monotonic()
        try:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                try:
                    status = session.post(
                        self.url, data=self.body, headers=headers, timeout=5
                    ).status_code
                except requests.RequestException:
                    status = 0  # the replica is not up (yet): count it and keep pacing
                with self._lock:
                    self.statuses[status] += 1
                if self.interval:
                    next_at += self.interval
                    self._stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            session.close()


class Overload:
    """``Load.burst`` of ``clients`` threads sending ``rows`` rows a request, in each of
    ``processes`` child processes."""

    def __init__(
        self, url: str, processes: int, clients: int, max_seconds: float, rows: int = 1
    ) -> None:
        command = [sys.executable, "-m", "tests.live_rules_dashboards.load", url]
        root = Path(__file__).resolve().parents[2]
        self._children = [
            subprocess.Popen([*command, str(clients), str(max_seconds), str(rows)], cwd=root)
            for _ in range(processes)
        ]

    def stop(self) -> None:
        for child in self._children:
            child.terminate()
        for child in self._children:
            try:
                child.wait(timeout=10)
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()


if __name__ == "__main__":  # one child of an Overload: url, clients, max_seconds, rows
    url, clients, seconds, rows = sys.argv[1], *map(float, sys.argv[2:5])
    load = Load.burst(url, int(clients), seconds, int(rows))
    time.sleep(seconds)
    load.stop()
