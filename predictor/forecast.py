"""What a forecast is, and what answers for one: the types the service and its consumers share.

They live apart from :mod:`predictor.api` so that the service can implement them while the API
builds a service for in-process consumers, without the two modules importing each other.
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
