"""What the predictor publishes on /metrics.

Forecast series (``autoglm_forecast_*``) are read from the service at scrape time, so a scrape
always shows the current models and the age of their forecasts, and so are the gauges that say
whether each target has a model yet and how long it has waited for one (a target that never
fitted has no forecast series to go stale); self-metrics (refits, query errors, updates,
rejected samples) are ordinary counters and a histogram. Labels: ``target``,
``horizon_seconds`` (how far ahead, in seconds), ``model``, ``quantile``. Errors are ratios
(0.25 = 25 %), in base units like every other metric.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from predictor.forecast import Forecast
from predictor.target_state import TargetState


class PublishedForecasts(Protocol):
    """What the collector reads of the running service: the predictor's service implements
    it, and this module needs no import of it (the service imports this one)."""

    @property
    def clock(self) -> Callable[[], float]: ...

    @property
    def targets(self) -> Mapping[str, TargetState]: ...

    def forecasts(self, target: str) -> list[Forecast]: ...


class ForecastCollector(Collector):
    """Builds the ``autoglm_forecast_*`` families from a service's state at scrape time."""

    def __init__(self) -> None:
        self.service: PublishedForecasts | None = None

    def collect(self):
        point = GaugeMetricFamily(
            "autoglm_forecast_value",
            "Point forecast of the target at the horizon",
            labels=["target", "horizon_seconds"],
        )
        upper = GaugeMetricFamily(
            "autoglm_forecast_upper",
            "Upper bound of the forecast at the quantile (what the autoscaler consumes)",
            labels=["target", "horizon_seconds", "quantile"],
        )
        model_info = GaugeMetricFamily(
            "autoglm_forecast_model_info",
            "Model chosen by backtest for the target and horizon (value is always 1)",
            labels=["target", "horizon_seconds", "model"],
        )
        backtest_wape = GaugeMetricFamily(
            "autoglm_forecast_backtest_wape_ratio",
            "WAPE of each candidate model in the last selection backtest",
            labels=["target", "horizon_seconds", "model"],
        )
        backtest_coverage = GaugeMetricFamily(
            "autoglm_forecast_backtest_coverage_ratio",
            "Share of actuals at or below the upper bound in the last selection backtest",
            labels=["target", "horizon_seconds", "model"],
        )
        recent_error = GaugeMetricFamily(
            "autoglm_forecast_recent_wape_ratio",
            "WAPE of the live forecasts over the recent error window",
            labels=["target", "horizon_seconds"],
        )
        observed = GaugeMetricFamily(
            "autoglm_forecast_observed",
            "Last observed value of the target (the series being forecast)",
            labels=["target"],
        )
        age = GaugeMetricFamily(
            "autoglm_forecast_age_seconds",
            "Seconds since the forecasts of the target were last updated",
            labels=["target"],
        )
        fitted = GaugeMetricFamily(
            "autoglm_predictor_model_fitted",
            "Whether the target has a fitted model and publishes forecasts (1) or not yet (0)",
            labels=["target"],
        )
        unfitted = GaugeMetricFamily(
            "autoglm_predictor_unfitted_seconds",
            "Seconds since the predictor started that the target has had no fitted model "
            "(0 once it has one)",
            labels=["target"],
        )
        history_needed = GaugeMetricFamily(
            "autoglm_predictor_history_needed_seconds",
            "History a first refit of the target needs (points it needs times its step)",
            labels=["target"],
        )
        service = self.service
        if service is not None:
            now = service.clock()
            for name, state in service.targets.items():
                config = state.config
                with state.lock:
                    has_model = bool(state.models)
                    created_at = state.created_at
                fitted.add_metric([name], 1.0 if has_model else 0.0)
                unfitted.add_metric([name], 0.0 if has_model else max(0.0, now - created_at))
                history_needed.add_metric([name], state.min_points * config.step)
                for forecast in service.forecasts(name):
                    h = _seconds(forecast.horizon_seconds)
                    point.add_metric([name, h], forecast.point)
                    upper.add_metric([name, h, f"{forecast.quantile:g}"], forecast.upper)
                    model_info.add_metric([name, h, forecast.model], 1.0)
                with state.lock:
                    selection = state.selection
                    models = dict(state.models)
                    values = np.array(state.values[-500:], dtype=float)
                    issued_at = state.issued_at
                if issued_at is None:
                    continue
                age.add_metric([name], max(0.0, now - issued_at))
                if len(values):
                    observed.add_metric([name], float(values[-1]))
                for h, model in models.items():
                    n = model.residuals.count(h)
                    scale = np.abs(values[-n:]).mean() if n and len(values) else 0.0
                    if n and scale > 0:
                        err = np.abs(model.residuals.errors(h)).mean() / scale
                        recent_error.add_metric([name, _seconds(h * config.step)], float(err))
                if selection is not None:
                    for model_name, result in selection.results.items():
                        for h in result.horizons:
                            label = [name, _seconds(h * config.step), model_name]
                            if np.isfinite(result.wape[h]):
                                backtest_wape.add_metric(label, result.wape[h] / 100.0)
                            backtest_coverage.add_metric(label, result.coverage[h] / 100.0)
        yield from (
            point,
            upper,
            model_info,
            backtest_wape,
            backtest_coverage,
            recent_error,
            observed,
            age,
            fitted,
            unfitted,
            history_needed,
        )


def _seconds(value: float) -> str:
    return f"{value:g}"


class PredictorMetrics:
    """The predictor's registry: forecast families plus its own health counters."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self.forecasts = ForecastCollector()
        self.registry.register(self.forecasts)
        self.refits = Counter(
            "autoglm_predictor_refits",
            "Model selections and refits, by result",
            ["target", "result"],
            registry=self.registry,
        )
        self.refit_duration = Histogram(
            "autoglm_predictor_refit_duration_seconds",
            "Time a refit (backtest selection and fit) took",
            ["target"],
            buckets=(0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.query_errors = Counter(
            "autoglm_predictor_query_errors",
            "Failed Prometheus queries (the last forecasts stay published)",
            ["target"],
            registry=self.registry,
        )
        self.updates = Counter(
            "autoglm_predictor_updates",
            "Points fed to fitted models between refits",
            ["target"],
            registry=self.registry,
        )
        self.observations_rejected = Counter(
            "autoglm_predictor_observations_rejected",
            "Pushed samples ignored, by reason (late: their bin was already closed)",
            ["target", "reason"],
            registry=self.registry,
        )

    def attach(self, service: PublishedForecasts) -> None:
        self.forecasts.service = service
