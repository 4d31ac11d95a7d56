"""The thresholds a dashboard draws are the ones its alerts fire at.

Dashboards draw an alert's limit as a line or a colour step, so an operator sees how close a
series is to paging; the limit itself is written in ``alerts/rules.yaml``. These tests fail
when one is changed without the other.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dashboards import batcher as batcher_dashboard
from dashboards import predictor as predictor_dashboard
from predictor.config import TargetConfig
from predictor.target_state import NOT_FITTED_FLOOR_SECONDS, TargetState

RULES = Path(__file__).resolve().parents[2] / "alerts" / "rules.yaml"


def _alert_expr(name: str) -> str:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    (expr,) = [r["expr"] for g in groups for r in g["rules"] if r.get("alert") == name]
    return " ".join(expr.split())


@pytest.mark.parametrize(
    ("alert", "threshold"),
    [
        ("PredictorForecastErrorHigh", f"> {predictor_dashboard.ERROR_LIMIT}"),
        ("PredictorForecastStale", f"> {predictor_dashboard.STALE_SECONDS}"),
        ("PredictorTargetNotFitted", f"> {predictor_dashboard.NOT_FITTED_LIMIT}"),
        ("BatcherErrorBudgetBurnFast", f"> {batcher_dashboard.FAST_BURN} * (1 -"),
        ("BatcherErrorBudgetBurnSlow", f"> {batcher_dashboard.SLOW_BURN} * (1 -"),
    ],
)
def test_a_dashboards_threshold_is_its_alerts(alert: str, threshold: str) -> None:
    # Not followed by another digit: 0.5 must not pass for 0.55.
    assert re.search(re.escape(threshold) + r"(?![\d.])", _alert_expr(alert)), _alert_expr(alert)


def test_the_predictors_late_wait_warning_uses_the_alerts_limit() -> None:
    """The predictor logs ``still too few points`` at the limit PredictorTargetNotFitted fires
    at: twice the history needed, and at least the floor the rule clamps to."""
    assert f"{NOT_FITTED_FLOOR_SECONDS:g})" in predictor_dashboard.NOT_FITTED_LIMIT
    assert "2 * autoglm_predictor_history_needed_seconds" in predictor_dashboard.NOT_FITTED_LIMIT
    short = TargetState(TargetConfig(name="a", query="q", step=60, horizons=(1,)))
    long = TargetState(TargetConfig(name="b", query="q", step=3600, horizons=(1, 8)))
    assert short.not_fitted_limit == NOT_FITTED_FLOOR_SECONDS
    assert long.not_fitted_limit == 2 * long.min_points * 3600
