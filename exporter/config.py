"""The exporter's settings: one dataclass, as flags (``--gpus 8``) or YAML (``gpus: 8``).

Bounds are pydantic ``Field`` constraints, checked when the settings are loaded and shared with
the Helm chart's values schema (tests/helm/test_values_schema.py); the checks that join fields
are in ``__post_init__``.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field

from autoglm.config import ConfigError, check_fields, parse_listen

DEFAULT_POD_RESOURCES_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
DEFAULT_DEADLINE_FRACTION = 0.8


def default_hostname() -> str:
    """``NODE_NAME`` (set from the downward API in the DaemonSet) or this machine's name."""
    return os.environ.get("NODE_NAME") or socket.gethostname()


@dataclass(frozen=True)
class ExporterConfig:
    source: Literal["auto", "nvml", "simulated"] = field(
        default="auto",
        metadata={
            "help": "where readings come from: auto (NVML, or stop when no driver), nvml, or "
            "simulated GPUs"
        },
    )
    gpus: Annotated[int, Field(ge=1)] = field(
        default=8, metadata={"help": "number of simulated GPUs"}
    )
    model: str = field(
        default="NVIDIA H100 80GB HBM3",
        metadata={"help": "model of the simulated GPUs (sets memory, power and clock limits)"},
    )
    seed: int = field(default=0, metadata={"help": "seed of the simulated GPUs' variation"})
    profile: str = field(
        default="diurnal:period=86400:low=0.2:high=0.9",
        metadata={
            "help": "load profile of the simulated GPUs: constant:RATIO, "
            "diurnal:period=S:low=R:high=R, or trace:PATH[:speed=N]"
        },
    )
    fault: list[str] = field(
        default_factory=list,
        metadata={"help": "fault to inject into the simulated GPUs, e.g. xid:gpu=2:code=79"},
    )
    listen: str = field(default=":9400", metadata={"help": "HOST:PORT to serve /metrics on"})
    interval: Annotated[float, Field(gt=0)] = field(
        default=1.0, metadata={"help": "seconds between collections"}
    )
    deadline: float | None = field(
        default=None,
        metadata={
            "help": "seconds a collection waits for device reads before reporting the rest as "
            "timed out (default: 0.8 x interval)"
        },
    )
    naming: Literal["dcgm", "prometheus"] = field(
        default="dcgm",
        metadata={
            "help": "metric names: dcgm (dcgm-exporter's names and labels) or prometheus "
            "(conventional names, base units, snake_case labels)"
        },
    )
    hostname: str | None = field(
        default=None,
        metadata={"help": "value of the Hostname label (default: $NODE_NAME or the host name)"},
    )
    xid_hold: Annotated[float, Field(ge=0)] = field(
        default=300.0,
        metadata={
            "help": "seconds DCGM_FI_DEV_XID_ERRORS keeps showing the last Xid before it "
            "returns to 0 (the autoglm_gpu_xid_errors_total counter keeps the history)"
        },
    )
    collectors: str | None = field(
        default=None,
        metadata={
            "help": "dcgm-exporter counters CSV (FIELD, TYPE, HELP per line) choosing the GPU "
            "fields to export, as dcgm-exporter's -f (default: every field)"
        },
    )
    web_config_file: str | None = field(
        default=None,
        metadata={"help": "exporter-toolkit web config file (TLS, basic auth)"},
    )
    kubernetes: bool | None = field(
        default=None,
        metadata={
            "help": "add pod/namespace/container labels from the kubelet pod-resources API "
            "(default: on when the socket exists)"
        },
    )
    pod_resources_socket: str = field(
        default=DEFAULT_POD_RESOURCES_SOCKET,
        metadata={"help": "kubelet pod-resources unix socket"},
    )
    pod_resources_interval: Annotated[float, Field(gt=0)] = field(
        default=10.0, metadata={"help": "seconds between pod-resources refreshes"}
    )
    log_level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata={"help": "log level"}
    )
    log_format: Literal["json", "text"] = field(
        default="json", metadata={"help": "log line format"}
    )

    def __post_init__(self) -> None:
        check_fields(self)
        if self.deadline is None:
            object.__setattr__(self, "deadline", self.interval * DEFAULT_DEADLINE_FRACTION)
        elif not 0 < self.deadline <= self.interval:
            raise ConfigError(
                f"--deadline {self.deadline:g} must be > 0 and no longer than --interval "
                f"{self.interval:g}, so collections never overlap"
            )
        if self.fault and self.source != "simulated":
            raise ConfigError("--fault needs --source simulated (faults are simulated)")
        if self.hostname == "":
            raise ConfigError("--hostname must not be empty")
        parse_listen(self.listen)

    @property
    def collect_deadline(self) -> float:
        """The deadline in seconds (``deadline`` resolved against ``interval``)."""
        assert self.deadline is not None  # set in __post_init__
        return self.deadline

    @property
    def kubernetes_enabled(self) -> bool:
        if self.kubernetes is not None:
            return self.kubernetes
        return os.path.exists(self.pod_resources_socket)
