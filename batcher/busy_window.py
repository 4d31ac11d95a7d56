"""Device time spent over a sliding window: the busy fraction, for a metric and for sharing.

One window per user of the device (a model, or the process as a whole): the shared device
(:mod:`batcher.device`) compares the models' recent use of it to order their batches, and the
engine exports the whole device's busy ratio.
"""

from __future__ import annotations

from collections import deque


class BusyWindow:
    """Intervals of device work ending within the last ``seconds``."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._runs: deque[tuple[float, float]] = deque()

    def add(self, started: float, ended: float) -> None:
        self._runs.append((started, ended))

    def busy_seconds(self, now: float) -> float:
        """Device seconds spent within the window ending at ``now``."""
        since = now - self.seconds
        while self._runs and self._runs[0][1] < since:
            self._runs.popleft()
        return sum(end - max(start, since) for start, end in self._runs)

    def ratio(self, now: float) -> float:
        """Busy fraction of the window ending at ``now`` (0..1)."""
        return min(1.0, self.busy_seconds(now) / self.seconds)
