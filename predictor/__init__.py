"""Forecasts with calibrated upper bounds, chosen per series by backtest (see predictor.service
for the running component, predictor.api for the in-process contract)."""

from predictor.api import Forecast, ForecastProvider

__all__ = ["Forecast", "ForecastProvider"]
