"""Prediction intervals from recent out-of-sample errors (split-conformal style).

A model's upper bound at quantile q for horizon h is its point forecast plus the q-quantile of
the errors it made at that same horizon on points it had not seen. The errors come first from
the calibration tail held out at fit time and then from every new point, in a bounded window,
so the bound follows the series as its noise changes and its coverage can be checked in a
backtest. No distribution is assumed: real load is skewed and bursty.
"""

from __future__ import annotations

import numpy as np


class ResidualWindow:
    """The last ``size`` forecast errors (actual - point) per horizon 1..max_horizon."""

    def __init__(self, max_horizon: int, size: int = 500) -> None:
        if max_horizon < 1 or size < 1:
            raise ValueError("max_horizon and size must be >= 1")
        self.max_horizon = max_horizon
        self.size = size
        self._values = np.zeros((max_horizon, size))
        self._count = np.zeros(max_horizon, dtype=int)
        self._next = np.zeros(max_horizon, dtype=int)

    def add(self, horizon: int, error: float) -> None:
        i = horizon - 1
        self._values[i, self._next[i]] = error
        self._next[i] = (self._next[i] + 1) % self.size
        self._count[i] = min(self._count[i] + 1, self.size)

    def count(self, horizon: int) -> int:
        return int(self._count[horizon - 1])

    def errors(self, horizon: int) -> np.ndarray:
        """Errors at ``horizon``, oldest first."""
        i = horizon - 1
        n = self._count[i]
        if n < self.size:
            return self._values[i, :n].copy()
        return np.roll(self._values[i], -self._next[i])

    def quantile(self, horizon: int, q: float) -> float:
        """Conformal q-quantile of the errors at ``horizon`` (the nearest shorter horizon that
        has errors when this one has none yet; 0.0 when there are none at all)."""
        for h in range(horizon, 0, -1):
            n = self._count[h - 1]
            if n:
                # The finite-sample conformal rank ceil((n+1)q)/n keeps coverage >= q.
                level = min(1.0, np.ceil((n + 1) * q) / n)
                return float(np.quantile(self._values[h - 1, :n], level, method="higher"))
        return 0.0
