"""Settings of ``autoglm up``: one dataclass, as flags (``--duration 120``) or YAML keys.

Wall-clock settings (intervals, stabilization, warm-up) are in real seconds; the load profile runs
on a compressed clock (``--time-compression 480`` makes a day pass in three minutes),
because a trace's day must pass in minutes while workers still take real seconds to start.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
from dataclasses import dataclass, field
from typing import Literal

from autoglm.config import ConfigError

DAY_SECONDS = 86400.0
PROFILES = ("ramp", "trace", "diurnal", "step", "spike")

# Offsets from --port-base, so one flag moves every endpoint of the stack.
EXPORTER_OFFSET = 0
PREDICTOR_OFFSET = 1
AUTOSCALER_OFFSET = 2
LOADGEN_OFFSET = 3
SERVICE_OFFSET = 4
JOB_OFFSET = 5
PROMETHEUS_OFFSET = 90
WORKERS_OFFSET = 100
MIN_PORT_BASE = 1024
MAX_PORT_BASE = 65535 - WORKERS_OFFSET - 64  # room for the workers' ports

DEMO_MODEL = "stack.model:factory"  # the demo MLP with a simulated kernel time (stack.kernel)


@dataclass(frozen=True)
class UpConfig:
    """Everything ``autoglm up`` can be told."""

    duration: float = field(
        default=0.0,
        metadata={"help": "seconds to run, then stop and write the report (0: until Ctrl-C)"},
    )
    port_base: int = field(
        default=9400,
        metadata={
            "help": "first port: exporter +0, predictor +1, autoscaler +2, load generator +3, "
            "the workers' service +4, the job's metrics +5, prometheus +90, workers +100.. "
            "(0: any free ports)"
        },
    )
    target_utilization: float = field(
        default=0.7,
        metadata={
            "help": "share of each worker's GPU time (a ratio in 0-1) the autoscaler keeps busy "
            "with online requests; the best-effort job fills the rest"
        },
    )
    sizing: Literal["utilization", "slo"] = field(
        default="utilization",
        metadata={
            "help": "utilization: hold each worker's online GPU time at --target-utilization "
            "(the HPA rule); slo: the fewest workers whose modelled p99, from the batchers' "
            "measured batch cost, holds --slo-seconds at the forecast request rate (GPUAutoscaler "
            "spec.slo; needs Prometheus)"
        },
    )
    slo_seconds: float = field(
        default=0.25, metadata={"help": "latency SLO per request (p99 is compared with it)"}
    )
    min_workers: int = field(default=1, metadata={"help": "fewest batcher workers"})
    max_workers: int = field(
        default=4, metadata={"help": "most batcher workers (one simulated GPU each)"}
    )
    profile: Literal["ramp", "trace", "diurnal", "step", "spike"] = field(
        default="ramp",
        metadata={
            "help": "load shape: ramp (quiet, a ramp to the peak, a plateau, a fall: the demo's "
            "day), trace (Alibaba GenAI requests, shipped excerpt), diurnal, step (a plateau of "
            "high load), spike (a short burst)"
        },
    )
    trace_file: str = field(
        default="",
        metadata={
            "help": "with --profile trace: a dataset name (`autoglm datasets list`) or a CSV path "
            "to replay instead of the shipped excerpt"
        },
    )
    peak_rps: float = field(
        default=100.0, metadata={"help": "requests per second at the profile's highest point"}
    )
    base_rps: float = field(
        default=20.0, metadata={"help": "requests per second at the synthetic profiles' lowest"}
    )
    time_compression: float = field(
        default=480.0,
        metadata={"help": "how much faster than real time the profile plays (480: a day in 3 min)"},
    )
    interval: float = field(default=2.0, metadata={"help": "seconds between autoscaler decisions"})
    scale_down_stabilization: float = field(
        default=10.0,
        metadata={"help": "seconds a lower recommendation must hold before scaling down"},
    )
    warmup_seconds: float = field(
        default=8.0,
        metadata={"help": "time a new worker needs to serve; the forecast looks this far ahead"},
    )
    prediction: bool = field(
        default=True, metadata={"help": "let the predictor's forecast add replicas ahead of load"}
    )
    job: bool = field(
        default=True,
        metadata={
            "help": "run a best-effort job (a generated backlog of requests, through the job "
            "runner) on the capacity online requests leave idle (--no-job: online load only)"
        },
    )
    max_in_flight: int = field(
        default=256,
        metadata={"help": "requests the load generator keeps open at once; more are shed"},
    )
    gpus: Literal["auto", "simulated"] = field(
        default="auto",
        metadata={"help": "auto: real GPUs through NVML when present, else simulated; simulated"},
    )
    worker_model: str = field(
        default=DEMO_MODEL,
        metadata={"help": "package.module:factory the batcher workers serve"},
    )
    prometheus: bool = field(
        default=True,
        metadata={
            "help": "start the prometheus binary with the project's rules and scale through "
            "it, with a cluster's PromQL (without the binary, or with --no-prometheus: an "
            "embedded metrics window)"
        },
    )
    report_dir: str = field(
        default="autoglm-up-report", metadata={"help": "where the HTML report is written"}
    )
    tui: bool = field(
        default=True, metadata={"help": "live terminal view (--no-tui: structured log lines)"}
    )
    log_level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata={"help": "log level"}
    )
    log_format: Literal["json", "text"] = field(default="json", metadata={"help": "log format"})

    def __post_init__(self) -> None:
        if self.duration < 0:
            raise ConfigError("--duration must be >= 0 seconds (0 runs until Ctrl-C)")
        if self.port_base != 0 and not MIN_PORT_BASE <= self.port_base <= MAX_PORT_BASE:
            raise ConfigError(
                f"--port-base {self.port_base} must be 0 (free ports) or within "
                f"{MIN_PORT_BASE}..{MAX_PORT_BASE}, e.g. --port-base 19400"
            )
        if not 0 < self.target_utilization <= 1:
            raise ConfigError(utilization_problem(self.target_utilization))
        if self.slo_seconds <= 0:
            raise ConfigError("--slo-seconds must be > 0, e.g. --slo-seconds 0.25")
        if self.min_workers < 1:
            raise ConfigError("--min-workers must be >= 1 (a Pods metric needs a worker to read)")
        if self.max_workers < self.min_workers:
            raise ConfigError(
                f"--max-workers {self.max_workers} is below --min-workers {self.min_workers}"
            )
        if self.max_workers > 64:
            raise ConfigError("--max-workers must be at most 64 (each worker is a process)")
        if self.peak_rps <= 0:
            raise ConfigError("--peak-rps must be > 0, e.g. --peak-rps 40")
        if not 0 <= self.base_rps <= self.peak_rps:
            raise ConfigError(f"--base-rps must be within 0..--peak-rps ({self.peak_rps:g})")
        if self.time_compression <= 0:
            raise ConfigError("--time-compression must be > 0 (1 plays the profile in real time)")
        if self.interval <= 0:
            raise ConfigError("--interval must be > 0 seconds")
        if self.scale_down_stabilization < 0:
            raise ConfigError("--scale-down-stabilization must be >= 0 seconds")
        if self.warmup_seconds < 0:
            raise ConfigError("--warmup-seconds must be >= 0")
        if self.max_in_flight < 1:
            raise ConfigError("--max-in-flight must be >= 1")
        check_worker_model(self.worker_model)
        if self.trace_file and self.profile != "trace":
            raise ConfigError(
                f"--trace-file is replayed by --profile trace only (the profile is "
                f"{self.profile}): add --profile trace, or drop --trace-file"
            )
        if self.sizing == "slo" and not self.prometheus:
            raise ConfigError(
                "--sizing slo reads the batchers' measured batch cost from Prometheus; drop "
                "--no-prometheus or use --sizing utilization"
            )
        if not self.report_dir:
            raise ConfigError("--report-dir must name a directory, e.g. autoglm-up-report")

    @property
    def day_seconds(self) -> float:
        """Wall-clock seconds one day of the profile lasts."""
        return DAY_SECONDS / self.time_compression


def check_worker_model(value: str) -> None:
    """ConfigError unless ``value`` is ``package.module:factory`` whose module can be found.

    The module is looked up without being imported (nor its packages: importing a model could
    load torch), on the path a worker (``python -m batcher.cli`` from this directory) imports
    from. Whether the factory exists is the worker's to find out, but a typo in the module is
    caught here instead of as workers that exit at once."""
    module, sep, factory = value.partition(":")
    if not sep or not module or not factory.isidentifier():
        raise ConfigError(
            f"--worker-model {value!r} must be package.module:factory, "
            f"e.g. --worker-model {DEMO_MODEL}"
        )
    if not _module_found(module):
        raise ConfigError(
            f"--worker-model {value!r}: no module {module!r} can be found on the Python path; "
            f"give an importable package.module:factory, e.g. --worker-model {DEMO_MODEL}"
        )


def _module_found(dotted: str) -> bool:
    """Whether the module ``dotted`` can be found, without running any package's code."""
    parts = dotted.split(".")
    if not all(part.isidentifier() for part in parts):
        return False
    if dotted in sys.modules:  # already imported here (os.path is no package's submodule)
        return True
    try:
        spec = importlib.util.find_spec(parts[0])  # a top-level name imports nothing
    except (ImportError, ValueError):
        spec = None
    if spec is None:  # a worker runs with -m, so its working directory is on its path
        spec = importlib.machinery.PathFinder.find_spec(parts[0], [os.getcwd(), *sys.path])
    for depth in range(1, len(parts)):
        if spec is None or not spec.submodule_search_locations:
            return False
        spec = importlib.machinery.PathFinder.find_spec(
            ".".join(parts[: depth + 1]), list(spec.submodule_search_locations)
        )
    return spec is not None


def utilization_problem(value: float) -> str:
    """The line for a ``--target-utilization`` outside (0, 1]: the range, and the fraction meant.

    70 reads as a percentage, so its fraction is offered; 1.5 or 150 do not (0.015, 1.5 % of a
    GPU busy, is no target anyone means), so they get the range and a typical value.
    """
    fix = f"{value / 100:g} for {value:g} %" if 10 <= value <= 100 else "e.g. 0.7 for 70 %"
    return f"--target-utilization must be a fraction of 1 in (0, 1], got {value:g}; give {fix}"
