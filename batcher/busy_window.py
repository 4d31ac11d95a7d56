"""Device time spent over a sliding window: the busy fraction, for a metric and for sharing.

One window per user of the device (a model, or the process as a whole): the shared device
(:mod:`batcher.device`) compares the models' recent use of it to order their batches, and the
engine exports the whole device's busy ratio.
"""

from __future__ import annotations

from collections import deque


class BusyWindow:
    """Intervals of device work ending within the last ``seconds``.

    The intervals are added in the order they end and do not overlap (one batch at a time on a
    device), so a running total answers without summing the window at every batch: small batches
    put thousands of intervals in a minute's window.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self._runs: deque[tuple[float, float]] = deque()
        self._total = 0.0  # the lengths of the intervals in _runs

    def add(self, started: float, ended: float) -> None:
        self._runs.append((started, ended))
        self._total += ended - started

    def busy_seconds(self, now: float) -> float:
        """Device seconds spent within the window ending at ``now``."""
        since = now - self.seconds
        while self._runs and self._runs[0][1] < since:
            started, ended = self._runs.popleft()
            self._total -= ended - started
        if not self._runs:
            self._total = 0.0  # no rounding left over from what was added and taken away
            return 0.0
        outside = 0.0  # the parts of the oldest intervals that began before the window
        for started, _ in self._runs:
            if started >= since:
                break
            outside += since - started
        return max(0.0, self._total - outside)

    def ratio(self, now: float) -> float:
        """Busy fraction of the window ending at ``now`` (0..1)."""
        return min(1.0, self.busy_seconds(now) / self.seconds)
