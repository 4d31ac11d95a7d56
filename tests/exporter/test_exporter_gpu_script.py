"""bench/exporter_gpu.py, the check against nvidia-smi that runs on GPU machines: its parsing
and comparison (exporter/nvidia_smi.py) here, and one whole run against a simulated exporter
with a stand-in nvidia-smi."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

import pytest
import requests

from exporter.nvidia_smi import compare, parse_exporter, parse_nvidia_smi
from tests.waiting import wait_until

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "exporter_gpu.py"
spec = importlib.util.spec_from_file_location("exporter_gpu", SCRIPT)
assert spec is not None and spec.loader is not None
exporter_gpu = importlib.util.module_from_spec(spec)
spec.loader.exec_module(exporter_gpu)

UUID = "GPU-aaaaaaaa-0000-0000-0000-000000000000"


def test_nvidia_smi_rows_parse_and_unsupported_cells_are_left_out() -> None:
    row = f"{UUID}, 81559, 40000, 63, [N/A], 512.34, 700.00, 1980, 2619, 87"
    (reading,) = parse_nvidia_smi(row + "\n").values()
    assert reading["memory.total"] == 81559 and reading["power.draw"] == 512.34
    assert "temperature.memory" not in reading
    with pytest.raises(ValueError, match="expected 10"):
        parse_nvidia_smi("GPU-x, 1, 2\n")


def test_exporter_text_parses_whole_gpus_only() -> None:
    text = (
        f'DCGM_FI_DEV_GPU_TEMP{{gpu="0",UUID="{UUID}"}} 63\n'
        f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{UUID}",GPU_I_ID="1"}} 10\n'
        f'DCGM_FI_DEV_FB_USED{{gpu="0",UUID="{UUID}"}} 40000\n'
        'DCGM_FI_DEV_PCIE_REPLAY_COUNTER{gpu="0",UUID="x"} 1\n'
    )
    assert parse_exporter(text) == {
        UUID: {"DCGM_FI_DEV_GPU_TEMP": 63.0, "DCGM_FI_DEV_FB_USED": 40000.0}
    }


def test_compare_keeps_the_worst_difference_and_flags_missing_fields() -> None:
    smi = {UUID: {"temperature.gpu": 60.0, "power.draw": 400.0, "utilization.gpu": 50.0}}
    pairs = [
        (smi, {UUID: {"DCGM_FI_DEV_GPU_TEMP": 61.0, "DCGM_FI_DEV_POWER_USAGE": 420.0}}),
        (smi, {UUID: {"DCGM_FI_DEV_GPU_TEMP": 63.0, "DCGM_FI_DEV_POWER_USAGE": 449.0}}),
    ]
    results = {r.field: r for r in compare(pairs)}
    temp = results["DCGM_FI_DEV_GPU_TEMP"]
    assert (temp.samples, temp.worst_difference, temp.allowed_at_worst) == (2, 3.0, 2.0)
    assert not temp.within
    power = results["DCGM_FI_DEV_POWER_USAGE"]
    assert power.worst_difference == 49.0 and power.allowed_at_worst == pytest.approx(50.0)
    assert power.within
    assert not results["DCGM_FI_DEV_GPU_UTIL"].within  # nvidia-smi has it, the exporter not


FAKE_SMI = """#!{python}
# Stands in for nvidia-smi: answers --query-gpu from the exporter's own /metrics, shifted.
import os, sys, requests
sys.path.insert(0, {repo!r})
from prometheus_client.parser import text_string_to_metric_families
names = {{"memory.total": "DCGM_FI_DEV_FB_TOTAL", "memory.used": "DCGM_FI_DEV_FB_USED",
         "temperature.gpu": "DCGM_FI_DEV_GPU_TEMP", "temperature.memory": "DCGM_FI_DEV_MEMORY_TEMP",
         "power.draw": "DCGM_FI_DEV_POWER_USAGE", "power.limit": "DCGM_FI_DEV_POWER_MGMT_LIMIT",
         "clocks.sm": "DCGM_FI_DEV_SM_CLOCK", "clocks.mem": "DCGM_FI_DEV_MEM_CLOCK",
         "utilization.gpu": "DCGM_FI_DEV_GPU_UTIL"}}
fields = sys.argv[1].split("=", 1)[1].split(",")
values = {{}}
text = requests.get(os.environ["EXPORTER_URL"] + "/metrics", timeout=10).text
for family in text_string_to_metric_families(text):
    for s in family.samples:
        values.setdefault(s.labels.get("UUID"), {{}})[family.name] = s.value
shift = float(os.environ.get("TEMP_SHIFT", "0"))
for uuid, v in values.items():
    if not uuid:
        continue
    row = [uuid] + [str(v[names[f]] + (shift if f == "temperature.gpu" else 0)) for f in fields[1:]]
    print(", ".join(row))
"""


@pytest.mark.parametrize(("shift", "code"), [(0.0, 0), (25.0, 1)])
def test_a_whole_run_agrees_with_a_matching_nvidia_smi_and_catches_a_wrong_one(
    start_exporter, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shift: float, code: int
) -> None:
    # A steady load and a slow collection: both tools read the same snapshot.
    exporter = start_exporter(
        "--source", "simulated", "--gpus", "2", "--profile", "constant:0.5", "--interval", "5"
    )
    wait_until(
        lambda: requests.get(f"{exporter.url}/readyz", timeout=5).status_code == 200,
        timeout=20,
        what="ready",
    )
    fake = tmp_path / "nvidia-smi"
    fake.write_text(FAKE_SMI.format(python=sys.executable, repo=str(SCRIPT.parents[1])))
    fake.chmod(0o755)
    monkeypatch.setenv("EXPORTER_URL", exporter.url)
    monkeypatch.setenv("TEMP_SHIFT", str(shift))
    out = tmp_path / "result.json"
    argv = ["--exporter-url", exporter.url, "--nvidia-smi", str(fake), "--no-load"]
    argv += ["--samples", "3", "--pause", "0", "--json", str(out)]
    assert exporter_gpu.main(argv) == code
    report = json.loads(out.read_text())
    temps = [f for f in report["fields"] if f["field"] == "DCGM_FI_DEV_GPU_TEMP"]
    assert len(temps) == 2 and all(f["samples"] == 3 for f in temps)
    assert all(f["within"] == (shift == 0) for f in temps)
    assert report["all_within"] == (code == 0)
    assert report["collection_seconds"] and os.path.exists(out)
