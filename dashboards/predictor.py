"""Predictor: how good are the forecasts the autoscaler scales on, and are they current.

A forecast published at time t is for time t + horizon. To lay it over what then happened, the
forecast series are shifted forward by their horizon with ``offset ${horizon}s``; PromQL needs a
literal duration there, hence the single-value ``horizon`` variable (seconds, as the predictor's
``horizon_seconds`` label). One target at a time: the band between the point forecast and the
upper bound is drawn by filling between two named series.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models.dashboard import (
    DynamicConfigValue,
    VariableSort,
)

from dashboards import variables
from dashboards.base import new_dashboard
from dashboards.panels import (
    Column,
    Query,
    bar_gauge_panel,
    row,
    stat_panel,
    table_panel,
    timeseries_panel,
)

UID = "autoglm-predictor"
TARGET = 'target=~"$target"'
AT_HORIZON = 'target=~"$target", horizon_seconds="$horizon"'
SHIFT = "offset ${horizon}s"
KEY = "target, horizon_seconds, model"
# Alert thresholds of alerts/rules.yaml (autoglm-predictor.alerts), held equal to the rules by
# tests/dashboards/test_alert_thresholds.py, NOT_FITTED_LIMIT also to the predictor's own log
# warning (TargetState.not_fitted_limit).
ERROR_LIMIT = 0.5
STALE_SECONDS = 600
NOT_FITTED_LIMIT = "clamp_min(2 * autoglm_predictor_history_needed_seconds, 3600)"
CHOSEN = "autoglm_forecast_model_info"


def _of_chosen(metric: str, selector: str = TARGET) -> str:
    """``metric`` (per target, horizon and model) for the model chosen at each horizon only."""
    return f"max by ({KEY}) ({metric}{{{selector}}} * on ({KEY}) {CHOSEN}{{{selector}}})"


def _forecast_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Forecast against what happened"))
    band = timeseries_panel(
        "Observed and forecast",
        "Did the forecast see it coming? The observed series against the forecast made "
        "$horizon seconds earlier (shifted forward by its horizon), with the band up to the "
        "upper bound the autoscaler scales on. Actuals above the band are under-forecasts.",
        [
            Query(f"max(autoglm_forecast_observed{{{TARGET}}})", "observed"),
            Query(f"max(autoglm_forecast_value{{{AT_HORIZON}}} {SHIFT})", "forecast"),
            Query(f"max(autoglm_forecast_upper{{{AT_HORIZON}}} {SHIFT})", "upper bound"),
        ],
        "short",
        width=24,
        height=9,
        dashed=["upper bound"],
    )
    band = band.override_by_name(
        "upper bound",
        [
            DynamicConfigValue(id_val="custom.fillBelowTo", value="forecast"),
            DynamicConfigValue(id_val="custom.fillOpacity", value=20),
        ],
    )
    d = d.with_panel(band)
    d = d.with_panel(
        timeseries_panel(
            "Forecast error (recent WAPE)",
            "How far off have the live forecasts been lately, per horizon? WAPE over the "
            "predictor's recent window (0.3 = 30% of the load misplaced); the dashed line is "
            "where PredictorForecastErrorHigh fires after an hour.",
            [
                Query(
                    f"autoglm_forecast_recent_wape_ratio{{{TARGET}}}",
                    "{{target}} {{horizon_seconds}}s",
                ),
                Query(f"vector({ERROR_LIMIT})", "alert"),
            ],
            "percentunit",
            min_value=0,
            dashed=["alert"],
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Upper-bound coverage",
            "Is the upper bound as safe as promised? Share of actuals at or below it: in the "
            "last selection backtest (chosen model, per horizon) and live over the last hour at "
            "$horizon s. It should sit near the configured quantile (0.9 by default).",
            [
                Query(
                    _of_chosen("autoglm_forecast_backtest_coverage_ratio"),
                    "backtest {{target}} {{horizon_seconds}}s",
                ),
                Query(
                    "avg by (target) (avg_over_time((autoglm_forecast_observed"
                    f"{{{TARGET}}} <= bool on (target) group_left max by (target) "
                    f"(autoglm_forecast_upper{{{AT_HORIZON}}} {SHIFT}))[1h:]))",
                    "live {{target}} ${horizon}s",
                ),
            ],
            "percentunit",
            min_value=0,
            max_value=1,
        )
    )


def _models_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Models"))
    d = d.with_panel(
        table_panel(
            "Chosen model",
            "Which model forecasts each horizon, and how did it do? Chosen by the last "
            "rolling-origin backtest; its backtest WAPE and coverage, and the live WAPE since.",
            ["target", "horizon_seconds", "model"],
            [
                Column(
                    "backtest WAPE",
                    _of_chosen("autoglm_forecast_backtest_wape_ratio"),
                    "percentunit",
                ),
                Column(
                    "backtest coverage",
                    _of_chosen("autoglm_forecast_backtest_coverage_ratio"),
                    "percentunit",
                ),
                Column(
                    "recent WAPE",
                    f"max by ({KEY}) ({CHOSEN}{{{TARGET}}} * on (target, horizon_seconds) "
                    f"group_left autoglm_forecast_recent_wape_ratio{{{TARGET}}})",
                    "percentunit",
                    steps=((None, "green"), (ERROR_LIMIT, "red")),
                ),
            ],
            sort_by="target",
            width=12,
        )
    )
    return d.with_panel(
        bar_gauge_panel(
            "Candidate models' backtest WAPE",
            "How did every candidate do in the last selection, at $horizon s? The lowest WAPE "
            "wins the horizon; baselines (naive, seasonal naive) are always among them.",
            [
                Query(
                    f"autoglm_forecast_backtest_wape_ratio{{{AT_HORIZON}}}",
                    "{{target}} {{model}}",
                )
            ],
            "percentunit",
            min_value=0,
        )
    )


def _health_row(d: db.Dashboard) -> db.Dashboard:
    # Every target, not only the selected one: a misconfigured target shows up here.
    d = d.with_row(row("Predictor health (all targets)"))
    d = d.with_panel(
        stat_panel(
            "Oldest forecast",
            "Are the forecasts current? Age of the oldest target's forecasts; the autoscaler "
            f"ignores forecasts older than {STALE_SECONDS // 60} minutes.",
            [Query("max(autoglm_forecast_age_seconds)")],
            "s",
            width=6,
            steps=((None, "green"), (STALE_SECONDS, "red")),
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Forecast age",
            "When were the forecasts of each target last updated? Grows while Prometheus is "
            "unreachable or the query returns no new points; dashed: the stale limit.",
            [
                Query("autoglm_forecast_age_seconds", "{{target}}"),
                Query(f"vector({STALE_SECONDS})", "stale"),
            ],
            "s",
            width=18,
            min_value=0,
            dashed=["stale"],
        )
    )
    d = d.with_panel(
        stat_panel(
            "Targets without a model",
            "Does every target publish forecasts? Targets with no fitted model yet: waiting for "
            "history after a start, or a query that matches too little, or Prometheus down.",
            [Query("count(autoglm_predictor_model_fitted == 0) or vector(0)")],
            "none",
            width=6,
            steps=((None, "green"), (1, "orange")),
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Wait for a first model",
            "How long has each target gone without a model since the predictor started? 0 once "
            "fitted. A target without one publishes no forecasts (so no age). Dashed: "
            "PredictorTargetNotFitted's limit for the target that reaches it first: twice the "
            "history a first refit needs, at least an hour.",
            [
                Query("autoglm_predictor_unfitted_seconds", "{{target}}"),
                Query(f"min({NOT_FITTED_LIMIT})", "limit"),
            ],
            "s",
            width=18,
            min_value=0,
            dashed=["limit"],
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Query errors",
            "Can the predictor read its series? Failed Prometheus queries per second, by target "
            "(unreachable, an error, or more than one series returned).",
            [
                Query(
                    "sum by (target) (rate(autoglm_predictor_query_errors_total"
                    "[$__rate_interval]))",
                    "{{target}}",
                )
            ],
            "ops",
            width=8,
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Refits and updates",
            "Do refits succeed, and do new points arrive between them? Refits by result "
            "(waiting: too few points yet, normal after a start) and points fed to the fitted "
            "models, per second.",
            [
                Query(
                    "sum by (target, result) (rate(autoglm_predictor_refits_total"
                    "[$__rate_interval]))",
                    "{{target}} refit {{result}}",
                ),
                Query(
                    "sum by (target) (rate(autoglm_predictor_updates_total[$__rate_interval]))",
                    "{{target}} updates",
                ),
            ],
            "ops",
            width=8,
            min_value=0,
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Refit duration",
            "How long does a refit (backtest selection and fit) take? p50 and p99 from the "
            "histogram; a refit runs beside the updates, never blocking them.",
            [
                Query(
                    "histogram_quantile(0.5, sum by (le, target) (rate("
                    "autoglm_predictor_refit_duration_seconds_bucket"
                    "[$__rate_interval])))",
                    "{{target}} p50",
                ),
                Query(
                    "histogram_quantile(0.99, sum by (le, target) (rate("
                    "autoglm_predictor_refit_duration_seconds_bucket"
                    "[$__rate_interval])))",
                    "{{target}} p99",
                ),
            ],
            "s",
            width=8,
            min_value=0,
        )
    )


def dashboard() -> db.Dashboard:
    d = new_dashboard(
        "Predictor",
        UID,
        (
            "Forecasts against what happened, with the upper bound the autoscaler consumes; "
            "forecast error, coverage, the chosen models, and the predictor's health. Generated "
            "by dashboards/predictor.py."
        ),
        ["predictor"],
    ).variables(
        [
            variables.datasource(),
            variables.single_value_variable(
                "target", "target", "autoglm_forecast_observed", "Target", example="requests"
            ),
            variables.single_value_variable(
                "horizon",
                "horizon_seconds",
                'autoglm_forecast_value{target=~"$target"}',
                "Horizon (s)",
                example="300",
                sort=VariableSort.NUMERICAL_ASC,
            ),
        ]
    )
    for add in (_forecast_row, _models_row):
        d = add(d)
    return _health_row(d)
