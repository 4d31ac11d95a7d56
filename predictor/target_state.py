"""One target's state in the running predictor: its series, its push-mode bin, its models.

Everything here is guarded by the state's own lock, so one target's refit never holds up
another's forecasts.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from predictor.config import TargetConfig
from predictor.forecast import Forecast
from predictor.models import ForecastModel
from predictor.selection import Selection, points_to_refit

NOT_FITTED_FLOOR_SECONDS = 3600.0


@dataclass
class TargetState:
    """Everything known about one target; guarded by ``lock``."""

    config: TargetConfig
    values: list[float] = field(default_factory=list)
    last_time: float | None = None  # timestamp of the last point in ``values``
    open_bin: int | None = None  # push mode: index of the bin being filled
    open_samples: list[float] = field(default_factory=list)
    models: dict[int, ForecastModel] = field(default_factory=dict)  # per configured horizon
    selection: Selection | None = None
    issued_at: float | None = None
    appended: int = 0  # points ever appended, to find those that arrived during a refit
    refit_running: bool = False
    waiting_since: float | None = None  # pull mode: first refit that found too few points
    waiting_warned: bool = False  # ... and whether the wait has outlasted the alert's limit
    created_at: float = 0.0  # when the service took the target on: the wait for a model
    query_failing_since: float | None = None  # pull mode: first failure of the current run
    query_failures: int = 0  # failed queries in that run
    query_logged_at: float | None = None  # last warning about that run
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def capacity(self) -> int:
        return max(self.min_points, int(self.config.lookback / self.config.step))

    @property
    def min_points(self) -> int:
        """Points a refit needs (:func:`predictor.selection.points_to_refit`)."""
        return points_to_refit(self.config.max_horizon)

    @property
    def not_fitted_limit(self) -> float:
        """Seconds without a model after which the wait is a fault, not start-up: twice the
        history a first refit needs, at least an hour. The alert PredictorTargetNotFitted and
        the Predictor dashboard use the same limit (``NOT_FITTED_LIMIT``), so the log's
        warning, the alert and the panel's line agree."""
        return max(2 * self.min_points * self.config.step, NOT_FITTED_FLOOR_SECONDS)

    def forecast_at(self, h: int, quantile: float) -> Forecast | None:
        """The forecast ``h`` steps after the last point, from the model chosen for the
        smallest configured horizon that covers it; None beyond the largest. Hold ``lock``."""
        config = self.config
        if h > config.max_horizon:
            return None
        chosen = next(x for x in config.horizons if x >= h)
        model = self.models[chosen]
        prediction = model.predict([h], quantile)
        return Forecast(
            target=config.name,
            horizon_seconds=h * config.step,
            point=float(prediction.point[0]),
            upper=float(prediction.upper[0]),
            quantile=quantile,
            model=model.name,
            issued_at=float(self.issued_at or 0.0),
        )

    def close_bin(self) -> float:
        """The open push-mode bin's samples aggregated as configured. Hold ``lock``."""
        samples = self.open_samples
        if self.config.aggregate == "sum":
            return float(np.sum(samples))
        if self.config.aggregate == "last":
            return float(samples[-1])
        return float(np.mean(samples))
