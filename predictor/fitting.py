"""Fitting the models a selection chose, calibrated with the selection's backtest errors."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from predictor.models import ForecastModel
from predictor.selection import Selection


def fit_chosen(
    selection: Selection, factories: Mapping[str, Callable[[], ForecastModel]], series: np.ndarray
) -> dict[str, ForecastModel]:
    """Fit each model the selection chose for some horizon on ``series``, with the selection's
    out-of-sample backtest errors as its calibration errors (its upper bound's)."""
    fitted: dict[str, ForecastModel] = {}
    for name in dict.fromkeys(selection.per_horizon.values()):
        model = factories[name]()
        model.fit(series)
        selection.calibrate(model)
        fitted[name] = model
    return fitted
