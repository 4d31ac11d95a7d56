"""Batcher: is the model served within its SLO, how are batches formed, and where is the limit.

Reads the runtime's own series (``autoglm_batcher_*``) and the SLO recording rules of
``alerts/rules.yaml`` (``model:autoglm_batcher_requests:error_ratio_rate*``), so the burn rates
drawn here are the ones the alerts fire on.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db

from dashboards import variables
from dashboards.base import new_dashboard
from dashboards.panels import Query, bar_gauge_panel, row, stat_panel, timeseries_panel

UID = "autoglm-batcher"
SELECTOR = 'model=~"$model", instance=~"$instance"'
MODEL_SELECTOR = 'model=~"$model"'
OBJECTIVE = "fleet:autoglm_batcher_requests:slo_objective"
ERROR_RATIO = "model:autoglm_batcher_requests:error_ratio_rate{window}"
BURN_WINDOWS = ("5m", "30m", "1h", "6h")
# The burn rates at which the alerts fire (see alerts/rules.yaml, autoglm-batcher.alerts).
FAST_BURN, SLOW_BURN = 14.4, 6


def _series(name: str, selector: str = SELECTOR) -> str:
    return f"autoglm_batcher_{name}{{{selector}}}"


def _rate(name: str) -> str:
    return f"rate({_series(name)}[$__rate_interval])"


def _quantile(q: float, histogram: str) -> str:
    return f"histogram_quantile({q}, sum by (le) ({_rate(histogram + '_bucket')}))"


def _burn(window: str) -> str:
    ratio = ERROR_RATIO.format(window=window)
    return f"{ratio}{{{MODEL_SELECTOR}}} / scalar(1 - {OBJECTIVE})"


def _slo_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Requests and SLO"))
    d = d.with_panel(
        stat_panel(
            "Requests answered",
            "How much load is served? Requests answered with a result, per second.",
            [
                Query(
                    "sum(rate(autoglm_batcher_requests_total"
                    f'{{{SELECTOR}, outcome="ok"}}[$__rate_interval]))'
                )
            ],
            "reqps",
            width=6,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Good requests (1h)",
            "What share of requests met the SLO over the last hour (answered, within the latency "
            "SLO)? Compared with the objective "
            f"({OBJECTIVE}).",
            [Query(f"1 - max({ERROR_RATIO.format(window='1h')}{{{MODEL_SELECTOR}}})")],
            "percentunit",
            width=6,
            steps=((None, "red"), (0.99, "green")),
            decimals=2,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Error budget burn (1h)",
            "How fast is the error budget spent? 1 spends exactly the 30-day budget in 30 days; "
            f"{FAST_BURN:g} pages (with the 5m window), {SLOW_BURN:g} opens a ticket.",
            [Query(f"max({_burn('1h')})")],
            "none",
            width=6,
            steps=((None, "green"), (SLOW_BURN, "orange"), (FAST_BURN, "red")),
            decimals=1,
        )
    )
    d = d.with_panel(
        stat_panel(
            "Replicas ready",
            "How many batcher replicas accept requests (autoglm_batcher_ready)?",
            [Query(f"sum({_series('ready')})")],
            "none",
            width=6,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Requests by outcome",
            "What happens to requests? ok is served; rejected was refused at admission (429); "
            "timeout, model_error, out_of_memory and shutdown failed; invalid and cancelled are "
            "the client's doing.",
            [Query(f"sum by (outcome) ({_rate('requests_total')})", "{{outcome}}")],
            "reqps",
            stacked=True,
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Error budget burn rate",
            "Is the SLO at risk? Bad share of requests divided by the share the objective "
            "allows, over the alerts' four windows; the dashed lines are where they fire.",
            [
                *(Query(_burn(window), "{{model}} " + window) for window in BURN_WINDOWS),
                Query(f"vector({FAST_BURN})", "page"),
                Query(f"vector({SLOW_BURN})", "ticket"),
            ],
            "none",
            min_value=0,
            dashed=["page", "ticket"],
        )
    )


def _latency_row(d: db.Dashboard) -> db.Dashboard:
    slo = Query(f"max({_series('slo_seconds')})", "SLO")
    d = d.with_row(row("Latency"))
    d = d.with_panel(
        timeseries_panel(
            "Request latency against the SLO",
            "Do answers arrive within the SLO (dashed)? Arrival to answer, for requests that "
            "got a result, from the histogram (autoglm_batcher_request_latency_seconds).",
            [
                Query(_quantile(0.5, "request_latency_seconds"), "p50"),
                Query(_quantile(0.99, "request_latency_seconds"), "p99"),
                slo,
            ],
            "s",
            min_value=0,
            dashed=["SLO"],
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Queue and compute latency",
            "Where does the time go: waiting for a batch (queue) or running it (compute, per "
            "batch)? A queue share that grows with load means the device is the limit.",
            [
                Query(_quantile(0.5, "queue_latency_seconds"), "queue p50"),
                Query(_quantile(0.99, "queue_latency_seconds"), "queue p99"),
                Query(_quantile(0.5, "compute_latency_seconds"), "compute p50"),
                Query(_quantile(0.99, "compute_latency_seconds"), "compute p99"),
                slo,
            ],
            "s",
            min_value=0,
            dashed=["SLO"],
        )
    )


def _batching_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Batching and device"))
    d = d.with_panel(
        timeseries_panel(
            "Batch size against the adaptive cap",
            "How full are batches, and how far may they grow? Mean items per batch, the "
            "adaptive cap (shrinks on SLO misses and out-of-memory, grows with slack) and the "
            "configured maximum (dashed).",
            [
                Query(
                    f"sum({_rate('batch_size_items_sum')})"
                    f" / sum({_rate('batch_size_items_count')})",
                    "mean batch",
                ),
                Query(f"max({_series('batch_cap_items')})", "cap"),
                Query(f"max({_series('max_batch_size_items')})", "maximum"),
            ],
            "none",
            min_value=0,
            dashed=["maximum"],
        )
    )
    d = d.with_panel(
        bar_gauge_panel(
            "Batch size distribution",
            "How large are batches over the time range? Share of batches of at most N items "
            "(cumulative, from the histogram autoglm_batcher_batch_size_items).",
            [
                Query(
                    f"sum by (le) (increase({_series('batch_size_items_bucket')}[$__range])) "
                    f"/ ignoring (le) group_left "
                    f"sum(increase({_series('batch_size_items_count')}[$__range]))",
                    "≤ {{le}} items",
                )
            ],
            "percentunit",
            min_value=0,
            max_value=1,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Queue depth",
            "Is work piling up? Items and requests waiting for a batch, per replica.",
            [
                Query(f"sum by (instance) ({_series('queue_items')})", "{{instance}} items"),
                Query(f"sum by (instance) ({_series('queue_requests')})", "{{instance}} requests"),
            ],
            "none",
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Device busy",
            "How close is each replica's device to its limit? Fraction of time executing "
            "batches (rate of autoglm_batcher_device_busy_seconds_total); the batcher's own "
            "one-minute figure is dashed.",
            [
                Query(f"sum by (instance) ({_rate('device_busy_seconds_total')})", "{{instance}}"),
                Query(f"max({_series('device_busy_ratio')})", "busiest (1m)"),
            ],
            "percentunit",
            min_value=0,
            max_value=1,
            dashed=["busiest (1m)"],
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Device idle while work waited",
            "Is the device kept waiting with work queued? Share of time each replica's device "
            "sat idle between batches while the next batch's requests were already queued "
            "(autoglm_batcher_dispatch_gap_seconds), by cause: turnaround (the serving path "
            "handing the last outcome back, deciding and sending: a busy host raises it) or "
            "filling (the dispatch policy waited for a fuller batch).",
            [
                Query(
                    f"sum by (instance, cause) ({_rate('dispatch_gap_seconds_sum')})",
                    "{{instance}} {{cause}}",
                ),
            ],
            "percentunit",
            min_value=0,
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Fitted batch cost",
            "What does the batcher believe a batch costs? t(b) = c + a*b: fixed cost c and "
            "per-item cost a, fitted online; the cap and the dispatch deadlines come from them.",
            [
                Query(f"max by (instance) ({_series('cost_fixed_seconds')})", "{{instance}} c"),
                Query(f"max by (instance) ({_series('cost_per_item_seconds')})", "{{instance}} a"),
            ],
            "s",
            min_value=0,
        )
    )


def _memory_row(d: db.Dashboard) -> db.Dashboard:
    d = d.with_row(row("Memory and overload"))
    d = d.with_panel(
        timeseries_panel(
            "Allocator memory",
            "Is device memory fragmented? The CUDA caching allocator's allocated and reserved "
            "bytes, reserved but unallocated (cache and fragmentation) and inactive split "
            "blocks. CUDA only: a CPU replica has no such series.",
            [
                Query(f"sum({_series('memory_allocated_bytes')})", "allocated"),
                Query(f"sum({_series('memory_reserved_bytes')})", "reserved"),
                Query(
                    f"sum({_series('memory_reserved_unallocated_bytes')})", "reserved unallocated"
                ),
                Query(f"sum({_series('memory_inactive_split_bytes')})", "inactive split"),
            ],
            "bytes",
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Allocator retries and OOMs",
            "Does the allocator struggle? Allocations that succeeded only after flushing the "
            "cache, and out-of-memory errors it raised, per second. CUDA only.",
            [
                Query(f"sum({_rate('memory_alloc_retries_total')})", "retries"),
                Query(f"sum({_rate('memory_allocator_ooms_total')})", "allocator OOMs"),
            ],
            "ops",
            min_value=0,
        )
    )
    d = d.with_panel(
        timeseries_panel(
            "Out-of-memory events and splits",
            "Do batches run out of memory? Batches that hit out-of-memory (each is split in two "
            "and retried, and the cap shrinks) and cached memory released after idle periods.",
            [
                Query(f"sum(increase({_series('oom_events_total')}[$__rate_interval]))", "OOMs"),
                Query(
                    f"sum(increase({_series('batch_splits_total')}[$__rate_interval]))", "splits"
                ),
                Query(
                    f"sum(increase({_series('memory_releases_total')}[$__rate_interval]))",
                    "memory releases",
                ),
            ],
            "none",
            min_value=0,
            bars=True,
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Rejections",
            "Which replicas refuse requests at admission (HTTP 429: queue full or too much work "
            "ahead for the request's timeout)? Share of each replica's requests; the dashed line "
            "is where BatcherRejectingRequests fires.",
            [
                Query(
                    "sum by (instance) (rate(autoglm_batcher_requests_total"
                    f'{{{SELECTOR}, outcome="rejected"}}[$__rate_interval])) '
                    f"/ sum by (instance) ({_rate('requests_total')})",
                    "{{instance}}",
                ),
                Query("vector(0.05)", "alert"),
            ],
            "percentunit",
            min_value=0,
            dashed=["alert"],
        )
    )


def _workers_row(d: db.Dashboard) -> db.Dashboard:
    """Front worker processes (``--workers N``); a one-process batcher has none of these series,
    so both panels stay empty there."""
    d = d.with_row(row("Front workers (--workers)"))
    d = d.with_panel(
        timeseries_panel(
            "Front worker restarts",
            "Do front worker processes keep exiting? Workers the engine started again after one "
            "exited on a fault, per replica; each exit dropped the requests it held. "
            "BatcherFrontWorkersRestarting fires at three in an hour.",
            [
                Query(
                    "sum by (instance) (increase(autoglm_batcher_worker_restarts_total"
                    '{instance=~"$instance"}[$__rate_interval]))',
                    "{{instance}}",
                )
            ],
            "none",
            min_value=0,
            bars=True,
        )
    )
    return d.with_panel(
        timeseries_panel(
            "Requests per front worker",
            "Does the kernel spread connections over the workers, and does one stop answering? "
            "HTTP requests each worker answered per second, by replica and worker.",
            [
                Query(
                    "sum by (instance, worker) (rate(autoglm_batcher_worker_requests_total"
                    '{instance=~"$instance"}[$__rate_interval]))',
                    "{{instance}} worker {{worker}}",
                )
            ],
            "reqps",
            min_value=0,
        )
    )


def dashboard() -> db.Dashboard:
    d = new_dashboard(
        "Batcher",
        UID,
        (
            "The batching runtime: requests and the SLO's error budget, latency against the SLO, "
            "batch sizes and the adaptive cap, queue, device, memory and overload, and the front "
            "worker processes. Generated by dashboards/batcher.py."
        ),
        ["batcher"],
        time_from="now-3h",
    ).variables(
        [
            variables.datasource(),
            variables.label_variable("model", "model", "autoglm_batcher_ready", "Model"),
            variables.label_variable(
                "instance",
                "instance",
                'autoglm_batcher_ready{model=~"$model"}',
                "Replica",
            ),
        ]
    )
    for add in (_slo_row, _latency_row, _batching_row, _memory_row):
        d = add(d)
    return _workers_row(d)
