"""Bounded request load on a batcher over KServe v2 HTTP, from threads of the test process.

``SteadyLoad`` paces one client at about ``rate`` requests per second. ``Bursts`` sends
``size`` requests at the same instant, every ``interval``: more than a tiny queue holds arrive
before the first batch is done, so most of each burst is refused, at a cost of a few percent of
a core on each side. (Closed-loop clients overloaded the queue too, but only by keeping the
server and two client processes busy at about two cores for as long as the alert took: CPU the
rest of a parallel slow tier waited for; docs/testing.md.) Every load stops by itself at its
deadline, so a failing test never leaves a client running; ``stop`` ends it earlier. Neither
reads its answers: the batcher's own metrics, which the tests query, count them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import aiohttp
import requests


def body(rows: int = 1) -> str:
    """A request of ``rows`` rows for the demo model (16 features each)."""
    tensor = {"name": "input", "shape": [rows, 16], "datatype": "FP32", "data": [0.5] * 16 * rows}
    return json.dumps({"inputs": [tensor]})


class SteadyLoad:
    """One client sending to ``url`` (``.../v2/models/NAME/infer``) about ``rate`` requests a
    second, until ``stop`` or ``max_seconds``."""

    def __init__(self, url: str, rate: float, max_seconds: float) -> None:
        self.url = url
        self.body = body()
        self.interval = 1.0 / rate
        self.deadline = time.monotonic() + max_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._client, name="steady-load", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _client(self) -> None:
        session = requests.Session()
        # No proxy settings from the environment: reading them iterates os.environ, which
        # pytest changes from the main thread (PYTEST_CURRENT_TEST) and which then raised
        # KeyError here, ending the steady load for the rest of the module.
        session.trust_env = False
        headers = {"Content-Type": "application/json"}
        next_at = time.monotonic()
        try:
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                # Answered or not (a replica not up yet), the pace is kept.
                with contextlib.suppress(requests.RequestException):
                    session.post(self.url, data=self.body, headers=headers, timeout=5)
                next_at += self.interval
                self._stop.wait(max(0.0, next_at - time.monotonic()))
        finally:
            session.close()


class Bursts:
    """``size`` requests of ``rows`` rows sent at once over ``size`` connections, every
    ``interval`` seconds, until ``stop`` or ``max_seconds``; from an event loop in a thread."""

    def __init__(
        self, url: str, size: int, interval: float, max_seconds: float, rows: int = 1
    ) -> None:
        self.url = url
        self.body = body(rows)
        self.size = size
        self.interval = interval
        self.deadline = time.monotonic() + max_seconds
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._send()), name="bursts", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def _send(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.size)
        timeout = aiohttp.ClientTimeout(total=10)
        headers = {"Content-Type": "application/json"}
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=headers
        ) as session:

            async def one() -> None:
                # Refused (429) or not, the batcher counts it; a replica not up yet is skipped.
                with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                    async with session.post(self.url, data=self.body) as response:
                        await response.read()

            next_at = time.monotonic()
            while not self._stop.is_set() and time.monotonic() < self.deadline:
                await asyncio.gather(*(one() for _ in range(self.size)))
                next_at += self.interval
                await asyncio.sleep(max(0.0, next_at - time.monotonic()))
