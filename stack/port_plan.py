"""Where each part of ``autoglm up`` listens, and whether those ports are free.

Apart from :mod:`stack.stack` so that the command line can refuse a taken port before it imports
the stack (torch and the predictor's models take seconds): a bad ``--port-base`` is told in a
fraction of a second, and nothing has started.
"""

from __future__ import annotations

import socket

from autoglm.config import ConfigError
from stack import config as ports
from stack.config import UpConfig

HOST = "127.0.0.1"


def plan_ports(cfg: UpConfig) -> dict[str, int]:
    """Role -> port; 0 everywhere when ``--port-base 0`` (pick free ports)."""
    base = cfg.port_base
    offsets = {
        "exporter": ports.EXPORTER_OFFSET,
        "predictor": ports.PREDICTOR_OFFSET,
        "autoscaler": ports.AUTOSCALER_OFFSET,
        "loadgen": ports.LOADGEN_OFFSET,
        "service": ports.SERVICE_OFFSET,
        "job": ports.JOB_OFFSET,
        "prometheus": ports.PROMETHEUS_OFFSET,
    }
    if base == 0:
        return dict.fromkeys(offsets, 0)
    planned = {role: base + offset for role, offset in offsets.items()}
    for i in range(cfg.max_workers):
        planned[f"worker {i}"] = base + ports.WORKERS_OFFSET + i
    return planned


def check_ports(cfg: UpConfig, with_prometheus: bool) -> dict[str, int]:
    """The planned ports, after a ConfigError naming the first taken one (of the parts that
    will run: Prometheus only ``with_prometheus``, the job's two only with ``--job``) and how to
    move every port at once."""
    planned = plan_ports(cfg)
    skip = (() if with_prometheus else ("prometheus",)) + (() if cfg.job else ("service", "job"))
    for role, port in planned.items():
        if port == 0 or role in skip:
            continue
        with socket.socket() as sock:
            # As the servers do: a port whose old connections linger in TIME_WAIT is free.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError:
                raise ConfigError(
                    f"port {port} ({role}) on {HOST} is taken; stop what uses it or move every "
                    f"port with --port-base, e.g. --port-base {another_port_base(cfg.port_base)} "
                    "(0: any free ports)"
                ) from None
    return planned


def another_port_base(base: int) -> int:
    """A first port 10000 away from ``base`` that ``--port-base`` accepts: the hint after a
    taken port must itself be a valid setting."""
    up = base + 10000
    return up if up <= ports.MAX_PORT_BASE else max(ports.MIN_PORT_BASE, base - 10000)
