"""GPU fleet overview: is the fleet used as intended, what does it cost, which GPUs need help."""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from dashboards import variables
from dashboards.annotations import xid_annotation
from dashboards.base import link_to, new_dashboard
from dashboards.expressions import GPU_KEY, MIB, hours_over_range, per_gpu
from dashboards.panels import (
    Column,
    Query,
    bar_gauge_panel,
    row,
    stat_panel,
    table_panel,
    timeseries_panel,
)
from dashboards.variables import GPU_SELECTOR, WORKLOAD_METRIC, WORKLOAD_SELECTOR

UID = "autoglm-gpu-fleet"
TARGET = "fleet:DCGM_FI_DEV_GPU_UTIL:target"
GPU_HOURS = "suffix: GPU-h"

UTIL = per_gpu("DCGM_FI_DEV_GPU_UTIL")
TEMPERATURE = per_gpu("DCGM_FI_DEV_GPU_TEMP")
FLEET_UTIL = f"avg({UTIL})"
# Colours for fleet utilization at the default target of 70%: under half the target is
# over-provisioned (blue), above the midpoint to 100% saturated (orange), as the alerts say.
UTILIZATION_STEPS = ((None, "blue"), (35, "green"), (85, "orange"), (95, "red"))
OUR_ALERTS = 'ALERTS{alertstate="firing", alertname=~"GPU.*|AutoglmExporter.*"}'


def _utilization_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Utilization against target"))
    d = d.with_panel(
        stat_panel(
            "Fleet GPU utilization",
            "Is the fleet as busy as intended? Mean utilization of the selected GPUs now.",
            [Query(FLEET_UTIL)],
            "percent",
            steps=UTILIZATION_STEPS,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Target utilization",
            f"The utilization the autoscaler aims for (recording rule {TARGET}).",
            [Query(TARGET)],
            "percent",
        )
    )
    d = d.with_panel(
        stat_panel(
            "GPUs",
            "How many GPUs report metrics (time-sliced GPUs counted once).",
            [Query(f"count({UTIL})")],
            "none",
        )
    )
    d = d.with_panel(
        stat_panel(
            "GPUs not readable",
            "Are GPUs lost? GPUs the exporters could not read in their last collection.",
            [Query("count(autoglm_exporter_gpu_up == 0) or vector(0)")],
            "none",
            steps=((None, "green"), (1, "red")),
        )
    )
    d = d.with_panel(
        stat_panel(
            "Firing GPU alerts",
            "How many of the project's GPU and exporter alerts fire now (see Alertmanager).",
            [Query(f"count({OUR_ALERTS}) or vector(0)")],
            "none",
            steps=((None, "green"), (1, "orange")),
        )
    )
    d = d.with_panel(
        stat_panel(
            "Energy used",
            "What did the selected GPUs draw over the dashboard's time range?",
            [
                Query(
                    "sum(max without (container, namespace, pod) "
                    f"(increase(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION{{{GPU_SELECTOR}}}"
                    "[$__range]))) / 3.6e9"
                )
            ],
            "kwatth",
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Utilization against target",
            "Does the fleet track its target? The dashed line is the target; the band between "
            "half of it and the midpoint to 100% is where no capacity alert fires.",
            [
                Query(FLEET_UTIL, "fleet"),
                Query(TARGET, "target"),
                Query(f"avg by (Hostname) ({UTIL})", "{{Hostname}}"),
            ],
            "percent",
            width=24,
            min_value=0,
            max_value=100,
            dashed=["target"],
        )
    )


def _gpu_hours_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("GPU-hours"))
    d = d.with_panel(
        stat_panel(
            "GPU-hours used",
            "How much GPU time did work use over the time range? Utilization integrated per "
            "GPU in 1-minute steps.",
            [Query(hours_over_range(f"{UTIL} / 100"))],
            GPU_HOURS,
            width=8,
            decimals=1,
        )
    )
    d = d.with_panel(
        stat_panel(
            "GPU-hours idle",
            "How much GPU time was paid for but not used over the time range?",
            [Query(hours_over_range(f"1 - {UTIL} / 100"))],
            GPU_HOURS,
            width=8,
            decimals=1,
            steps=((None, "green"), (100, "orange")),
        )
    )
    d = d.with_panel(
        stat_panel(
            "GPU-hours idle while allocated",
            "Of the idle time, how much sat on GPUs that pods held (waste no one else could use)?",
            [Query(hours_over_range(f"1 - {WORKLOAD_METRIC}{{{WORKLOAD_SELECTOR}}} / 100"))],
            GPU_HOURS,
            width=8,
            decimals=1,
            steps=((None, "green"), (50, "orange")),
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Busy and idle GPUs",
            "How many GPUs' worth of work runs, and how many GPUs' worth sits idle?",
            [
                Query(f"sum({UTIL}) / 100", "busy"),
                Query(f"count({UTIL}) - sum({UTIL}) / 100", "idle"),
            ],
            "none",
            width=24,
            stacked=True,
        )
    )


def _memory_power_row(d: db.Dashboard) -> db.Dashboard:
    used = per_gpu("DCGM_FI_DEV_FB_USED")
    free = per_gpu("DCGM_FI_DEV_FB_FREE")
    power = per_gpu("DCGM_FI_DEV_POWER_USAGE")
    limit = per_gpu("DCGM_FI_DEV_POWER_MGMT_LIMIT")
    d = d.with_row(row("Memory and power"))
    d = d.with_panel(
        timeseries_panel(
            "Framebuffer memory",
            "How much GPU memory is in use against what applications can use (dashed)?",
            [
                Query(f"sum({used}) * {MIB}", "used"),
                Query(f"sum({used} + {free}) * {MIB}", "usable"),
            ],
            "bytes",
            min_value=0,
            dashed=["usable"],
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Power draw",
            "How much power do the GPUs draw against their power limits (dashed)?",
            [Query(f"sum({power})", "draw"), Query(f"sum({limit})", "limit")],
            "watt",
            min_value=0,
            dashed=["limit"],
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Memory use by node",
            "Which nodes run short of GPU memory? Share of usable framebuffer in use.",
            [
                Query(
                    f"sum by (Hostname) ({used}) / sum by (Hostname) ({used} + {free})",
                    "{{Hostname}}",
                )
            ],
            "percentunit",
            min_value=0,
            max_value=1,
            steps=((None, "green"), (0.9, "orange"), (0.95, "red")),
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Power by node",
            "Which nodes draw the most power?",
            [Query(f"sum by (Hostname) ({power})", "{{Hostname}}")],
            "watt",
            min_value=0,
        )
    )


def _attention_row(d: db.Dashboard) -> db.Dashboard:
    def by_gpu(expr: str) -> str:
        return f"max by ({GPU_KEY}) ({expr})"

    d = d.with_row(row("GPUs that need attention"))
    return d.with_panel(
        table_panel(
            "GPU health",
            "Which GPUs need attention? One row per GPU, worst temperature headroom first; red "
            "cells are what the alerts fire on. GPUs that cannot be read at all are counted in "
            "'GPUs not readable' above.",
            ["Hostname", "gpu", "modelName"],
            [
                Column(
                    "Headroom to slowdown",
                    by_gpu(f"{per_gpu('DCGM_FI_DEV_SLOWDOWN_TEMP')} - {TEMPERATURE}"),
                    "celsius",
                    ((None, "red"), (5, "orange"), (10, "green")),
                ),
                Column(
                    "Memory used",
                    by_gpu(
                        f"{per_gpu('DCGM_FI_DEV_FB_USED')} / ({per_gpu('DCGM_FI_DEV_FB_USED')}"
                        f" + {per_gpu('DCGM_FI_DEV_FB_FREE')})"
                    ),
                    "percentunit",
                    ((None, "green"), (0.9, "orange"), (0.95, "red")),
                ),
                Column(
                    "Utilization",
                    by_gpu(UTIL),
                    "percent",
                    ((None, "blue"), (5, "green"), (95, "orange")),
                ),
                Column(
                    "Last Xid",
                    by_gpu(per_gpu("DCGM_FI_DEV_XID_ERRORS")),
                    "none",
                    ((None, "green"), (1, "red")),
                ),
                Column(
                    "Uncorrectable ECC errors",
                    by_gpu(per_gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL")),
                    "none",
                    ((None, "green"), (1, "red")),
                ),
                Column(
                    "Row remap pending",
                    by_gpu(per_gpu("DCGM_FI_DEV_ROW_REMAP_PENDING")),
                    "none",
                    ((None, "green"), (1, "orange")),
                ),
            ],
            sort_by="Headroom to slowdown",
            height=10,
        )
    )


def _workloads_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Workloads"))
    d = d.with_panel(
        bar_gauge_panel(
            "GPUs allocated by workload",
            "Who holds the GPUs? GPUs allocated to each workload's pods now.",
            [
                Query(
                    f"namespace_workload:DCGM_FI_DEV_GPU_UTIL:count{{{WORKLOAD_SELECTOR}}}",
                    "{{namespace}}/{{workload}}",
                )
            ],
            "none",
            width=8,
        )
    )
    d = d.with_panel(
        bar_gauge_panel(
            "Utilization by workload",
            "Which workloads use the GPUs they hold? Mean utilization of each workload's GPUs.",
            [
                Query(
                    f"namespace_workload:DCGM_FI_DEV_GPU_UTIL:avg{{{WORKLOAD_SELECTOR}}}",
                    "{{namespace}}/{{workload}}",
                )
            ],
            "percent",
            width=8,
            min_value=0,
            max_value=100,
            steps=((None, "red"), (5, "orange"), (35, "green")),
        )
    )
    idle_hours = (
        "sum by (namespace, workload) (sum_over_time((1 - "
        f"{WORKLOAD_METRIC}{{{WORKLOAD_SELECTOR}}} / 100)[$__range:1m])) / 60"
    )
    d = d.with_panel(
        bar_gauge_panel(
            "Idle GPU-hours by workload",
            "Which workloads waste the most GPU time over the time range?",
            [Query(idle_hours, "{{namespace}}/{{workload}}")],
            GPU_HOURS,
            width=8,
            steps=((None, "green"), (24, "orange")),
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Utilization by workload over time",
            "How does each workload's GPU utilization move through the day?",
            [
                Query(
                    f"namespace_workload:DCGM_FI_DEV_GPU_UTIL:avg{{{WORKLOAD_SELECTOR}}}",
                    "{{namespace}}/{{workload}}",
                )
            ],
            "percent",
            width=24,
            min_value=0,
            max_value=100,
        )
    )


def dashboard() -> db.Dashboard:
    d = (
        new_dashboard(
            "GPU fleet overview",
            UID,
            (
                "Fleet GPU utilization against its target, GPU-hours used and idle, memory, power, "
                "and the GPUs that need attention. Generated by dashboards/gpu_fleet.py."
            ),
            ["gpu"],
        )
        .variables(variables.standard())
        .annotation(xid_annotation())
        .link(link_to("GPU node"))
    )
    for add in (_utilization_row, _gpu_hours_row, _memory_power_row, _attention_row):
        d = add(d)
    return _workloads_row(d)
