"""``autoglm-autoscaler simulate``: replay a request trace through a scaling policy.

Example::

    autoglm-autoscaler simulate --trace requests.csv --time-column TIMESTAMP \\
        --policy predictive --c 1.5 --a 0.4 --max-batch 8 --cold-start 120 \\
        --slo-seconds 8 --json out.json --plot out.png

``--sizing slo`` sizes the fleet for the latency SLO (the ``--slo-quantile`` of end-to-end
latency within ``--slo-seconds``) instead of ``--target-utilization``; ``--backfill`` fills the
idle replicas with best-effort work (``--backfill-work`` replica-hours, 0: a backlog that never
runs dry) in slices of ``--backfill-quantum`` seconds, under the online-slack controller, and
``--reserve-quantum`` sizes for the SLO less one such slice.
Every flag is checked, and the ``--json``/``--plot`` paths are checked writable, before the
replay starts.
"""

from __future__ import annotations

import logging
import math
import os
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field

from autoglm.config import ConfigError, check_fields, load_config
from autoglm.datasets import resolve as resolve_dataset
from autoglm.logs import setup_logging
from autoscaler.core.slo_sizing import ServiceModel
from autoscaler.simulator.backfill import BackfillConfig
from autoscaler.simulator.engine import SimulationConfig, simulate
from autoscaler.simulator.report import plot, summarise, write_json
from autoscaler.simulator.tenants import (
    TenantSetup,
    parse_tenant_flag,
    rotated_trace,
    simulate_tenants,
    summarise_run,
)
from autoscaler.simulator.trace import TraceError, load_trace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimulateSettings:
    trace: str = field(
        default="",
        metadata={
            "help": "CSV file with one request per row, or a dataset name "
            "(`autoglm datasets list`: azure-llm-conv-10min ships with the package)"
        },
    )
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
    speed: Annotated[float, Field(gt=0)] = field(
        default=1.0, metadata={"help": "time compression: 24 replays a day in 1 h"}
    )
    c: Annotated[float, Field(ge=0)] = field(
        default=1.0, metadata={"help": "batch service time intercept c (seconds)"}
    )
    a: Annotated[float, Field(ge=0)] = field(
        default=0.25, metadata={"help": "batch service time per average request a (seconds)"}
    )
    a_from_work: bool = field(
        default=False,
        metadata={"help": "set a to the work column's mean (e.g. measured seconds per request)"},
    )
    max_batch: Annotated[int, Field(ge=1)] = field(
        default=8, metadata={"help": "largest batch a replica serves"}
    )
    cold_start: Annotated[float, Field(ge=0)] = field(
        default=120.0, metadata={"help": "seconds before a new replica serves"}
    )
    target_utilization: Annotated[float, Field(gt=0, le=1)] = field(
        default=0.7, metadata={"help": "share of a replica's full-batch throughput to aim at"}
    )
    slo_seconds: Annotated[float, Field(gt=0)] = field(
        default=10.0, metadata={"help": "latency SLO in seconds"}
    )
    slo_on: Literal["latency", "queueing"] = field(
        default="latency", metadata={"help": "what the SLO bounds: end-to-end or waiting time"}
    )
    min_replicas: Annotated[int, Field(ge=1)] = field(default=1, metadata={"help": "minReplicas"})
    max_replicas: Annotated[int, Field(ge=1)] = field(default=64, metadata={"help": "maxReplicas"})
    scale_down_window: Annotated[int, Field(ge=-1)] = field(
        default=-1,
        metadata={"help": "scale-down stabilization seconds (-1: the HPA default, 300)"},
    )
    queue_target: Annotated[float, Field(ge=0)] = field(
        default=0.0,
        metadata={"help": "waiting requests per replica as a second metric (0: rate only)"},
    )
    forecast_step: Annotated[float, Field(gt=0)] = field(
        default=60.0, metadata={"help": "forecast series step (seconds)"}
    )
    forecast_quantile: Annotated[float, Field(gt=0, lt=1)] = field(
        default=0.9, metadata={"help": "forecast upper quantile"}
    )
    forecast_season: list[Annotated[float, Field(gt=0)]] = field(
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
    forecast_refit: Annotated[float, Field(gt=0)] = field(
        default=86400.0, metadata={"help": "seconds between model selections and refits"}
    )
    forecast_lookback: Annotated[float, Field(gt=0)] = field(
        default=14 * 86400.0,
        metadata={"help": "seconds of history the predictor fits and calibrates on"},
    )
    sizing: Literal["target", "slo"] = field(
        default="target",
        metadata={"help": "size for --target-utilization, or for the latency SLO (slo)"},
    )
    slo_quantile: Annotated[float, Field(gt=0, lt=1)] = field(
        default=0.99,
        metadata={"help": "with --sizing slo: the latency quantile held within --slo-seconds"},
    )
    slo_objective: Annotated[float, Field(ge=0, lt=1)] = field(
        default=0.0,
        metadata={
            "help": "with --sizing slo: the share of minutes whose --slo-quantile must hold, "
            "e.g. 0.995; the per-request quantile sized for is derived from it at each rate "
            "(0: size for --slo-quantile itself)"
        },
    )
    slo_service_scv: Annotated[float, Field(ge=0)] = field(
        default=0.0,
        metadata={
            "help": "with --sizing slo: squared coefficient of variation of request service "
            "times (0: all take t(1))"
        },
    )
    backfill: bool = field(
        default=False, metadata={"help": "run best-effort work on the replicas left idle"}
    )
    backfill_work: Annotated[float, Field(ge=0)] = field(
        default=0.0,
        metadata={"help": "best-effort backlog in replica-hours (0: it never runs dry)"},
    )
    backfill_quantum: Annotated[float, Field(ge=0)] = field(
        default=0.0,
        metadata={
            "help": "longest best-effort slice in seconds (0: a tenth of the room a full "
            "online batch leaves inside the SLO)"
        },
    )
    backfill_margin: Annotated[float, Field(gt=0, lt=0.5)] = field(
        default=0.1,
        metadata={"help": "online latency slack (share of the SLO) under which best-effort stops"},
    )
    reserve_quantum: bool = field(
        default=False,
        metadata={
            "help": "with --sizing slo and --backfill: size for the SLO less one best-effort "
            "slice, which an online request may wait for (as the controller does)"
        },
    )
    score_from: Annotated[float, Field(ge=0)] = field(
        default=0.0, metadata={"help": "seconds of replay (after --speed) left out of the SLO"}
    )
    tenant: list[str] = field(
        default_factory=list,
        metadata={
            "help": "a tenant sharing --budget-gpus: NAME:PRIORITY:SLO_SECONDS:SHIFT_SECONDS, "
            "the trace rotated by the shift (repeat the flag; see docs/budgets.md)"
        },
    )
    budget_gpus: Annotated[float, Field(ge=0)] = field(
        default=0.0,
        metadata={"help": "GPUs the --tenant list shares; best-effort work takes the rest"},
    )
    json: str = field(default="", metadata={"help": "write the summary as JSON here"})
    plot: str = field(default="", metadata={"help": "write a PNG plot here"})
    log_level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata={"help": "log level"}
    )
    log_format: Literal["json", "text"] = field(default="text", metadata={"help": "log format"})

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.trace:
            raise ConfigError("--trace is required (a CSV file of requests)")
        if self.min_replicas > self.max_replicas:
            raise ConfigError("--min-replicas must be <= --max-replicas")
        if self.c + self.a <= 0 and not self.a_from_work:
            raise ConfigError("--c plus --a must be > 0 seconds (a batch takes time)")
        if self.a_from_work and not self.work_column:
            raise ConfigError("--a-from-work needs --work-column")
        if self.sizing == "slo" and self.slo_on != "latency":
            raise ConfigError("--sizing slo models end-to-end latency: use --slo-on latency")
        if self.slo_objective and self.sizing != "slo":
            raise ConfigError("--slo-objective sizes for the SLO: add --sizing slo")
        if self.reserve_quantum and not (self.sizing == "slo" and self.backfill):
            raise ConfigError(
                "--reserve-quantum reserves a best-effort slice out of the SLO that SLO sizing "
                "holds: add --sizing slo and --backfill"
            )
        if self.tenant and not self.budget_gpus > 0:
            raise ConfigError("--tenant needs --budget-gpus > 0, the GPUs the tenants share")
        for text in self.tenant:
            try:
                parse_tenant_flag(text)
            except ValueError as exc:
                raise ConfigError(f"--tenant {text!r}: {exc}") from exc
        for name in ("json", "plot"):
            if getattr(self, name):
                _check_writable(_flag(name), Path(getattr(self, name)))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _check_writable(flag: str, path: Path) -> None:
    """Refuse an output path the run could not write at its end, before the run starts."""
    if path.is_dir():
        raise ConfigError(f"{flag} {str(path)!r} is a directory; give a file name")
    if path.exists():
        if not os.access(path, os.W_OK):
            raise ConfigError(f"{flag} {str(path)!r} is not writable; choose another path")
        return
    folder = path.parent
    while not folder.exists():  # the nearest existing folder must let us create the rest
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise ConfigError(
            f"{flag} {str(path)!r} cannot be created: {str(folder)!r} is not a writable folder"
        )


def simulate_main(argv: list[str] | None) -> int:
    """Run one policy on a trace; print the summary; exit 0, or 2 on bad input."""
    settings = load_config(SimulateSettings, argv, prog="autoglm-autoscaler simulate")
    setup_logging("autoscaler", settings.log_level, settings.log_format)
    try:
        trace = load_trace(
            resolve_dataset(settings.trace),
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
            sizing=settings.sizing,
            slo_quantile=settings.slo_quantile,
            slo_objective=settings.slo_objective or None,
            slo_service_scv=settings.slo_service_scv,
            backfill=(
                BackfillConfig(
                    work_seconds=settings.backfill_work * 3600.0 or math.inf,
                    quantum_seconds=settings.backfill_quantum or None,
                    margin=settings.backfill_margin,
                    reserve_quantum=settings.reserve_quantum,
                )
                if settings.backfill
                else None
            ),
        )
    except (TraceError, ValueError) as exc:
        print(f"autoglm-autoscaler simulate: error: {exc}", file=sys.stderr)
        return 2
    if settings.tenant:
        return _simulate_tenants(settings, trace, config)
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
        "backfill_busy",
        "total_busy",
        "backfill_replica_hours",
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


def _simulate_tenants(settings: SimulateSettings, trace, config: SimulationConfig) -> int:
    """``--tenant``: every tenant replays the trace rotated by its shift, with its own SLO and
    priority, under ``--budget-gpus``; one line per tenant."""
    setups = []
    for text in settings.tenant:
        name, priority, slo, shift = parse_tenant_flag(text)
        setups.append(
            TenantSetup(
                name, rotated_trace(trace, shift), replace(config, slo_seconds=slo), priority
            )
        )
    report = summarise_run(simulate_tenants(setups, settings.budget_gpus), setups)
    for row in report["tenants"]:
        print(
            f"{row['tenant']:>12}: priority {row['priority']}, SLO minutes "
            f"{row['slo_minutes']:.4f}, breach minutes {row['breach_minutes']}, GPU-hours "
            f"{row['gpu_hours']:.2f}, limited {row['limited_share']:.1%} of ticks"
        )
    print(f"{'budget used':>12}: {report['used_share']:.4f} of {settings.budget_gpus:g} GPUs")
    if settings.json:
        write_json(settings.json, report)
    return 0
