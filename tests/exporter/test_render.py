"""Rendering snapshots in both namings and both formats, read back with real parsers."""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from types import MappingProxyType

import pytest
from prometheus_client.openmetrics.parser import (
    text_string_to_metric_families as parse_openmetrics,
)
from prometheus_client.parser import text_string_to_metric_families as parse_text

from exporter.collector import COLLECTION_SECONDS_BUCKETS, DeviceSnapshot, Snapshot, device_key
from exporter.fields import BY_NAME, FIELDS, MIB, PROFILING_FIELDS
from exporter.histogram import Histogram
from exporter.model import DeviceInfo
from exporter.render import escape_label_value, format_value, render, wants_openmetrics
from tests.exporter.fakes import device

NOW = 1_700_000_000.0
ALL_VALUES = {spec.dcgm_name: 2.0 for spec in FIELDS}


@dataclass(frozen=True)
class Pod:
    namespace: str
    pod: str
    container: str


def dev_snapshot(
    info: DeviceInfo,
    values: dict[str, float] | None = None,
    xids: dict[int, int] | None = None,
    last_xid: tuple[int, float] | None = None,
    up: bool = True,
) -> DeviceSnapshot:
    return DeviceSnapshot(
        info=info,
        key=device_key(info),
        up=up,
        values=MappingProxyType(dict(ALL_VALUES if values is None else values)),
        xid_counts=MappingProxyType(xids or {}),
        last_xid=last_xid,
    )


def snapshot(
    *devices: DeviceSnapshot, errors: dict | None = None, durations: tuple[float, ...] = (0.002,)
) -> Snapshot:
    histogram = Histogram.empty(COLLECTION_SECONDS_BUCKETS)
    for duration in durations:
        histogram = histogram.observe(duration)
    return Snapshot(
        taken_at=NOW,
        duration_seconds=durations[-1],
        collection_seconds=histogram,
        devices=devices,
        collections_total=7,
        overruns_total=1,
        last_success=NOW,
        errors_total=MappingProxyType(errors or {}),
    )


def samples(text: str, openmetrics: bool = False) -> dict[str, list[tuple[dict, float]]]:
    """Metric sample name -> [(labels, value)], through prometheus_client's own parsers."""
    parser = parse_openmetrics if openmetrics else parse_text
    out: dict[str, list[tuple[dict, float]]] = {}
    for family in parser(text):
        for s in family.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def types(text: str, openmetrics: bool = False) -> dict[str, str]:
    parser = parse_openmetrics if openmetrics else parse_text
    return {family.name: family.type for family in parser(text)}


def test_dcgm_naming_uses_dcgm_names_units_and_labels():
    exp = render(snapshot(dev_snapshot(device(0))), "dcgm", "node-a")
    got = samples(exp.text.decode())
    labels, value = got["DCGM_FI_DEV_FB_USED"][0]
    assert value == 2.0  # MiB, as DCGM
    assert labels == {
        "gpu": "0",
        "UUID": device(0).uuid,
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-a",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }
    # prometheus_client's parser appends _total to counter samples, so read names off the lines.
    names = {line.split("{")[0] for line in exp.text.decode().splitlines() if "{" in line}
    assert {spec.dcgm_name for spec in FIELDS} <= names
    assert types(exp.text.decode())["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] == "counter"
    assert f"# HELP DCGM_FI_DEV_GPU_UTIL {BY_NAME['DCGM_FI_DEV_GPU_UTIL'].dcgm_help}" in (
        exp.text.decode()
    )


def test_prometheus_naming_uses_base_units_and_snake_case_labels():
    values = dict(ALL_VALUES, DCGM_FI_DEV_FB_USED=1024.0, DCGM_FI_DEV_GPU_UTIL=75.0)
    values.update(DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION=5000.0, DCGM_FI_DEV_SM_CLOCK=1980.0)
    exp = render(snapshot(dev_snapshot(device(3), values)), "prometheus", "node-a")
    got = samples(exp.text.decode())
    assert got["autoglm_gpu_memory_used_bytes"][0][1] == 1024.0 * MIB
    assert got["autoglm_gpu_utilization_ratio"][0][1] == pytest.approx(0.75)
    assert got["autoglm_gpu_energy_joules_total"][0][1] == pytest.approx(5.0)
    assert got["autoglm_gpu_sm_clock_hertz"][0][1] == pytest.approx(1.98e9)
    assert set(got["autoglm_gpu_temperature_celsius"][0][0]) == {
        "gpu", "uuid", "pci_bus_id", "device", "model_name", "hostname", "driver_version",
    }  # fmt: skip
    assert not any(name.startswith("DCGM_") for name in got)


def test_mig_instances_carry_gpu_instance_labels():
    mig = device(1, mig_profile="3g.40gb", mig_instance_id=2, mig_uuid="MIG-1234")
    exp = render(snapshot(dev_snapshot(mig)), "dcgm", "h")
    labels = samples(exp.text.decode())["DCGM_FI_DEV_GPU_TEMP"][0][0]
    assert (labels["GPU_I_PROFILE"], labels["GPU_I_ID"], labels["gpu"]) == ("3g.40gb", "2", "1")
    prom = samples(render(snapshot(dev_snapshot(mig)), "prometheus", "h").text.decode())
    labels = prom["autoglm_gpu_temperature_celsius"][0][0]
    assert (labels["gpu_instance_profile"], labels["gpu_instance_id"]) == ("3g.40gb", "2")


def test_shared_gpu_gets_one_series_per_pod_and_mig_is_attributed_by_mig_uuid():
    mig = device(1, mig_profile="1g.10gb", mig_instance_id=9, mig_uuid="MIG-9")
    attribution = {
        device(0).uuid: [Pod("team-a", "llm-0", "server"), Pod("team-b", "llm-1", "server")],
        "MIG-9": [Pod("team-c", "small-0", "worker")],
        device(1).uuid: [Pod("wrong", "parent-gpu", "x")],  # the MIG UUID wins
    }
    exp = render(
        snapshot(dev_snapshot(device(0)), dev_snapshot(mig), dev_snapshot(device(2))),
        "dcgm",
        "h",
        attribution,
    )
    util = samples(exp.text.decode())["DCGM_FI_DEV_GPU_UTIL"]
    pods = [
        (lab["gpu"], lab.get("namespace"), lab.get("pod"), lab.get("container")) for lab, _ in util
    ]
    assert pods == [
        ("0", "team-a", "llm-0", "server"),
        ("0", "team-b", "llm-1", "server"),
        ("1", "team-c", "small-0", "worker"),
        ("2", None, None, None),
    ]


def test_label_values_are_escaped_and_round_trip():
    nasty = 'we"ird\\name\nnext'
    exp = render(
        snapshot(dev_snapshot(device(0, model_name=nasty))),
        "dcgm",
        "h",
        {device(0).uuid: [Pod("ns", nasty, "c")]},
    )
    for text, om in ((exp.text.decode(), False), (exp.openmetrics.decode() + "# EOF\n", True)):
        labels = samples(text, om)["DCGM_FI_DEV_GPU_TEMP"][0][0]
        assert labels["modelName"] == nasty
        assert labels["pod"] == nasty
    assert escape_label_value(nasty) == r"we\"ird\\name\nnext"


def test_fields_the_gpu_lacks_are_absent_not_zero():
    no_gpm = {k: v for k, v in ALL_VALUES.items() if k not in PROFILING_FIELDS}
    exp = render(snapshot(dev_snapshot(device(0), no_gpm)), "dcgm", "h")
    text = exp.text.decode()
    for name in PROFILING_FIELDS:
        assert name not in text
    assert "DCGM_FI_DEV_GPU_UTIL{" in text


def test_a_down_gpu_has_no_field_series_but_keeps_its_xid_history_and_up_zero():
    down = dev_snapshot(device(0), values={}, xids={79: 2}, last_xid=(79, NOW - 3), up=False)
    exp = render(
        snapshot(down, dev_snapshot(device(1)), errors={("0", "all", "timeout"): 4}),
        "prometheus",
        "h",
    )
    got = samples(exp.text.decode())
    assert [lab["gpu"] for lab, _ in got["autoglm_gpu_temperature_celsius"]] == ["1"]
    xid = got["autoglm_gpu_xid_errors_total"]
    assert [(lab["gpu"], lab["xid"], v) for lab, v in xid] == [("0", "79", 2.0)]
    assert got["autoglm_gpu_last_xid_timestamp_seconds"][0][1] == NOW - 3
    up = {lab["gpu"]: v for lab, v in got["autoglm_exporter_gpu_up"]}
    assert up == {"0": 0.0, "1": 1.0}
    errors = got["autoglm_exporter_collect_errors_total"]
    assert errors == [({"gpu": "0", "field": "all", "reason": "timeout", "hostname": "h"}, 4.0)]
    assert got["autoglm_exporter_collections_total"][0][1] == 7.0
    assert got["autoglm_exporter_last_success_timestamp_seconds"][0][1] == NOW


@pytest.mark.parametrize(
    ("naming", "host_label", "uuid_label", "instance_label"),
    [
        ("dcgm", "Hostname", "UUID", "GPU_I_ID"),
        ("prometheus", "hostname", "uuid", "gpu_instance_id"),
    ],
)
def test_per_gpu_health_series_name_the_node_like_the_gpu_series(
    naming, host_label, uuid_label, instance_label
):
    mig = device(1, mig_profile="1g.10gb", mig_instance_id=3, mig_uuid="MIG-3")
    exp = render(
        snapshot(dev_snapshot(device(0)), dev_snapshot(mig), errors={("0", "all", "timeout"): 1}),
        naming,
        "gpu-node-7",
    )
    got = samples(exp.text.decode())
    temperature = "DCGM_FI_DEV_GPU_TEMP" if naming == "dcgm" else "autoglm_gpu_temperature_celsius"
    assert got[temperature][0][0][host_label] == "gpu-node-7"
    up = [labels for labels, _ in got["autoglm_exporter_gpu_up"]]
    assert up == [
        {"gpu": "0", uuid_label: device(0).uuid, host_label: "gpu-node-7"},
        {"gpu": "1/3", uuid_label: device(1).uuid, instance_label: "3", host_label: "gpu-node-7"},
    ]
    # Joinable with the GPU series, as `on(UUID, GPU_I_ID, Hostname)` does: the same label names
    # with the same values, a MIG instance told apart by its instance id.
    join = (uuid_label, instance_label, host_label)
    gpu_series = {tuple(labels.get(k) for k in join) for labels, _ in got[temperature]}
    assert {tuple(labels.get(k) for k in join) for labels in up} == gpu_series
    ((errors, _),) = got["autoglm_exporter_collect_errors_total"]
    assert errors[host_label] == "gpu-node-7"
    # Exporter-wide series stay without per-GPU labels.
    assert got["autoglm_exporter_collections_total"][0][0] == {}


def test_xid_history_carries_the_pods_of_the_gpu():
    shared = dev_snapshot(device(0), xids={79: 1, 13: 0}, last_xid=(79, NOW - 5))
    alone = dev_snapshot(device(1), xids={79: 0})
    attribution = {
        device(0).uuid: [Pod("ml", "chat-0", "model"), Pod("ml", "chat-1", "model")],
    }
    got = samples(render(snapshot(shared, alone), "dcgm", "h", attribution).text.decode())
    xid = [
        (lab["gpu"], lab["xid"], lab.get("pod"), lab.get("namespace"), lab.get("container"), v)
        for lab, v in got["autoglm_gpu_xid_errors_total"]
    ]
    assert xid == [
        ("0", "13", "chat-0", "ml", "model", 0.0),
        ("0", "13", "chat-1", "ml", "model", 0.0),
        ("0", "79", "chat-0", "ml", "model", 1.0),
        ("0", "79", "chat-1", "ml", "model", 1.0),
        ("1", "79", None, None, None, 0.0),
    ]
    last = [(lab.get("pod"), v) for lab, v in got["autoglm_gpu_last_xid_timestamp_seconds"]]
    assert last == [("chat-0", NOW - 5), ("chat-1", NOW - 5)]
    field = {lab.get("pod"): v for lab, v in got["DCGM_FI_DEV_XID_ERRORS"] if lab["gpu"] == "0"}
    assert set(field) == {"chat-0", "chat-1"}  # the DCGM field has the same series


def test_openmetrics_keeps_dcgm_counter_names_and_types_autoglm_counters():
    exp = render(snapshot(dev_snapshot(device(0), xids={13: 1})), "dcgm", "h")
    body = exp.body("openmetrics", NOW + 0.25, compressed=False).decode()
    assert body.endswith("# EOF\n")
    got = samples(body, openmetrics=True)
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" in got  # not renamed to ..._total
    assert got["autoglm_exporter_snapshot_age_seconds"][0][1] == 0.25
    kinds = types(body, openmetrics=True)
    assert kinds["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] == "unknown"
    assert kinds["autoglm_gpu_xid_errors"] == "counter"
    assert kinds["DCGM_FI_DEV_GPU_UTIL"] == "gauge"


def test_gzip_body_is_the_plain_body():
    exp = render(snapshot(dev_snapshot(device(0))), "dcgm", "h")
    for fmt in ("text", "openmetrics"):
        plain = exp.body(fmt, NOW + 1, compressed=False)
        assert gzip.decompress(exp.body(fmt, NOW + 1, compressed=True)) == plain


def test_pod_resources_health_is_rendered_when_a_watcher_is_configured():
    class Watcher:
        healthy = False
        last_success = NOW - 60

    got = samples(render(snapshot(), "dcgm", "h", pod_resources=Watcher()).text.decode())
    assert got["autoglm_exporter_pod_resources_up"][0][1] == 0.0
    assert got["autoglm_exporter_pod_resources_last_success_timestamp_seconds"][0][1] == NOW - 60
    assert "autoglm_exporter_pod_resources_up" not in samples(
        render(snapshot(), "dcgm", "h").text.decode()
    )


@pytest.mark.parametrize(
    ("value", "text"),
    [(42.0, "42"), (0.5, "0.5"), (float("nan"), "NaN"), (float("inf"), "+Inf"), (1e20, "1e+20")],
)
def test_format_value(value, text):
    assert format_value(value) == text


def test_accept_header_negotiation():
    prometheus_default = (
        "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
        "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
    )
    assert wants_openmetrics(prometheus_default)
    assert not wants_openmetrics("text/plain;version=0.0.4")
    assert not wants_openmetrics(None)


def test_collection_durations_are_a_histogram_in_both_formats_beside_the_last_duration_gauge():
    exp = render(snapshot(durations=(0.004, 0.03, 0.7, 0.004)), "dcgm", "h")
    expected_buckets = {
        "0.001": 0, "0.0025": 0, "0.005": 2, "0.01": 2, "0.025": 2, "0.05": 3, "0.1": 3,
        "0.25": 3, "0.5": 3, "1.0": 4, "2.5": 4, "5.0": 4, "10.0": 4, "+Inf": 4,
    }  # fmt: skip
    for text, om in ((exp.text.decode(), False), (exp.openmetrics.decode() + "# EOF\n", True)):
        assert types(text, om)["autoglm_exporter_collection_seconds"] == "histogram"
        got = samples(text, om)
        buckets = {
            labels["le"]: value
            for labels, value in got["autoglm_exporter_collection_seconds_bucket"]
        }
        assert buckets == expected_buckets
        assert got["autoglm_exporter_collection_seconds_count"] == [({}, 4.0)]
        assert got["autoglm_exporter_collection_seconds_sum"][0][1] == pytest.approx(0.738)
        # The gauge keeps its name and meaning: the last collection only.
        assert got["autoglm_exporter_collection_duration_seconds"] == [({}, 0.004)]
