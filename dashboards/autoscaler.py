"""Autoscaler: what it sees, what it proposes, what it decides, and whether it can act.

Reads the controller's own series (``autoglm_autoscaler_*``, labelled ``namespace`` and
``autoscaler`` after the GPUAutoscaler object). Proposals are the unclamped answers of the
observed metrics (reactive, the HPA's) and of the forecasts (predictive); desired is what the
decision kept after behavior, stabilization and min/max.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models.dashboard import (
    DynamicConfigValue,
    ValueMap,
    ValueMappingResult,
)

from dashboards import variables
from dashboards.base import new_dashboard
from dashboards.panels import Query, row, stat_panel, state_timeline_panel, timeseries_panel

UID = "autoglm-autoscaler"
SELECTOR = 'namespace=~"$namespace", autoscaler=~"$autoscaler"'
AS_LEGEND = "{{namespace}}/{{autoscaler}}"
DASHED = [
    DynamicConfigValue(id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}),
    DynamicConfigValue(id_val="custom.fillOpacity", value=0),
]


def _series(name: str) -> str:
    return f"autoglm_autoscaler_{name}{{{SELECTOR}}}"


def _per_autoscaler(name: str) -> str:
    return f"max by (namespace, autoscaler) ({_series(name)})"


def _increase_by(labels: str, name: str) -> str:
    return f"sum by ({labels}) (increase({_series(name)}[$__rate_interval]))"


def _replicas_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Load and replicas"))
    d = d.with_panel(
        stat_panel(
            "Current replicas",
            "How many replicas do the selected targets run now?",
            [Query(f"sum({_series('current_replicas')})")],
            "none",
            width=6,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Desired replicas",
            "How many did the last decisions ask for (after behavior and limits)?",
            [Query(f"sum({_series('desired_replicas')})")],
            "none",
            width=6,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Headroom to max",
            "How many more replicas may the targets grow by (maxReplicas - current)? 0 with "
            "proposals above it is AutoscalerAtMaxAndSaturated.",
            [
                Query(
                    f"sum({_series('max_replicas')}) - sum({_series('current_replicas')})",
                )
            ],
            "none",
            width=6,
            steps=((None, "red"), (1, "green")),
        )
    )
    d = d.with_panel(
        stat_panel(
            "Leader",
            "Does a controller replica hold the leader lease (and act)? Without election the "
            "only replica is the leader.",
            [Query("max(autoglm_autoscaler_leader)")],
            "bool_yes_no",
            width=6,
            steps=((None, "red"), (1, "green")),
        )
    )
    observed = timeseries_panel(
        "Observed, forecast and replicas",
        "Does capacity follow the load, ahead of it? Each metric's observed value (per pod for "
        "Pods metrics), its forecast upper bound at the prediction horizon and its target "
        "(dashed), with the replicas on the right axis.",
        [
            Query(f"{_series('metric_value')}", "{{metric}} observed"),
            Query(f"{_series('metric_forecast_upper')}", "{{metric}} forecast upper"),
            Query(f"{_series('metric_target')}", "{{metric}} target"),
            Query(f"sum({_series('current_replicas')})", "replicas"),
        ],
        "short",
        width=24,
        height=9,
        min_value=0,
    )
    observed = observed.override_by_regexp(".* target", DASHED).override_by_name(
        "replicas",
        [
            DynamicConfigValue(id_val="custom.axisPlacement", value="right"),
            DynamicConfigValue(id_val="unit", value="none"),
            DynamicConfigValue(id_val="custom.drawStyle", value="line"),
            DynamicConfigValue(id_val="custom.lineInterpolation", value="stepAfter"),
            DynamicConfigValue(id_val="custom.lineWidth", value=2),
        ],
    )
    d = d.with_panel(observed)
    d = d.with_panel(
        timeseries_panel(
            "Desired and current replicas",
            "Does the target follow the decisions? Desired against current, within the "
            "min and max (dashed).",
            [
                Query(f"sum({_series('desired_replicas')})", "desired"),
                Query(f"sum({_series('current_replicas')})", "current"),
                Query(f"sum({_series('min_replicas')})", "min"),
                Query(f"sum({_series('max_replicas')})", "max"),
            ],
            "none",
            min_value=0,
            dashed=["min", "max"],
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Reactive and predictive proposals",
            "Who wants what? Replicas the observed metrics propose (reactive, the HPA's answer) "
            "and those the forecasts propose (predictive, gaps where there is no forecast); the "
            "larger one drives the decision.",
            [
                Query(_per_autoscaler("reactive_proposal_replicas"), f"{AS_LEGEND} reactive"),
                Query(_per_autoscaler("predictive_proposal_replicas"), f"{AS_LEGEND} predictive"),
                Query(_per_autoscaler("desired_replicas"), f"{AS_LEGEND} desired"),
            ],
            "none",
            min_value=0,
        )
    )


def _decisions_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Decisions"))
    d = d.with_panel(
        timeseries_panel(
            "Decisions by driver",
            "Which input set the size? Decisions per reconcile by direction and driver "
            "(metric:NAME/reactive or /predictive, stabilization, policy limits, min/max, "
            "invalid metrics).",
            [
                Query(
                    _increase_by("direction, driver", "decisions_total"),
                    "{{direction}}: {{driver}}",
                )
            ],
            "none",
            min_value=0,
            bars=True,
            stacked=True,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Scale events",
            "When did the replica count change, and which way? Many ups and downs close "
            "together are flapping.",
            [Query(_increase_by("direction", "scale_events_total"), "{{direction}}")],
            "none",
            min_value=0,
            bars=True,
        )
    )
    d = d.with_panel(
        state_timeline_panel(
            "Conditions",
            "Can it scale? The HPA conditions: AbleToScale (the target can be read and "
            "written), ScalingActive (a replica count could be computed), ScalingLimited "
            "(min, max or a policy held the decision back).",
            [
                Query(
                    f"max by (namespace, autoscaler, condition) ({_series('condition')})",
                    f"{AS_LEGEND} {{{{condition}}}}",
                )
            ],
            width=12,
            steps=((None, "orange"), (1, "green")),
            mappings=[
                ValueMap(
                    options={
                        "0": ValueMappingResult(text="false", index=0),
                        "1": ValueMappingResult(text="true", index=1),
                    }
                )
            ],
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Errors by kind",
            "What goes wrong? Errors per second by kind (Prometheus, metric values, Kubernetes "
            "API, forecasts, exited workers); a metric with errors blocks scale-down.",
            [
                Query(
                    f"sum by (kind) (rate({_series('errors_total')}[$__rate_interval]))",
                    "{{kind}}",
                )
            ],
            "ops",
            width=12,
            min_value=0,
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Reconcile loop",
            "Is the loop alive and quick? p99 time of one reconcile and the time since the last "
            "completed one (about the interval, 15 s by default, when healthy).",
            [
                Query(
                    "histogram_quantile(0.99, sum by (le, namespace, autoscaler) (rate("
                    f"autoglm_autoscaler_reconcile_duration_seconds_bucket{{{SELECTOR}}}"
                    "[$__rate_interval])))",
                    f"{AS_LEGEND} p99 reconcile",
                ),
                Query(
                    f"time() - {_per_autoscaler('last_reconcile_timestamp_seconds')}",
                    f"{AS_LEGEND} since last",
                ),
            ],
            "s",
            width=24,
            min_value=0,
        )
    )


def dashboard() -> db.Dashboard:
    d = new_dashboard(
        "Autoscaler",
        UID,
        (
            "The GPU autoscaler: observed load, forecast and replicas; desired against current; "
            "reactive and predictive proposals; decisions by driver, scale events, conditions "
            "and errors. Generated by dashboards/autoscaler.py."
        ),
        ["autoscaler"],
    ).variables(
        [
            variables.datasource(),
            variables.label_variable(
                "namespace", "namespace", "autoglm_autoscaler_desired_replicas", "Namespace"
            ),
            variables.label_variable(
                "autoscaler",
                "autoscaler",
                'autoglm_autoscaler_desired_replicas{namespace=~"$namespace"}',
                "Autoscaler",
            ),
        ]
    )
    d = _replicas_row(d)
    return _decisions_row(d)
