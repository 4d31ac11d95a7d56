"""Forecasts of the request rate for the predictive policy, replayed causally.

The simulator feeds the forecaster one point per step (the request rate of the step that just
ended) and asks for the upper bound over the next ``horizon`` steps; nothing from the future is
ever shown to it. The default forecaster wraps the predictor package's models
(``predictor.models``: ``fit`` / cheap ``update`` / ``predict(h, quantile)``), refitting on the
history it has seen every ``refit_every`` steps and choosing the richest model the history
allows (a daily seasonal model once two days are seen, a naive one before).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Protocol

import numpy as np

log = logging.getLogger(__name__)


class LoadForecaster(Protocol):
    """What the simulator needs from a forecaster."""

    name: str

    def observe(self, value: float) -> None:
        """Take the newest point of the series (one step after the previous one)."""

    def upper(self, horizon_steps: int, quantile: float) -> float | None:
        """Upper bound at ``quantile`` of the highest value in the next ``horizon_steps``."""


class PredictorForecaster:
    """Adapter from ``predictor.models`` to :class:`LoadForecaster`.

    ``preferences`` lists model names from :func:`predictor.models.candidate_factories` in order
    of preference; the first one available for the history seen so far is fitted.
    """

    def __init__(
        self,
        step_seconds: float,
        max_horizon: int,
        seasons_seconds: tuple[float, ...] = (86400.0,),
        preferences: tuple[str, ...] = ("seasonal_level", "naive"),
        refit_every: int = 360,
        min_history: int = 30,
    ) -> None:
        from predictor.models import candidate_factories

        self._factories = candidate_factories
        self.step_seconds = step_seconds
        self.max_horizon = max_horizon
        self.seasons = seasons_seconds
        self.preferences = preferences
        self.refit_every = refit_every
        self.min_history = min_history
        self.history: list[float] = []
        self.model = None
        self.name = "none"
        self._since_fit = 0

    def observe(self, value: float) -> None:
        self.history.append(float(value))
        self._since_fit += 1
        if self.model is None or self._since_fit >= self.refit_every:
            self._refit()
        else:
            self.model.update(float(value))

    def _refit(self) -> None:
        n = len(self.history)
        if n < self.min_history:
            return
        factories: dict[str, Callable] = self._factories(
            self.step_seconds, self.seasons, self.max_horizon, n
        )
        for name in self.preferences:
            if name not in factories:
                continue
            model = factories[name]()
            try:
                model.fit(np.asarray(self.history))
            except ValueError as exc:  # too little history for this model: try the next one
                log.debug("forecaster model skipped", extra={"model": name, "error": str(exc)})
                continue
            self.model, self.name = model, name
            self._since_fit = 0
            return

    def upper(self, horizon_steps: int, quantile: float) -> float | None:
        if self.model is None:
            return None
        h = max(1, min(horizon_steps, self.max_horizon))
        prediction = self.model.predict(list(range(1, h + 1)), quantile)
        return float(np.max(prediction.upper))
