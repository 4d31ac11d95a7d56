"""Settings of ``autoglm-autoscaler run``: flags that mirror a YAML file (see autoglm.config).

Bounds are pydantic ``Field`` constraints, checked when the settings are loaded and shared with
the Helm chart's values schema; the checks that join fields are in ``__post_init__``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field

from autoglm.config import ConfigError, check_fields, parse_listen
from autoglm.prometheus_api import PrometheusAccessConfig
from autoscaler.controller.forecasts import DEFAULT_FORECAST_QUERY
from autoscaler.core.decision import DOWNSCALE_STABILIZATION_SECONDS
from autoscaler.core.replica_calculator import (
    INITIAL_READINESS_DELAY_SECONDS,
    INITIALIZATION_PERIOD_SECONDS,
)

Seconds = Annotated[float, Field(ge=0)]
PositiveSeconds = Annotated[float, Field(gt=0)]


# A TCP port, as parse_listen bounds one; 0 asks the kernel for a free one. (YAML true is
# refused for every number by autoglm.config.build_config.)
Port = Annotated[int, Field(ge=0, le=65535)]


@dataclass(frozen=True)
class AutoscalerConfig(PrometheusAccessConfig):
    """The ``--prometheus-*`` auth and TLS flags come from :class:`PrometheusAccessConfig`."""

    mode: Literal["kubernetes", "local"] = field(
        default="kubernetes",
        metadata={
            "help": "scale Deployments from GPUAutoscaler objects, or local worker processes"
        },
    )
    namespace: str = field(default="default", metadata={"help": "namespace of the GPUAutoscalers"})
    name: str = field(
        default="", metadata={"help": "reconcile only this GPUAutoscaler (empty: all in namespace)"}
    )
    kubeconfig: str = field(
        default="",
        metadata={"help": "kubeconfig file (empty: in-cluster config, else ~/.kube/config)"},
    )
    spec_file: str = field(
        default="", metadata={"help": "local mode: YAML GPUAutoscaler (or its spec) to follow"}
    )
    worker_command: list[str] = field(
        default_factory=list,
        metadata={"help": "local mode: one argument of the worker command; {port} is replaced"},
    )
    worker_base_port: Port = field(
        default=0,
        metadata={"help": "local mode: first worker port, 0..65535 (0: pick free ports)"},
    )
    worker_port_env: str = field(
        default="PORT", metadata={"help": "local mode: env variable that carries a worker's port"}
    )
    worker_ready_url: str = field(
        default="http://{host}:{port}/v2/health/ready",
        metadata={"help": "local mode: readiness URL template of a worker ('' = always ready)"},
    )
    prometheus_timeout: PositiveSeconds = field(
        default=10.0, metadata={"help": "seconds per query"}
    )
    pod_label: str = field(
        default="pod",
        metadata={"help": "label naming the pod in Pods metrics (local mode: instance)"},
    )
    forecast_query: str = field(
        default=DEFAULT_FORECAST_QUERY,
        metadata={
            "help": "PromQL template of the forecast upper bound ({target} {horizon} {quantile})"
        },
    )
    interval: PositiveSeconds = field(default=15.0, metadata={"help": "seconds between reconciles"})
    initialization_period: Seconds = field(
        default=INITIALIZATION_PERIOD_SECONDS,
        metadata={
            "help": "seconds after a pod starts during which a Utilization sample counts only once "
            "the pod is ready and the sample postdates it (the HPA's "
            "--horizontal-pod-autoscaler-cpu-initialization-period)"
        },
    )
    initial_readiness_delay: Seconds = field(
        default=INITIAL_READINESS_DELAY_SECONDS,
        metadata={
            "help": "seconds after a pod starts within which a readiness change means it was never "
            "ready (the HPA's --horizontal-pod-autoscaler-initial-readiness-delay)"
        },
    )
    downscale_stabilization: Seconds = field(
        default=DOWNSCALE_STABILIZATION_SECONDS,
        metadata={
            "help": "scale-down stabilization window in seconds where the spec sets none (the "
            "HPA's --horizontal-pod-autoscaler-downscale-stabilization)"
        },
    )
    dry_run: bool = field(
        default=False, metadata={"help": "decide and report, but never change replicas"}
    )
    leader_elect: bool = field(
        default=True, metadata={"help": "elect a leader through a Lease (kubernetes mode)"}
    )
    lease_name: str = field(default="autoglm-autoscaler", metadata={"help": "Lease name"})
    lease_namespace: str = field(
        default="", metadata={"help": "Lease namespace (empty: --namespace)"}
    )
    lease_duration: PositiveSeconds = field(
        default=15.0, metadata={"help": "seconds a lease lasts without renewal"}
    )
    renew_deadline: PositiveSeconds = field(
        default=10.0, metadata={"help": "seconds a leader keeps acting without a renewal"}
    )
    identity: str = field(
        default="", metadata={"help": "this replica's identity in the Lease (empty: hostname)"}
    )
    listen: str = field(default=":9402", metadata={"help": "HOST:PORT for /metrics and health"})
    web_config_file: str = field(
        default="", metadata={"help": "exporter-toolkit web config (TLS, basic auth) for /metrics"}
    )
    log_level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata={"help": "log level"}
    )
    log_format: Literal["json", "text"] = field(default="json", metadata={"help": "log format"})

    def __post_init__(self) -> None:
        super().__post_init__()
        check_fields(self)
        parse_listen(self.listen)
        if not self.renew_deadline < self.lease_duration:
            raise ConfigError(
                "renew_deadline must be below lease_duration "
                "(e.g. --lease-duration 15 --renew-deadline 10)"
            )
        if self.mode == "local":
            if not self.spec_file:
                raise ConfigError("local mode needs --spec-file FILE (a GPUAutoscaler YAML)")
            if not self.worker_command:
                raise ConfigError(
                    "local mode needs the worker command, one --worker-command per argument, "
                    "e.g. --worker-command autoglm-batcher --worker-command --listen=:{port}"
                )
            _check_program(self.worker_command[0])


def _check_program(program: str) -> None:
    """ConfigError unless ``program`` (the worker command's first argument) can be started:
    a bare name found on PATH, or a path to an executable file."""
    if os.sep in program or (os.altsep and os.altsep in program):
        if not os.path.isfile(program):
            raise ConfigError(
                f"--worker-command {program!r}: no such file; give the worker program's path "
                "or a name on PATH"
            )
        if not os.access(program, os.X_OK):
            raise ConfigError(
                f"--worker-command {program!r} is not executable; chmod +x it or give another "
                "program"
            )
    elif shutil.which(program) is None:
        raise ConfigError(
            f"--worker-command {program!r} is not on PATH; install it, or give its full path"
        )
