"""``autoglm-autoscaler simulate``: replay a request trace through a scaling policy.

Example::

    autoglm-autoscaler simulate --trace requests.csv --time-column TIMESTAMP \\
        --policy predictive --c 1.5 --a 0.4 --max-batch 8 --cold-start 120 \\
        --slo-seconds 8 --json out.json --plot out.png
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Literal

from autoglm.config import ConfigError, load_config
from autoglm.logs import setup_logging
from autoscaler.core.slo_sizing import ServiceModel
from autoscaler.simulator.engine import SimulationConfig, simulate
from autoscaler.simulator.report import plot, summarise, write_json
from autoscaler.simulator.trace import TraceError, load_trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimulateSettings:
    trace: str = field(default="", metadata={"help": "CSV file with one request per row"})
    policy: Literal["static", "hpa", "predictive"] = field(
        default="hpa", metadata={"help": "scaling policy to replay"}
    )
    time_column: str = field(default="TIMESTAMP", metadata={"help": "column with request times"})
    time_format: str = field(
        default="auto", metadata={"help": "auto, epoch_s, epoch_ms or a strftime pattern"}
    )
    work_column: str = field(
        default="",
        metadata={"help": "optional column with per-request work (e.g. exec_time_seconds)"},
    )
    speed: float = field(
        default=1.0, metadata={"help": "time compression: 24 replays a day in 1 h"}
    )
    c: float = field(default=1.0, metadata={"help": "batch service time intercept c (seconds)"})
    a: float = field(
        default=0.25, metadata={"help": "batch service time per average request a (seconds)"}
    )
    a_from_work: bool = field(
        default=False,
        metadata={"help": "set a to the work column's mean (e.g. measured seconds per request)"},
    )
    max_batch: int = field(default=8, metadata={"help": "largest batch a replica serves"})
    cold_start: float = field(
        default=120.0, metadata={"help": "seconds before a new replica serves"}
    )
    target_utilization: float = field(
        default=0.7, metadata={"help": "share of a replica's full-batch throughput to aim at"}
    )
    slo_seconds: float = field(default=10.0, metadata={"help": "latency SLO in seconds"})
    slo_on: Literal["latency", "queueing"] = field(
        default="latency", metadata={"help": "what the SLO bounds: end-to-end or waiting time"}
    )
    min_replicas: int = field(default=1, metadata={"help": "minReplicas"})
    max_replicas: int = field(default=64, metadata={"help": "maxReplicas"})
    scale_down_window: int = field(
        default=-1,
        metadata={"help": "scale-down stabilization seconds (-1: the HPA default, 300)"},
    )
    queue_target: float = field(
        default=0.0,
        metadata={"help": "waiting requests per replica as a second metric (0: rate only)"},
    )
    forecast_step: float = field(default=60.0, metadata={"help": "forecast series step (seconds)"})
    forecast_quantile: float = field(default=0.9, metadata={"help": "forecast upper quantile"})
    forecast_season: list[float] = field(
        default_factory=lambda: [86400.0, 604800.0],
        metadata={"help": "forecast seasons in trace seconds before --speed"},
    )
    forecast_model: list[str] = field(
        default_factory=list,
        metadata={"help": "restrict the predictor's candidate models (default: all)"},
    )
    forecast_series: Literal["mean", "peak"] = field(
        default="mean", metadata={"help": "forecast each step's mean rate or its peak"}
    )
    forecast_refit: float = field(
        default=86400.0, metadata={"help": "seconds between model selections and refits"}
    )
    forecast_lookback: float = field(
        default=14 * 86400.0,
        metadata={"help": "seconds of history the predictor fits and calibrates on"},
    )
    score_from: float = field(
        default=0.0, metadata={"help": "seconds of replay (after --speed) left out of the SLO"}
    )
    json: str = field(default="", metadata={"help": "write the summary as JSON here"})
    plot: str = field(default="", metadata={"help": "write a PNG plot here"})
    log_level: str = field(default="info", metadata={"help": "debug, info, warning, error"})
    log_format: Literal["json", "text"] = field(default="text", metadata={"help": "log format"})

    def __post_init__(self) -> None:
        if not self.trace:
            raise ConfigError("--trace is required (a CSV file of requests)")
        if self.speed <= 0:
            raise ConfigError("--speed must be > 0")
        if self.queue_target < 0:
            raise ConfigError("--queue-target must be >= 0 waiting requests per replica")
        if self.a_from_work and not self.work_column:
            raise ConfigError("--a-from-work needs --work-column")


def simulate_main(argv: list[str] | None) -> int:
    """Run one policy on a trace; print the summary; exit 0, or 2 on bad input."""
    settings = load_config(SimulateSettings, argv, prog="autoglm-autoscaler simulate")
    setup_logging("autoscaler", settings.log_level, settings.log_format)
    try:
        trace = load_trace(
            settings.trace,
            time_column=settings.time_column,
            time_format=settings.time_format,
            work_column=settings.work_column or None,
            speed=settings.speed,
        )
        service = ServiceModel(
            fixed_seconds=settings.c,
            per_item_seconds=trace.mean_work_raw if settings.a_from_work else settings.a,
            max_batch=settings.max_batch,
        )
        behavior = None
        if settings.scale_down_window >= 0:
            behavior = {"scaleDown": {"stabilizationWindowSeconds": settings.scale_down_window}}
        config = SimulationConfig(
            service=service,
            cold_start=settings.cold_start,
            target_utilization=settings.target_utilization,
            slo_seconds=settings.slo_seconds,
            slo_on=settings.slo_on,
            min_replicas=settings.min_replicas,
            max_replicas=settings.max_replicas,
            behavior=behavior,
            queue_target=settings.queue_target or None,
            forecast_step=settings.forecast_step,
            forecast_quantile=settings.forecast_quantile,
            forecast_seasons=tuple(s / settings.speed for s in settings.forecast_season),
            forecast_models=tuple(settings.forecast_model),
            forecast_refit_seconds=settings.forecast_refit,
            forecast_lookback_seconds=settings.forecast_lookback,
            forecast_series=settings.forecast_series,
            score_from=settings.score_from,
        )
    except (TraceError, ValueError) as exc:
        print(f"autoglm-autoscaler simulate: error: {exc}")
        return 2
    result = simulate(trace, config, settings.policy)
    summary = summarise(result)
    log.info("simulation finished", extra={k: v for k, v in summary.items() if k != "drivers"})
    for key in (
        "policy",
        "requests",
        "slo_requests",
        "slo_minutes",
        "breach_minutes",
        "gpu_hours",
        "mean_utilization",
        "busy_fraction",
        "scale_ups",
        "scale_downs",
        "forecaster",
    ):
        value = summary[key]
        print(f"{key:>18}: {value:.4f}" if isinstance(value, float) else f"{key:>18}: {value}")
    if settings.json:
        write_json(settings.json, summary)
    if settings.plot:
        plot([result], settings.plot, title=f"{settings.policy} on {settings.trace}")
    return 0
