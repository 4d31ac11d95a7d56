"""The predictive input: the upper bound of a forecast at a horizon no shorter than the warm-up.

Two sources give the same answer. In one process (local stack, simulator) the predictor's
:class:`~predictor.api.ForecastProvider` is asked directly. In a cluster the predictor publishes
its forecasts as ``autoglm_forecast_*`` series and the controller reads them from Prometheus, so
the predictor can be replaced by anything that publishes the same series.

A missing, stale, too-short, negative or non-finite forecast gives no predictive candidate (None):
the decision then rests on the reactive proposal alone, exactly the HPA's. (No load is below zero,
so a negative upper bound means the forecaster is broken, not that the load will vanish.) A finite
forecast above what maxReplicas can serve is kept: it asks for maxReplicas, as the same reading
would of the HPA, and behavior's scale-up policies still pace the climb. Prediction can only add
replicas, so losing it never makes things worse than the HPA.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Protocol

from autoglm.prometheus_api import PrometheusClient, PrometheusError
from autoscaler.spec import MetricSpec
from predictor.api import ForecastProvider

log = logging.getLogger(__name__)

# Placeholders: {target} (the metric's name), {horizon} (seconds, integer), {quantile}. When the
# answer has a horizon_seconds label (as the predictor publishes), the shortest horizon that is at
# least the one needed is used.
DEFAULT_FORECAST_QUERY = 'autoglm_forecast_upper{{target="{target}",quantile="{quantile}"}}'
HORIZON_LABEL = "horizon_seconds"


ErrorCounter = Callable[[str], None]


def _no_count(kind: str) -> None:
    pass


class ForecastSource(Protocol):
    def upper(self, metric: MetricSpec, count_error: ErrorCounter = _no_count) -> float | None:
        """Upper bound for ``metric`` at its prediction horizon, or None when there is none."""
        ...


def _wants_forecast(metric: MetricSpec) -> bool:
    return metric.prediction is not None and metric.prediction.enabled


class ProviderForecasts:
    """Asks an in-process forecast provider; ``targets`` maps metric names to predictor targets."""

    def __init__(
        self,
        provider: ForecastProvider,
        targets: Mapping[str, str] | None = None,
        max_age_seconds: float = 600.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.provider = provider
        self.targets = dict(targets or {})
        self.max_age_seconds = max_age_seconds
        self.clock = clock

    def upper(self, metric: MetricSpec, count_error: ErrorCounter = _no_count) -> float | None:
        if not _wants_forecast(metric):
            return None
        assert metric.prediction is not None
        horizon = metric.prediction.effective_horizon_seconds
        target = self.targets.get(metric.name, metric.name)
        try:
            forecast = self.provider.forecast(target, horizon, metric.prediction.quantile)
        except Exception as exc:  # a failing predictor must not stop reactive scaling
            log.warning("forecast failed", extra={"target": target, "error": str(exc)[:200]})
            count_error("forecast_failed")
            return None
        if forecast is None:
            return None
        if forecast.horizon_seconds < horizon:
            count_error("forecast_short_horizon")
            return None
        if self.clock() - forecast.issued_at > self.max_age_seconds:
            count_error("forecast_stale")
            return None
        if not math.isfinite(forecast.upper):
            count_error("forecast_nan")
            return None
        if forecast.upper < 0:
            count_error("forecast_negative")
            return None
        return forecast.upper


class PrometheusForecasts:
    """Reads the forecast series the predictor publishes, through a PromQL template."""

    def __init__(
        self,
        client: PrometheusClient,
        query_template: str = DEFAULT_FORECAST_QUERY,
    ) -> None:
        self.client = client
        self.query_template = query_template

    def query_for(self, metric: MetricSpec) -> str:
        assert metric.prediction is not None
        return self.query_template.format(
            target=metric.name,
            horizon=math.ceil(metric.prediction.effective_horizon_seconds),
            quantile=f"{metric.prediction.quantile:g}",
        )

    def upper(self, metric: MetricSpec, count_error: ErrorCounter = _no_count) -> float | None:
        if not _wants_forecast(metric):
            return None
        query = self.query_for(metric)
        try:
            result = self.client.query(query)
        except PrometheusError as exc:
            count_error(f"forecast_prometheus_{exc.kind}")
            log.warning("forecast query failed", extra={"query": query, "error": str(exc)})
            return None
        assert metric.prediction is not None
        needed = metric.prediction.effective_horizon_seconds
        candidates = [s for s in result.samples if _horizon(s.labels) is None]
        if not candidates:
            long_enough = [s for s in result.samples if (_horizon(s.labels) or 0.0) >= needed]
            shortest = min((_horizon(s.labels) or 0.0 for s in long_enough), default=None)
            candidates = [s for s in long_enough if _horizon(s.labels) == shortest]
        if not candidates:
            if result.samples:
                count_error("forecast_short_horizon")
            return None
        if not all(math.isfinite(s.value) for s in candidates):
            count_error("forecast_nan")
            return None
        if any(s.value < 0 for s in candidates):
            count_error("forecast_negative")
            return None
        return max(s.value for s in candidates)


def _horizon(labels: Mapping[str, str]) -> float | None:
    raw = labels.get(HORIZON_LABEL)
    try:
        return float(raw) if raw is not None else None
    except ValueError:
        return None
