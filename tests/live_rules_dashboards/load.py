"""Bounded request load on a batcher over KServe v2 HTTP, from threads of the test process.

``Load.steady(rate)`` paces one client at about ``rate`` requests per second; ``Load.burst``
runs closed-loop clients that send back to back, which a tiny queue cannot absorb. Every load
stops by itself at its deadline, so a failing test never leaves a client running; ``stop``
ends it earlier. Answers are counted by HTTP status.
"""

from __future__ import annotations

import collections
import json
import threading
import time

import requests

BODY = json.dumps(
    {"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}]}
)


class Load:
    """One load pattern against ``url`` (``.../v2/models/NAME/infer``) until ``stop``."""

    def __init__(self, url: str, clients: int, interval: float, max_seconds: float) -> None:
        self.url = url
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
    def burst(cls, url: str, clients: int, max_seconds: float) -> Load:
        return cls(url, clients=clients, interval=0.0, max_seconds=max_seconds).start()

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
                        self.url, data=BODY, headers=headers, timeout=5
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
