"""What every component's ``/metrics`` says about the component itself: the build it runs and
its process.

The components keep registries of their own rather than prometheus_client's default one (the
tests and the local stack run several in one process), so the process metrics that registry
carries would be missing: an operator could not see a restart (``process_start_time_seconds``),
a leak (``process_resident_memory_bytes``), CPU or open files, nor which version a rollout left
running (``autoglm_build_info``). They carry the names every Prometheus client library uses.
"""

from __future__ import annotations

import platform
import weakref

from prometheus_client import CollectorRegistry, Info
from prometheus_client.process_collector import ProcessCollector

from autoglm.version import package_version

_described: weakref.WeakSet[CollectorRegistry] = weakref.WeakSet()


def describe_self(registry: CollectorRegistry, component: str) -> None:
    """Register the build's info and the process's metrics in ``registry``, once however many
    servers share it."""
    if registry in _described:
        return
    _described.add(registry)
    build = Info("autoglm_build", "The Open-AutoGLM build this process runs", registry=registry)
    build.info(
        {
            "component": component.removeprefix("autoglm-"),
            "version": package_version(),
            "python_version": platform.python_version(),
        }
    )
    ProcessCollector(registry=registry)
