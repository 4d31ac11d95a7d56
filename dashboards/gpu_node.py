"""GPU node: every exporter metric per GPU, with Xid errors and clock throttling as annotations."""

from __future__ import annotations

from typing import Any

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.builders import timeseries
from grafana_foundation_sdk.models.dashboard import (
    ValueMap,
    ValueMappingResult,
    VariableRefresh,
    VariableSort,
)

from dashboards import variables
from dashboards.annotations import REASONS, XID_SERIES, throttle_annotation, xid_annotation
from dashboards.base import link_to, new_dashboard
from dashboards.expressions import (
    GPU_LEGEND,
    MIB,
    new_or_increased,
    per_gpu,
    per_gpu_rate,
)
from dashboards.panels import (
    Column,
    Query,
    row,
    state_timeline_panel,
    table_panel,
    timeseries_panel,
)
from dashboards.variables import DEVICE_SELECTOR, GPU_SELECTOR

UID = "autoglm-gpu-node"
INSTANCE_SELECTOR = 'instance=~"$instance"'

CRITICAL_XIDS = "48|63|64|74|79|94|95"
REASON_NAMES = {
    0: "none",
    1: "idle",
    4: "power cap",
    5: "power cap",  # with idle
    8: "HW slowdown",
    96: "thermal",
    100: "thermal + power cap",
    128: "power brake",
}


def _instance_variable() -> db.QueryVariable:
    """Exporter instances of the selected nodes, for the exporter's own (node-level) metrics."""
    return (
        db.QueryVariable("instance")
        .label("Exporter")
        .datasource(variables.DATASOURCE)
        .query('label_values(DCGM_FI_DEV_GPU_UTIL{Hostname=~"$node"}, instance)')
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(VariableSort.ALPHABETICAL_ASC)
        .multi(True)
        .include_all(True)
        .all_value(variables.ALL)
    )


def _gauge(
    title: str, description: str, metric: str, unit: str, **options: Any
) -> timeseries.Panel:
    return timeseries_panel(
        title, description, [Query(per_gpu(metric), GPU_LEGEND)], unit, **options
    )


def _utilization(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Utilization"))
    d = d.with_panel(
        _gauge(
            "GPU utilization",
            "How busy is each GPU? Share of time a kernel ran (DCGM_FI_DEV_GPU_UTIL).",
            "DCGM_FI_DEV_GPU_UTIL",
            "percent",
            min_value=0,
            max_value=100,
        )
    )
    d = d.with_panel(
        _gauge(
            "Memory copy utilization",
            "How busy is each GPU's memory interface? (DCGM_FI_DEV_MEM_COPY_UTIL)",
            "DCGM_FI_DEV_MEM_COPY_UTIL",
            "percent",
            min_value=0,
            max_value=100,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Video encoder and decoder",
            "Are the video engines used? (DCGM_FI_DEV_ENC_UTIL, DCGM_FI_DEV_DEC_UTIL)",
            [
                Query(per_gpu("DCGM_FI_DEV_ENC_UTIL"), f"{GPU_LEGEND} encoder"),
                Query(per_gpu("DCGM_FI_DEV_DEC_UTIL"), f"{GPU_LEGEND} decoder"),
            ],
            "percent",
            min_value=0,
            max_value=100,
        )
    )
    return d.with_panel(
        table_panel(
            "Pods on these GPUs",
            "Which pods hold these GPUs, and how busy are they? From kubelet pod-resources.",
            ["Hostname", "gpu", "namespace", "pod", "container"],
            [
                Column(
                    "Utilization",
                    f"max by (Hostname, gpu, namespace, pod, container) "
                    f'(DCGM_FI_DEV_GPU_UTIL{{{GPU_SELECTOR}, pod!=""}})',
                    "percent",
                    ((None, "blue"), (5, "green"), (95, "orange")),
                )
            ],
            sort_by="Utilization",
            width=12,
        )
    )


def _profiling(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Profiling (NVML GPM; absent on GPUs without it)"))
    ratios = (
        (
            "Graphics engine active",
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "How often is the engine busy?",
        ),
        ("SM active", "DCGM_FI_PROF_SM_ACTIVE", "Do kernels fill the SMs?"),
        ("SM occupancy", "DCGM_FI_PROF_SM_OCCUPANCY", "How many warps are resident per SM?"),
        ("Tensor pipe active", "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "Do kernels use tensor cores?"),
        ("DRAM active", "DCGM_FI_PROF_DRAM_ACTIVE", "Is the workload memory-bound?"),
    )
    for title, metric, question in ratios:
        d = d.with_panel(
            _gauge(
                title,
                f"{question} ({metric})",
                metric,
                "percentunit",
                width=8,
                min_value=0,
                max_value=1,
            )
        )
    return d.with_panel(
        timeseries_panel(
            "PCIe traffic",
            "How much data crosses PCIe? (DCGM_FI_PROF_PCIE_TX_BYTES, DCGM_FI_PROF_PCIE_RX_BYTES)",
            [
                Query(per_gpu("DCGM_FI_PROF_PCIE_TX_BYTES"), f"{GPU_LEGEND} tx"),
                Query(per_gpu("DCGM_FI_PROF_PCIE_RX_BYTES"), f"{GPU_LEGEND} rx"),
            ],
            "Bps",
            width=8,
            min_value=0,
        )
    )


def _memory(d: db.Dashboard) -> db.Dashboard:
    used, free = per_gpu("DCGM_FI_DEV_FB_USED"), per_gpu("DCGM_FI_DEV_FB_FREE")
    d = d.with_row(row("Memory"))
    d = d.with_panel(
        timeseries_panel(
            "Framebuffer used",
            "How full is each GPU's memory? Share of usable framebuffer in use; the alert "
            "fires above 95% for 10 minutes.",
            [Query(f"{used} / ({used} + {free})", GPU_LEGEND)],
            "percentunit",
            min_value=0,
            max_value=1,
            steps=((None, "green"), (0.9, "orange"), (0.95, "red")),
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Framebuffer used and free",
            "How many bytes are used and free? (DCGM_FI_DEV_FB_USED, DCGM_FI_DEV_FB_FREE)",
            [
                Query(f"{used} * {MIB}", f"{GPU_LEGEND} used"),
                Query(f"{free} * {MIB}", f"{GPU_LEGEND} free"),
            ],
            "bytes",
            min_value=0,
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Framebuffer total and reserved",
            "How big is each GPU's memory, and how much do driver and firmware keep? "
            "(DCGM_FI_DEV_FB_TOTAL, DCGM_FI_DEV_FB_RESERVED)",
            [
                Query(f"{per_gpu('DCGM_FI_DEV_FB_TOTAL')} * {MIB}", f"{GPU_LEGEND} total"),
                Query(f"{per_gpu('DCGM_FI_DEV_FB_RESERVED')} * {MIB}", f"{GPU_LEGEND} reserved"),
            ],
            "bytes",
            width=24,
            min_value=0,
        )
    )


def _power_thermal(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Power and temperature"))
    d = d.with_panel(
        timeseries_panel(
            "Power draw against limit",
            "How close is each GPU to its power limit (dashed)? At the limit clocks drop. "
            "(DCGM_FI_DEV_POWER_USAGE, DCGM_FI_DEV_POWER_MGMT_LIMIT)",
            [
                Query(per_gpu("DCGM_FI_DEV_POWER_USAGE"), GPU_LEGEND),
                Query(f"max({per_gpu('DCGM_FI_DEV_POWER_MGMT_LIMIT')})", "power limit"),
            ],
            "watt",
            min_value=0,
            dashed=["power limit"],
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Average power from energy",
            "What did each GPU draw on average per interval? Derived from the energy counter "
            "(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, mJ) so short spikes between scrapes count.",
            [Query(f"{per_gpu_rate('DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION')} / 1000", GPU_LEGEND)],
            "watt",
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "GPU temperature against limits",
            "How close is each GPU to slowing down (dashed) or shutting down (dotted)? "
            "(DCGM_FI_DEV_GPU_TEMP, DCGM_FI_DEV_SLOWDOWN_TEMP, DCGM_FI_DEV_SHUTDOWN_TEMP)",
            [
                Query(per_gpu("DCGM_FI_DEV_GPU_TEMP"), GPU_LEGEND),
                Query(f"min({per_gpu('DCGM_FI_DEV_SLOWDOWN_TEMP')})", "slowdown"),
                Query(f"min({per_gpu('DCGM_FI_DEV_SHUTDOWN_TEMP')})", "shutdown"),
            ],
            "celsius",
            dashed=["slowdown", "shutdown"],
        )
    )
    return d.with_panel(
        _gauge(
            "Memory temperature",
            "Is the HBM running hot? (DCGM_FI_DEV_MEMORY_TEMP; absent on GDDR parts)",
            "DCGM_FI_DEV_MEMORY_TEMP",
            "celsius",
        )
    )


def _clocks(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Clocks and throttling"))
    d = d.with_panel(
        _gauge(
            "SM clock",
            "Does each GPU run at full clock? Drops under load mean power or thermal "
            "throttling. (DCGM_FI_DEV_SM_CLOCK)",
            "DCGM_FI_DEV_SM_CLOCK",
            "rotmhz",
            min_value=0,
        )
    )
    d = d.with_panel(
        _gauge(
            "Memory clock",
            "Memory clock of each GPU (DCGM_FI_DEV_MEM_CLOCK).",
            "DCGM_FI_DEV_MEM_CLOCK",
            "rotmhz",
            min_value=0,
        )
    )
    return d.with_panel(
        state_timeline_panel(
            "Clock event reasons",
            "Why are clocks held below maximum? NVML clocks event reasons bitmask "
            f"({REASONS}); names for the common values, the number otherwise.",
            [Query(per_gpu(REASONS), GPU_LEGEND)],
            steps=((None, "green"), (2, "orange"), (32, "red")),
            mappings=[
                ValueMap(
                    options={
                        str(value): ValueMappingResult(text=name, index=i)
                        for i, (value, name) in enumerate(REASON_NAMES.items())
                    }
                )
            ],
        )
    )


def _interconnect(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Interconnect"))
    d = d.with_panel(
        timeseries_panel(
            "NVLink traffic",
            "How much data moves between GPUs over NVLink? "
            "(DCGM_FI_PROF_NVLINK_TX_BYTES, DCGM_FI_PROF_NVLINK_RX_BYTES)",
            [
                Query(per_gpu("DCGM_FI_PROF_NVLINK_TX_BYTES"), f"{GPU_LEGEND} tx"),
                Query(per_gpu("DCGM_FI_PROF_NVLINK_RX_BYTES"), f"{GPU_LEGEND} rx"),
            ],
            "Bps",
            width=8,
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "NVLink bandwidth counter rate",
            "Rate of DCGM's NVLink bandwidth counter, summed over links "
            "(DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL).",
            [Query(per_gpu_rate("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"), GPU_LEGEND)],
            "short",
            width=8,
            min_value=0,
        )
    )
    return d.with_panel(
        timeseries_panel(
            "PCIe replays",
            "Is a PCIe link flaky? Retries per second (DCGM_FI_DEV_PCIE_REPLAY_COUNTER).",
            [Query(per_gpu_rate("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"), GPU_LEGEND)],
            "short",
            width=8,
            min_value=0,
            steps=((None, "green"), (1, "orange")),
        )
    )


def _errors(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Errors"))
    d = d.with_panel(
        timeseries_panel(
            "Xid errors by code",
            "Which Xids did the driver report? Events per code in each interval; codes "
            f"{CRITICAL_XIDS.replace('|', ', ')} fire GPUCriticalXid "
            "(autoglm_gpu_xid_errors_total).",
            [
                Query(
                    new_or_increased(XID_SERIES, "$__rate_interval"),
                    f"{GPU_LEGEND} Xid {{{{xid}}}}",
                )
            ],
            "short",
            width=8,
            min_value=0,
            bars=True,
        )
    )
    d = d.with_panel(
        _gauge(
            "Last Xid code",
            "Code of the most recent Xid, held for the exporter's --xid-hold window, then 0 "
            "(DCGM_FI_DEV_XID_ERRORS).",
            "DCGM_FI_DEV_XID_ERRORS",
            "none",
            width=8,
            steps=((None, "green"), (1, "red")),
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Time since last Xid",
            "How long ago did each GPU last report an Xid? "
            "(autoglm_gpu_last_xid_timestamp_seconds)",
            [
                Query(
                    f"time() - autoglm_gpu_last_xid_timestamp_seconds{{{DEVICE_SELECTOR}}}",
                    GPU_LEGEND,
                )
            ],
            "s",
            width=8,
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "ECC errors",
            "Does memory lose bits? Single-bit errors are corrected, double-bit ones are not "
            "(DCGM_FI_DEV_ECC_SBE_VOL_TOTAL, DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, since driver load).",
            [
                Query(per_gpu("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"), f"{GPU_LEGEND} single-bit"),
                Query(per_gpu("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"), f"{GPU_LEGEND} double-bit"),
            ],
            "short",
            width=8,
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Remapped memory rows",
            "How many rows were retired to spares? (DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS, "
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS)",
            [
                Query(
                    per_gpu("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"), f"{GPU_LEGEND} correctable"
                ),
                Query(
                    per_gpu("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"),
                    f"{GPU_LEGEND} uncorrectable",
                ),
            ],
            "short",
            width=8,
            min_value=0,
        )
    )
    return d.with_panel(
        state_timeline_panel(
            "Row remap pending or failed",
            "Does a GPU need a reset (pending) or replacing (failed)? "
            "(DCGM_FI_DEV_ROW_REMAP_PENDING, DCGM_FI_DEV_ROW_REMAP_FAILURE)",
            [
                Query(per_gpu("DCGM_FI_DEV_ROW_REMAP_PENDING"), f"{GPU_LEGEND} pending"),
                Query(per_gpu("DCGM_FI_DEV_ROW_REMAP_FAILURE"), f"{GPU_LEGEND} failed"),
            ],
            width=8,
            steps=((None, "green"), (1, "red")),
        )
    )


def _exporter_health(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Exporter health"))
    d = d.with_panel(
        state_timeline_panel(
            "GPUs readable",
            "Could the exporter read each GPU in its last collection? 0 means lost or hung "
            "(autoglm_exporter_gpu_up).",
            [Query(f"autoglm_exporter_gpu_up{{{INSTANCE_SELECTOR}}}", "{{instance}} GPU {{gpu}}")],
            width=12,
            steps=((None, "red"), (1, "green")),
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Collection errors",
            "Which reads fail and why? Failed reads per second by GPU, field and reason "
            "(autoglm_exporter_collect_errors_total).",
            [
                Query(
                    f"rate(autoglm_exporter_collect_errors_total{{{INSTANCE_SELECTOR}}}"
                    "[$__rate_interval])",
                    "{{instance}} GPU {{gpu}} {{field}} {{reason}}",
                )
            ],
            "short",
            width=12,
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Collection duration and snapshot age",
            "Is the data fresh? How long collections take (p99 and mean over every collection "
            "in the interval, and the last one) and how old the served snapshot is at scrape "
            "time (autoglm_exporter_collection_seconds, "
            "autoglm_exporter_collection_duration_seconds, autoglm_exporter_snapshot_age_seconds).",
            [
                Query(
                    "histogram_quantile(0.99, sum by (instance, le) (rate("
                    f"autoglm_exporter_collection_seconds_bucket{{{INSTANCE_SELECTOR}}}"
                    "[$__rate_interval])))",
                    "{{instance}} collection p99",
                ),
                Query(
                    f"rate(autoglm_exporter_collection_seconds_sum{{{INSTANCE_SELECTOR}}}"
                    "[$__rate_interval]) / rate(autoglm_exporter_collection_seconds_count"
                    f"{{{INSTANCE_SELECTOR}}}[$__rate_interval])",
                    "{{instance}} collection mean",
                ),
                Query(
                    f"autoglm_exporter_collection_duration_seconds{{{INSTANCE_SELECTOR}}}",
                    "{{instance}} last collection",
                ),
                Query(
                    f"autoglm_exporter_snapshot_age_seconds{{{INSTANCE_SELECTOR}}}",
                    "{{instance}} snapshot age",
                ),
            ],
            "s",
            width=8,
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Collections and overruns",
            "Does the loop keep its schedule? Collections and deadline overruns per second, and "
            "GPU reads still hung past their deadline (autoglm_exporter_collections_total, "
            "autoglm_exporter_collection_overruns_total, autoglm_exporter_hung_reads).",
            [
                Query(
                    f"rate(autoglm_exporter_collections_total{{{INSTANCE_SELECTOR}}}"
                    "[$__rate_interval])",
                    "{{instance}} collections",
                ),
                Query(
                    f"rate(autoglm_exporter_collection_overruns_total{{{INSTANCE_SELECTOR}}}"
                    "[$__rate_interval])",
                    "{{instance}} overruns",
                ),
                Query(
                    f"autoglm_exporter_hung_reads{{{INSTANCE_SELECTOR}}}",
                    "{{instance}} hung reads",
                ),
            ],
            "short",
            width=8,
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Time since last success",
            "How old is the newest snapshot, and the newest reading of any GPU? "
            "(autoglm_exporter_snapshot_timestamp_seconds, "
            "autoglm_exporter_last_success_timestamp_seconds)",
            [
                Query(
                    f"time() - autoglm_exporter_snapshot_timestamp_seconds{{{INSTANCE_SELECTOR}}}",
                    "{{instance}} snapshot",
                ),
                Query(
                    "time() - "
                    f"autoglm_exporter_last_success_timestamp_seconds{{{INSTANCE_SELECTOR}}}",
                    "{{instance}} any GPU read",
                ),
            ],
            "s",
            width=8,
            min_value=0,
            steps=((None, "green"), (60, "red")),
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Pod attribution",
            "Does the exporter reach the kubelet pod-resources API, and when did it last? "
            "(autoglm_exporter_pod_resources_up, "
            "autoglm_exporter_pod_resources_last_success_timestamp_seconds)",
            [
                Query(
                    f"autoglm_exporter_pod_resources_up{{{INSTANCE_SELECTOR}}}",
                    "{{instance}} up",
                ),
                Query(
                    "time() - autoglm_exporter_pod_resources_last_success_timestamp_seconds"
                    f"{{{INSTANCE_SELECTOR}}}",
                    "{{instance}} seconds since last List",
                ),
            ],
            "short",
            width=24,
            min_value=0,
        )
    )


def dashboard() -> db.Dashboard:
    d = (
        new_dashboard(
            "GPU node",
            UID,
            (
                "Every exporter metric per node and GPU, with Xid errors and clock throttling as "
                "annotations. Generated by dashboards/gpu_node.py."
            ),
            ["gpu"],
            time_from="now-3h",
        )
        .variables([*variables.standard(workload=False), _instance_variable()])
        .annotation(xid_annotation())
        .annotation(throttle_annotation())
        .link(link_to("GPU fleet overview"))
    )
    for add in (
        _utilization,
        _profiling,
        _memory,
        _power_thermal,
        _clocks,
        _interconnect,
        _errors,
    ):
        d = add(d)
    return _exporter_health(d)
