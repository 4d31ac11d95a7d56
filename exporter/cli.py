"""``autoglm-exporter`` (also ``autoglm exporter``): serve GPU metrics until SIGTERM/SIGINT.

Exit codes: 0 after a clean stop; 2 for a bad flag, file or value (one line on stderr); 1 when
the GPUs cannot be read (no NVIDIA driver) -- never a silent fallback to made-up numbers.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry

from autoglm.config import ConfigError, OneLineErrorParser, add_config_arguments, config_or_exit
from autoglm.logs import setup_logging
from autoglm.signals import stop_on_signals
from autoglm.webconfig import WebConfig
from exporter.config import ExporterConfig, default_hostname
from exporter.counters import load_counters
from exporter.model import GPUSource
from exporter.service import ExporterService

if TYPE_CHECKING:  # imported when used: pynvml and grpc are loaded only when needed
    from exporter.podresources import PodResourcesWatcher
    from exporter.sources import SimulatedSource

PROG = "autoglm-exporter"
EXIT_NO_GPU = 1
EXIT_USAGE = 2

log = logging.getLogger(__name__)


class NoGPUError(Exception):
    """The chosen source cannot read any GPU; the message says what to do instead."""


def open_source(
    cfg: ExporterConfig, fields: Collection[str] | None = None
) -> tuple[GPUSource, SimulatedSource | None]:
    """The source ``cfg`` asks for, and the same object again when it is the simulated one (whose
    controls the service serves under ``/debug/``). :class:`NoGPUError` when NVML is wanted but
    absent; ConfigError for a bad profile or fault. ``fields`` limits what NVML is asked for."""
    from exporter.sources import NoDriverError, NVMLSource

    if cfg.source == "simulated":
        simulated = _open_simulated(cfg)
        return simulated, simulated
    try:
        return NVMLSource.open(fields=fields), None
    except NoDriverError as exc:
        raise NoGPUError(str(exc)) from None


def _open_simulated(cfg: ExporterConfig) -> SimulatedSource:
    from exporter.sources import SimulatedSource, load_profile, parse_fault

    try:
        profile = load_profile(cfg.profile)
    except ValueError as exc:
        raise ConfigError(f"--profile: {exc}") from None
    try:
        source = SimulatedSource(gpus=cfg.gpus, model=cfg.model, seed=cfg.seed, profile=profile)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    for spec in cfg.fault:
        try:
            source.inject(parse_fault(spec))
        except ValueError as exc:
            source.close()
            raise ConfigError(f"--fault: {exc}") from None
    return source


def _pod_watcher(cfg: ExporterConfig, registry: CollectorRegistry) -> PodResourcesWatcher | None:
    if not cfg.kubernetes_enabled:
        return None
    from exporter.podresources import PodResourcesWatcher

    return PodResourcesWatcher(
        cfg.pod_resources_socket, interval=cfg.pod_resources_interval, registry=registry
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = OneLineErrorParser(
        prog=PROG,
        description="GPU metrics for Prometheus with dcgm-exporter's names (NVML or simulated)",
    )
    add_config_arguments(parser, ExporterConfig)
    try:
        cfg = config_or_exit(ExporterConfig, parser.parse_args(argv), PROG)
    except SystemExit as exc:  # argparse and load_config report and exit; main returns codes
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    setup_logging("exporter", cfg.log_level, cfg.log_format)
    source: GPUSource | None = None
    pods: PodResourcesWatcher | None = None
    try:
        web_config = WebConfig.load(cfg.web_config_file)
        counters = load_counters(cfg.collectors)
        if counters.not_collected:
            log.warning(
                "counters file names fields this exporter does not collect; skipped",
                extra={"fields": list(counters.not_collected)},
            )
        source, simulation = open_source(cfg, counters.names)
        registry = CollectorRegistry()  # the watcher's and the HTTP server's own metrics
        pods = _pod_watcher(cfg, registry)
        if pods is not None:
            pods.refresh()  # so the first snapshot already carries pod labels (bounded wait)
            pods.start()
        service = ExporterService(
            source,
            listen=cfg.listen,
            naming=cfg.naming,
            hostname=cfg.hostname or default_hostname(),
            interval=cfg.interval,
            deadline=cfg.collect_deadline,
            xid_hold=cfg.xid_hold,
            web_config=web_config,
            pods=pods,
            simulation=simulation,
            registry=registry,
            fields=counters.fields,
        )
        service.start()
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        if pods is not None:
            pods.stop()
        if source is not None:
            source.close()
        return EXIT_USAGE
    except NoGPUError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_NO_GPU
    log.info(
        "exporter started",
        extra={
            "source": source.name,
            "gpus": len(service.collector.devices),
            "naming": cfg.naming,
            "listen": f"{service.server.host}:{service.server.port}",
            "kubernetes": pods is not None,
            "fields": len(counters.fields),
        },
    )
    with stop_on_signals() as stop:
        stop.wait()
    log.info("stopping")
    service.stop()
    if pods is not None:
        pods.stop()
    source.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
