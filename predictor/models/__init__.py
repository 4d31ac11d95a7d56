"""Forecasting models with one protocol: ``fit(series)``, cheap ``update(point)`` and
``predict(horizons, quantile)`` returning point forecasts and calibrated upper bounds."""

from predictor.models.autoregressive import AutoregressiveModel
from predictor.models.base import ForecastModel, InsufficientHistory, Prediction
from predictor.models.boosted import BoostedTreesModel
from predictor.models.calendar import CalendarRegressionModel
from predictor.models.catalog import (
    BASELINES,
    ON_REQUEST,
    candidate_factories,
    shortest_cycle,
    usable_seasons,
)
from predictor.models.ensemble import Combination
from predictor.models.ets import ETSModel
from predictor.models.hierarchy import AggregatedModel, TemporalHierarchy
from predictor.models.mstl import MSTLModel
from predictor.models.naive import NaiveModel, SeasonalNaiveModel
from predictor.models.recent_level import RecentLevelModel
from predictor.models.seasonal_blend import SeasonalBlendModel
from predictor.models.seasonal_level import SeasonalLevelModel
from predictor.models.seasonal_mean import SeasonalMeanModel
from predictor.models.sequence import SequenceModel
from predictor.models.tracking import TrackingCombination

__all__ = [
    "BASELINES",
    "ON_REQUEST",
    "AggregatedModel",
    "AutoregressiveModel",
    "BoostedTreesModel",
    "CalendarRegressionModel",
    "Combination",
    "ETSModel",
    "ForecastModel",
    "InsufficientHistory",
    "MSTLModel",
    "NaiveModel",
    "Prediction",
    "RecentLevelModel",
    "SeasonalBlendModel",
    "SeasonalLevelModel",
    "SeasonalMeanModel",
    "SeasonalNaiveModel",
    "SequenceModel",
    "TemporalHierarchy",
    "TrackingCombination",
    "candidate_factories",
    "shortest_cycle",
    "usable_seasons",
]
