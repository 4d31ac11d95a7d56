"""dcgm-exporter counters CSV: the fields chosen, their help text, what is skipped or refused,
and that an unchosen field is neither served nor read from NVML."""

from __future__ import annotations

import pytest
import requests

from autoglm.config import ConfigError
from exporter.collector import Collector
from exporter.counters import ALL_FIELDS, load_counters, parse_counters
from exporter.fields import FIELDS, PROFILING_FIELDS
from exporter.render import render
from exporter.sources import NVMLSource
from tests.exporter.fake_pynvml import FakeNVML
from tests.exporter.test_cli import metric_lines, run_main
from tests.exporter.test_nvml_source import two_gpus
from tests.waiting import wait_until

# Written the way dcgm-exporter's shipped files are: comments, aligned columns, commas in help,
# a label field and NVLink per-lane fields this exporter does not collect.
DCGM_STYLE = """\
# Format
# If line starts with a '#' it is considered a comment
# DCGM FIELD, Prometheus metric type, help message

# Utilization
DCGM_FI_DEV_GPU_UTIL,      gauge, GPU utilization (in %).
DCGM_FI_DEV_FB_USED,       gauge, Framebuffer memory used (in MiB), as seen by the driver.

DCGM_FI_DEV_NVLINK_BANDWIDTH_L0, counter, The number of bytes of active NVLink rx or tx data.
DCGM_FI_DRIVER_VERSION,    label, Driver Version
DCGM_FI_DEV_ECC_DBE_VOL_TOTAL, counter
"""


def test_a_dcgm_exporter_file_selects_its_fields_in_order_with_its_help_text() -> None:
    selection = parse_counters(DCGM_STYLE)
    assert [f.dcgm_name for f in selection.fields] == [
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    ]
    used = selection.fields[1]
    assert used.dcgm_help == "Framebuffer memory used (in MiB), as seen by the driver."
    # No help column: the catalogue's help stays.
    assert selection.fields[2].dcgm_help == "Total number of double-bit volatile ECC errors."
    assert selection.not_collected == ("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0", "DCGM_FI_DRIVER_VERSION")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("GPU_UTIL, gauge, x", "line 1: 'GPU_UTIL' is not a DCGM field name"),
        ("# c\nDCGM_FI_DEV_GPU_UTIL, gague, x", "line 2: type 'gague' of DCGM_FI_DEV_GPU_UTIL"),
        (
            "DCGM_FI_DEV_GPU_UTIL, counter, x",
            "DCGM_FI_DEV_GPU_UTIL is a gauge, not a counter; change the type column to gauge",
        ),
        (
            "DCGM_FI_DEV_GPU_UTIL, gauge\nDCGM_FI_DEV_GPU_UTIL, gauge",
            "line 2: DCGM_FI_DEV_GPU_UTIL is listed twice",
        ),
        ("DCGM_FI_DEV_GPU_UTIL", "line 1: 'DCGM_FI_DEV_GPU_UTIL' is not 'FIELD, TYPE, HELP'"),
        ("# nothing\n\n", "names no field this exporter collects; supported fields: DCGM_FI_"),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_L0, counter, x", "names no field this exporter collects"),
    ],
)
def test_bad_files_name_the_line_and_the_fix(text: str, message: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_counters(text)
    assert message in str(info.value)


def test_no_file_means_every_field_and_a_missing_file_is_a_config_error(tmp_path) -> None:
    assert load_counters(None) is ALL_FIELDS
    assert ALL_FIELDS.fields == FIELDS
    with pytest.raises(ConfigError, match="cannot read it"):
        load_counters(str(tmp_path / "missing.csv"))
    latin1 = tmp_path / "latin1.csv"
    latin1.write_bytes(b"# caf\xe9\nDCGM_FI_DEV_GPU_TEMP, gauge, temperature\n")
    with pytest.raises(ConfigError, match=r"latin1\.csv' is not UTF-8 text"):
        load_counters(str(latin1))


def test_only_chosen_fields_are_rendered_in_both_namings(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNVML(two_gpus())
    fake.install(monkeypatch)
    source = NVMLSource.open(event_timeout_ms=20)
    try:
        collector = Collector(source, lambda snapshot: None, interval=1.0, deadline=0.8)
        snapshot = collector.collect_once()
        collector.stop()
    finally:
        source.close()
    selection = parse_counters(DCGM_STYLE)
    dcgm = render(snapshot, "dcgm", "node-1", fields=selection.fields).text.decode()
    gpu_names = {line.split("{")[0] for line in dcgm.splitlines() if line.startswith("DCGM_FI_")}
    assert gpu_names == {
        "DCGM_FI_DEV_GPU_UTIL",
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    }
    assert (
        "# HELP DCGM_FI_DEV_FB_USED Framebuffer memory used (in MiB), as seen by the driver."
        in dcgm
    )
    prom = render(snapshot, "prometheus", "node-1", fields=selection.fields).text.decode()
    assert "autoglm_gpu_utilization_ratio{" in prom
    assert "autoglm_gpu_power_watts" not in prom


def test_nvml_is_not_asked_for_fields_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    """Profiling samples and unrelated queries cost NVML time: an unchosen field costs none."""
    fake = FakeNVML(two_gpus())
    fake.install(monkeypatch)
    source = NVMLSource.open(event_timeout_ms=20, fields=parse_counters(DCGM_STYLE).names)
    try:
        gpu0 = source.devices()[0]
        source.read(gpu0)
        reading = source.read(gpu0)
    finally:
        source.close()
    assert {"DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"} <= set(
        reading.values
    )
    assert not set(PROFILING_FIELDS) & set(reading.values)
    assert "nvmlGpmSampleGet" not in fake.calls
    assert "nvmlDeviceGetPowerUsage" not in fake.calls
    assert "nvmlDeviceGetTemperature" not in fake.calls


def test_the_exporter_serves_only_the_files_fields(start_exporter, tmp_path) -> None:
    counters = tmp_path / "counters.csv"
    counters.write_text(DCGM_STYLE)
    exporter = start_exporter(
        "--source", "simulated", "--gpus", "2", "--interval", "0.2", "--collectors", str(counters)
    )
    wait_until(
        lambda: requests.get(f"{exporter.url}/readyz", timeout=5).status_code == 200,
        timeout=20,
        what="ready",
    )
    # A GPU whose read misses a cycle's deadline on a busy machine is absent from that cycle.
    wait_until(
        lambda: len(metric_lines(exporter.url, "DCGM_FI_DEV_GPU_UTIL{")) == 2,
        timeout=20,
        what="both GPUs",
    )
    assert metric_lines(exporter.url, "DCGM_FI_DEV_POWER_USAGE{") == []
    assert metric_lines(exporter.url, "autoglm_gpu_xid_errors_total{")  # the exporter's own


def test_a_bad_counters_file_stops_the_exporter_with_one_line(capsys, tmp_path) -> None:
    counters = tmp_path / "counters.csv"
    counters.write_text("DCGM_FI_DEV_GPU_UTIL, counter, x\n")
    code, err = run_main(capsys, "--source", "simulated", "--collectors", str(counters))
    assert code == 2
    assert len(err) == 1
    assert "line 1: DCGM_FI_DEV_GPU_UTIL is a gauge, not a counter" in err[0]
