"""Every component's /metrics says which build runs and how its process does."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
import requests
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from autoglm.self_metrics import describe_self
from autoglm.version import package_version
from autoglm.web.exposition import registry_route
from autoglm.web.server import HTTPServer


def samples(text: str) -> dict[str, list]:
    return {f.name: f.samples for f in text_string_to_metric_families(text)}


def test_a_served_registry_carries_the_build_and_the_process() -> None:
    registry = CollectorRegistry()
    routes = {"/metrics": registry_route(registry)}
    server = HTTPServer("127.0.0.1:0", routes, component="predictor", registry=registry)
    server.start()
    try:
        text = requests.get(f"{server.url}/metrics", timeout=10).text
    finally:
        server.stop()
    found = samples(text)
    (build,) = found["autoglm_build_info"]
    assert build.labels["component"] == "predictor"
    assert build.labels["version"] == package_version()
    (start,) = found["process_start_time_seconds"]
    assert abs(start.value - _process_start()) < 2  # this process's start, not another's
    assert found["process_resident_memory_bytes"][0].value > 0


def test_two_servers_on_one_registry_describe_it_once() -> None:
    registry = CollectorRegistry()
    describe_self(registry, "exporter")
    describe_self(registry, "exporter")  # a second server on it: no duplicate series error
    assert generate_latest(registry).decode().count("autoglm_build_info{") == 1


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is installed by CI")
def test_promtool_finds_nothing_to_lint_in_them() -> None:
    registry = CollectorRegistry()
    describe_self(registry, "autoscaler")
    lint = subprocess.run(
        ["promtool", "check", "metrics"],
        input=generate_latest(registry),
        capture_output=True,
        timeout=60,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def _process_start() -> float:
    """This process's start, in seconds since the epoch, from /proc as ProcessCollector reads it."""
    ticks = os.sysconf("SC_CLK_TCK")
    with open("/proc/self/stat") as stat:
        started = int(stat.read().rsplit(")", 1)[1].split()[19]) / ticks
    with open("/proc/stat") as boot:
        btime = next(float(line.split()[1]) for line in boot if line.startswith("btime"))
    return btime + started
