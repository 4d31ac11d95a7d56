"""``promtool check metrics`` on what the exporter really serves, in both namings."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator

import pytest
import requests

from exporter.podresources import PodRef
from exporter.service import ExporterService
from exporter.sources import SimulatedSource, load_profile, parse_fault
from tests.waiting import wait_until

pytestmark = pytest.mark.live  # runs the real promtool/prometheus binaries

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


class StaticPods:
    """Attribution as the pod-resources watcher would give it: GPU 0 time-sliced by two pods."""

    healthy = True
    last_success = 1_700_000_000.0

    def __init__(self, uuid: str) -> None:
        self._map = {uuid: [PodRef("ml", "llm-a", "server"), PodRef("ml", "llm-b", "server")]}

    def attribution(self) -> dict[str, list[PodRef]]:
        return self._map


@pytest.fixture(params=["dcgm", "prometheus"])
def served(request) -> Iterator[tuple[str, str]]:
    source = SimulatedSource(gpus=8, model="NVIDIA H100 80GB HBM3", seed=1,
                             profile=load_profile("constant:0.6"))  # fmt: skip
    service = ExporterService(
        source,
        listen="127.0.0.1:0",
        naming=request.param,
        hostname="node-1",
        interval=0.2,
        deadline=0.2,
        pods=StaticPods(source.devices()[0].uuid),
        simulation=source,
    )
    service.start()
    try:
        source.inject(parse_fault("xid:gpu=3:code=79"))
        url = f"{service.server.url}/metrics"
        wait_until(lambda: 'xid="79"} 1' in requests.get(url, timeout=5).text,
                   timeout=20, what="a snapshot with the Xid")  # fmt: skip
        yield request.param, requests.get(url, timeout=5).text
    finally:
        service.stop()
        source.close()


def promtool_findings(text: str) -> tuple[int, list[tuple[str, str]]]:
    run = subprocess.run(
        [PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=60
    )
    findings = []
    for line in (run.stdout + run.stderr).decode().splitlines():
        if line.strip():
            metric, _, problem = line.partition(" ")
            findings.append((metric, problem))
    return run.returncode, findings


def test_promtool_on_real_output(served):
    naming, text = served
    assert 'pod="llm-b"' in text  # the shared GPU's second pod is there to be checked too
    code, findings = promtool_findings(text)
    if naming == "prometheus":
        assert (code, findings) == (0, [])
        return
    kinds = {problem for _, problem in findings}
    assert kinds == {
        'counter metrics should have "_total" suffix',
        "label names should be written in 'snake_case' not 'camelCase'",
        "metric name should not include type 'counter'",
    }
    for metric, problem in findings:
        if problem.startswith("label names"):
            # modelName is dcgm-exporter's label; autoglm GPU metrics carry the same labels
            # (so they join with the DCGM series) and inherit only this finding.
            assert metric.startswith(("DCGM_", "autoglm_gpu_")), metric
        else:
            assert metric.startswith("DCGM_"), metric
    assert not any(m.startswith("autoglm_exporter_") for m, _ in findings)
