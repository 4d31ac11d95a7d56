"""The in-process contract between the predictor and its consumers (the autoscaler above all).

A consumer asks a :class:`ForecastProvider` for the best forecast of a target at least some
seconds ahead and gets a :class:`Forecast` that carries both the point forecast and the upper
bound at a quantile, plus which model made it and when, so it can judge the forecast's age.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Forecast:
    """One forecast of one target at one horizon."""

    target: str
    horizon_seconds: float
    point: float
    upper: float
    quantile: float
    model: str
    issued_at: float


@runtime_checkable
class ForecastProvider(Protocol):
    """Anything that can answer "how much load at least this far ahead?"."""

    def forecast(
        self, target: str, horizon_seconds: float, quantile: float = 0.9
    ) -> Forecast | None:
        """Best forecast for target at least horizon_seconds ahead; None when there is none yet."""
        ...
