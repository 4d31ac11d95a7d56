"""``promtool check metrics`` on what the exporter really serves, in both namings."""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.fields import FIELDS
from exporter.podresources import PodRef
from exporter.service import ExporterService
from exporter.sources import SimulatedSource, load_profile, parse_fault
from tests.waiting import wait_until

pytestmark = pytest.mark.live  # runs the real promtool/prometheus binaries

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
CAMEL_CASE = re.compile(r"[a-z][A-Z]")  # what promtool's lint calls camelCase


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
    assert code == 3  # promtool's exit code for lint findings
    by_problem: dict[str, set[str]] = {}
    for metric, problem in findings:
        by_problem.setdefault(problem, set()).add(metric)
    served_fields = {spec.dcgm_name for spec in FIELDS if f"{spec.dcgm_name}{{" in text}
    assert served_fields == {spec.dcgm_name for spec in FIELDS}  # every field was checked
    # Exactly the findings docs/exporter.md lists, each inherited from dcgm-exporter's names:
    assert by_problem == {
        # modelName, on every DCGM series and on the autoglm_gpu_* series that carry the DCGM
        # device labels so that they join with them.
        "label names should be written in 'snake_case' not 'camelCase'": served_fields
        | {"autoglm_gpu_xid_errors_total", "autoglm_gpu_last_xid_timestamp_seconds"},
        'counter metrics should have "_total" suffix': {
            spec.dcgm_name for spec in FIELDS if spec.kind == "counter"
        },
        "metric name should not include type 'counter'": {"DCGM_FI_DEV_PCIE_REPLAY_COUNTER"},
    }
    label_names = {name for family in parse_text(text) for s in family.samples for name in s.labels}
    assert {name for name in label_names if CAMEL_CASE.search(name)} == {"modelName"}
