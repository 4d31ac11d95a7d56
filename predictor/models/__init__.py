"""Forecasting models with one protocol: ``fit(series)``, cheap ``update(point)`` and
``predict(horizons, quantile)`` returning point forecasts and calibrated upper bounds."""

from predictor.models.autoregressive import AutoregressiveModel
from predictor.models.base import ForecastModel, InsufficientHistory, Prediction
from predictor.models.catalog import (
    BASELINES,
    candidate_factories,
    shortest_cycle,
    usable_seasons,
)
from predictor.models.ensemble import MedianEnsemble
from predictor.models.ets import ETSModel
from predictor.models.naive import NaiveModel, SeasonalNaiveModel
from predictor.models.seasonal_blend import SeasonalBlendModel
from predictor.models.seasonal_level import SeasonalLevelModel
from predictor.models.sequence import SequenceModel

__all__ = [
    "BASELINES",
    "AutoregressiveModel",
    "ETSModel",
    "ForecastModel",
    "InsufficientHistory",
    "MedianEnsemble",
    "NaiveModel",
    "Prediction",
    "SeasonalBlendModel",
    "SeasonalLevelModel",
    "SeasonalNaiveModel",
    "SequenceModel",
    "candidate_factories",
    "shortest_cycle",
    "usable_seasons",
]
