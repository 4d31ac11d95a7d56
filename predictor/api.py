"""The in-process contract between the predictor and its consumers (the autoscaler above all).

A consumer asks a :class:`ForecastProvider` for the best forecast of a target at least some
seconds ahead and gets a :class:`Forecast` that carries both the point forecast and the upper
bound at a quantile, plus which model made it and when, so it can judge the forecast's age.

A consumer that measures the series itself (the autoscaler's simulator) runs the predictor in
its own process through :class:`InProcessPredictor`, on its own clock, and asks
:func:`model_names` which models it may name. The predictor's modules are imported only when
one is built: importing this contract costs no model library.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Literal

from predictor.forecast import Forecast, ForecastProvider

if TYPE_CHECKING:
    from predictor.service import PredictorService

__all__ = ["Forecast", "ForecastProvider", "InProcessPredictor", "model_names"]


def model_names(seasons_seconds: Sequence[float]) -> list[str]:
    """Every model name the predictor can offer for these seasons, given enough history."""
    from predictor.model_names import known_models

    return known_models(seasons_seconds)


class InProcessPredictor:
    """One target's predictor, fed and asked by the caller on the caller's clock.

    The caller pushes each sample with :meth:`observe` (samples fill steps of ``step_seconds``,
    aggregated by ``aggregate``), re-runs model selection with :meth:`refit` on its own schedule
    and reads forecasts with :meth:`forecast`, as the running service would answer them.
    ``horizon_steps`` are the steps ahead selection scores; ``models`` restricts the non-baseline
    candidates (empty: all of them, see :func:`model_names`).
    """

    def __init__(
        self,
        target: str,
        *,
        step_seconds: float,
        lookback_seconds: float,
        horizon_steps: Sequence[int],
        quantile: float,
        seasons_seconds: Sequence[float],
        aggregate: Literal["mean", "sum", "last"],
        models: Sequence[str],
        clock: Callable[[], float],
    ) -> None:
        from predictor.config import TargetConfig
        from predictor.selection import minimum_history
        from predictor.service import PredictorService

        config = TargetConfig(
            name=target,
            step=step_seconds,
            lookback=lookback_seconds,
            horizons=tuple(horizon_steps),
            quantile=quantile,
            seasons=tuple(seasons_seconds),
            aggregate=aggregate,
            models=tuple(models),
        )
        self.target = target
        self.quantile = quantile
        self.lookback_seconds = config.lookback
        self.minimum_history = minimum_history(config.max_horizon)
        """Closed steps model selection needs before a :meth:`refit` can succeed."""
        self._service: PredictorService = PredictorService([config], clock=clock)

    def observe(self, timestamp: float, value: float) -> None:
        """Add one sample; a sample of a later step closes the current one."""
        self._service.observe(self.target, timestamp, value)

    def refit(self) -> bool:
        """Re-select and refit the models on the whole history; True on success."""
        return self._service.refit(self.target)

    def forecast(self, horizon_seconds: float, quantile: float) -> Forecast | None:
        """Best forecast for the step at least ``horizon_seconds`` ahead; None before a fit."""
        return self._service.forecast(self.target, horizon_seconds, quantile)
