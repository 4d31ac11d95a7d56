"""Best-effort work: are the paid GPUs busy, and is the online SLO still protected?

The fleet's paid GPU-time splits: busy with online requests, busy with best-effort work (batch
jobs on idle capacity), GPUs with no ready replica, and idle -- with best-effort work throttled
by the online latency slack, or for other reasons. The batchers' per-class busy seconds give the
first two, their readiness and throttle gauges the reasons; the GPUs the exporter reports
(``fleet:DCGM_FI_DEV_GPU_UTIL:count``) give what is paid for.
Beside that sit the signals that decide how much best-effort work runs: each replica's online
latency slack, the share its controller allows and why it refuses; and the jobs' progress
(``autoglm_job_*``), so an operator sees both what the backfill costs and what it delivers.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models.dashboard import ValueMap, ValueMappingResult

from dashboards import variables
from dashboards.base import link_to, new_dashboard
from dashboards.panels import Query, row, stat_panel, state_timeline_panel, timeseries_panel

UID = "autoglm-best-effort"
PAID_GPUS = "fleet:DCGM_FI_DEV_GPU_UTIL:count"
MODEL = 'model=~"$model"'
JOB = 'job_name=~"$job_name"'
ALERT = "AutoglmBestEffortHurtingOnlineSLO"


def _busy(request_class: str, selector: str = "") -> str:
    """GPUs' worth of device time one request class uses (busy seconds per second)."""
    labels = f'class="{request_class}"' + (f", {selector}" if selector else "")
    return f"sum(rate(autoglm_batcher_class_busy_seconds_total{{{labels}}}[$__rate_interval]))"


ONLINE, BEST_EFFORT = _busy("online"), _busy("best_effort")
# GPUs with no ready replica on them: starting (loading, warming up), stopping, or unallocated.
NOT_SERVING = f"clamp_min(sum({PAID_GPUS}) - sum(autoglm_batcher_ready), 0)"
# Idle device time of the replicas whose slack controller holds best-effort work at zero.
IDLE_THROTTLED = (
    "sum(clamp_min(1 - sum by (instance) (rate(autoglm_batcher_device_busy_seconds_total"
    "[$__rate_interval])), 0) * on (instance) max by (instance) "
    "(autoglm_batcher_best_effort_throttled))"
)
IDLE_OTHER = (
    f"clamp_min(sum({PAID_GPUS}) - ({ONLINE} + {BEST_EFFORT}) - {NOT_SERVING} - "
    f"{IDLE_THROTTLED}, 0)"
)


def _fleet_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Paid GPU-time: online, best-effort, idle"))
    d = d.with_panel(
        timeseries_panel(
            "Paid GPUs: online busy, best-effort busy, idle and why",
            "Where does the paid GPU-time go? Stacked, in GPUs: device time busy with online "
            "requests, with best-effort work, GPUs with no ready replica (starting, stopping or "
            "unallocated), idle time of replicas holding best-effort work at zero because their "
            "online latency slack is under its margin, and the rest idle (the jobs did not keep "
            "the replicas supplied, or the gaps were shorter than a best-effort slice); the top "
            "of the stack is every GPU the exporter reports. Best-effort work should fill what "
            "online leaves idle.",
            [
                Query(ONLINE, "online busy"),
                Query(BEST_EFFORT, "best-effort busy"),
                Query(NOT_SERVING, "no ready replica"),
                Query(IDLE_THROTTLED, "idle, best-effort throttled"),
                Query(IDLE_OTHER, "idle, other"),
            ],
            "none",
            width=16,
            height=9,
            min_value=0,
            stacked=True,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Busy share of paid GPU-time",
            "How much of the paid GPU-time does work (online and best-effort)? The goal with a "
            "best-effort backlog is 90%.",
            [Query(f"({ONLINE} + {BEST_EFFORT}) / sum({PAID_GPUS})")],
            "percentunit",
            width=8,
            height=3,
            steps=((None, "orange"), (0.7, "yellow"), (0.9, "green")),
            decimals=1,
        )
    )
    for title, description, busy in (
        ("Online busy share", "Share of paid GPU-time serving online requests.", ONLINE),
        (
            "Best-effort busy share",
            "Share of paid GPU-time doing best-effort work (batch jobs).",
            BEST_EFFORT,
        ),
    ):
        d = d.with_panel(
            stat_panel(
                title,
                description,
                [Query(f"{busy} / sum({PAID_GPUS})")],
                "percentunit",
                width=4,
                height=3,
                decimals=1,
            )
        )
    return d.with_panel(
        timeseries_panel(
            "Busy share: batchers against the exporter",
            "Do the batchers' busy seconds and the GPUs' own utilization agree? The batchers' "
            "busy share of paid GPU-time beside the mean DCGM_FI_DEV_GPU_UTIL; a gap means "
            "GPUs busy with something else, or not serving at all.",
            [
                Query(f"({ONLINE} + {BEST_EFFORT}) / sum({PAID_GPUS})", "batchers busy"),
                Query("fleet:DCGM_FI_DEV_GPU_UTIL:avg / 100", "GPU utilization (exporter)"),
            ],
            "percentunit",
            width=8,
            height=6,
            min_value=0,
        )
    )


def _protection_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Online SLO protection"))
    d = d.with_panel(
        timeseries_panel(
            "Online latency slack",
            "How far is each replica's recent online p99 from the SLO? SLO minus p99; at or "
            f"under the dashed zero line the SLO is missed, and {ALERT} fires when best-effort "
            "work still runs there.",
            [
                Query(
                    f"autoglm_batcher_online_latency_slack_seconds{{{MODEL}}}",
                    "{{instance}} {{model}}",
                ),
                Query("vector(0)", "slack gone"),
            ],
            "s",
            dashed=["slack gone"],
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Online p99 latency against the SLO",
            "Is online latency unchanged by the best-effort work? p99 of online requests "
            "(best-effort requests are never counted here) and the SLO, dashed.",
            [
                Query(
                    "histogram_quantile(0.99, sum by (le, model) (rate("
                    f"autoglm_batcher_request_latency_seconds_bucket{{{MODEL}}}"
                    "[$__rate_interval])))",
                    "p99 {{model}}",
                ),
                Query(f"max(autoglm_batcher_slo_seconds{{{MODEL}}})", "SLO"),
            ],
            "s",
            min_value=0,
            dashed=["SLO"],
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Best-effort share allowed",
            "How much device time may best-effort batches take on each replica? The slack "
            "controller's share: 1 with ample slack, shrinking as the slack nears its margin, "
            "0 when it is gone.",
            [
                Query(
                    f"autoglm_batcher_best_effort_share{{{MODEL}}}",
                    "{{instance}} {{model}}",
                )
            ],
            "percentunit",
            width=8,
            min_value=0,
            max_value=1,
        )
    )
    d = d.with_panel(
        state_timeline_panel(
            "Best-effort throttled",
            "When did each replica's controller hold best-effort work at zero?",
            [
                Query(
                    f"autoglm_batcher_best_effort_throttled{{{MODEL}}}",
                    "{{instance}} {{model}}",
                )
            ],
            width=8,
            steps=((None, "green"), (1, "orange")),
            mappings=[
                ValueMap(
                    options={
                        "0": ValueMappingResult(text="serving", index=0),
                        "1": ValueMappingResult(text="throttled", index=1),
                    }
                )
            ],
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Best-effort requests: served and refused",
            "How much best-effort work gets in? Best-effort requests answered per second, and "
            "those refused at once (HTTP 429) by reason: throttled by the slack controller, "
            "queue_full (no idle capacity), shutting_down.",
            [
                Query(
                    "sum(rate(autoglm_batcher_class_requests_total"
                    f'{{class="best_effort", outcome="ok", {MODEL}}}[$__rate_interval]))',
                    "served",
                ),
                Query(
                    "sum by (reason) (rate(autoglm_batcher_best_effort_refusals_total"
                    f"{{{MODEL}}}[$__rate_interval]))",
                    "refused: {{reason}}",
                ),
            ],
            "reqps",
            width=8,
            min_value=0,
        )
    )


def _jobs_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Batch jobs"))
    remaining = f"sum(autoglm_job_lines_remaining{{{JOB}}})"
    rate = f"sum(rate(autoglm_job_lines_total{{{JOB}}}[5m]))"
    d = d.with_panel(
        stat_panel(
            "Job progress",
            "What share of the selected jobs' lines is done (answered or in the errors file)?",
            [Query(f"1 - {remaining} / sum(autoglm_job_lines_in_shard{{{JOB}}})")],
            "percentunit",
            width=6,
            decimals=1,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Lines remaining",
            "Request lines not yet committed, over every shard of the selected jobs.",
            [Query(remaining)],
            "none",
            width=6,
        )
    )
    d = d.with_panel(
        stat_panel(
            "ETA at the last 5 minutes' rate",
            "When will the selected jobs finish if the idle capacity stays as it was? Lines "
            "remaining over the lines committed per second in the last 5 minutes.",
            [Query(f"{remaining} / {rate}")],
            "s",
            width=6,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Lines in the errors file (range)",
            "Lines the jobs could not get answered (malformed, refused as bad, failing) over "
            "the dashboard range; each is in its shard's errors file with its line number.",
            [
                Query(
                    f'sum(increase(autoglm_job_lines_total{{outcome="invalid", {JOB}}}[$__range]))'
                )
            ],
            "none",
            width=6,
            steps=((None, "green"), (1, "orange")),
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Lines committed per second",
            "How fast do the jobs go? Lines made durable per second, by job and outcome.",
            [
                Query(
                    "sum by (job_name, outcome) (rate(autoglm_job_lines_total"
                    f"{{{JOB}}}[$__rate_interval]))",
                    "{{job_name}} {{outcome}}",
                )
            ],
            "none",
            width=8,
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Job concurrency",
            "How many requests do the jobs keep in flight? The AIMD limit (it halves on each "
            "refusal, grows by one per window of successes at the limit), the requests actually "
            "in flight, and those held back by the rate limit or waiting to retry, summed over "
            "each job's pods.",
            [
                Query(
                    f"sum by (job_name) (autoglm_job_concurrency{{{JOB}}})",
                    "{{job_name}} limit",
                ),
                Query(
                    f"sum by (job_name) (autoglm_job_in_flight_requests{{{JOB}}})",
                    "{{job_name}} in flight",
                ),
                Query(
                    f"sum by (job_name, reason) (autoglm_job_waiting_requests{{{JOB}}})",
                    "{{job_name}} waiting ({{reason}})",
                ),
            ],
            "none",
            width=8,
            min_value=0,
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Job refusals and failures",
            "Why do job requests come back unanswered? Refusals (429/503: no idle capacity, "
            "the job backs off) and failures that are retried (connection, timeout, 5xx).",
            [
                Query(
                    "sum by (job_name) (rate(autoglm_job_refusals_total"
                    f"{{{JOB}}}[$__rate_interval]))",
                    "{{job_name}} refused",
                ),
                Query(
                    "sum by (job_name, reason) (rate(autoglm_job_request_failures_total"
                    f"{{{JOB}}}[$__rate_interval]))",
                    "{{job_name}} {{reason}}",
                ),
            ],
            "reqps",
            width=8,
            min_value=0,
        )
    )


def dashboard() -> db.Dashboard:
    d = (
        new_dashboard(
            "Best-effort work and utilization",
            UID,
            (
                "Paid GPU-time split into online busy, best-effort busy and idle; the online "
                "latency slack that throttles best-effort work; the batch jobs' progress. "
                "Generated by dashboards/best_effort.py."
            ),
            ["batcher", "jobs"],
            time_from="now-3h",
        )
        .variables(
            [
                variables.datasource(),
                variables.label_variable("model", "model", "autoglm_batcher_ready", "Model"),
                variables.label_variable(
                    "job_name", "job_name", "autoglm_job_lines_in_shard", "Job"
                ),
            ]
        )
        .link(link_to("Other dashboards"))
    )
    for add in (_fleet_row, _protection_row):
        d = add(d)
    return _jobs_row(d)
