"""The exporter command: one-line errors with exit codes, and the running process over HTTP."""

from __future__ import annotations

import gzip
import logging
import signal
import socket
from collections.abc import Iterator

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from exporter.cli import main
from exporter.podresources import api_pb2 as pb
from exporter.service import ExporterService
from exporter.sources import SimulatedSource, load_profile, parse_fault
from tests.exporter.fake_kubelet import container, pod
from tests.exporter.fakes import ScriptedSource, device
from tests.waiting import wait_until


@pytest.fixture(autouse=True)
def restore_logging() -> Iterator[None]:
    """main() points the root logger at the captured stderr; put it back after each test."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)


def run_main(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    return code, err


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--interval", "0"], "--interval must be > 0"),
        (["--interval", "1", "--deadline", "2"], "--deadline 2 must be > 0 and no longer"),
        (["--gpus", "x"], "--gpus: 'x' is not a whole number; give an integer such as 8"),
        (["--naming", "camel"], "invalid choice"),
        (["--listen", "nowhere"], "must be HOST:PORT"),
        (["--fault", "xid:gpu=0:code=79"], "--fault needs --source simulated"),
        (["--source", "simulated", "--fault", "melt:gpu=0"], "unknown fault kind 'melt'"),
        (["--source", "simulated", "--fault", "lost:gpu=99"], "gpu"),
        (["--source", "simulated", "--profile", "sine:1"], "--profile"),
        (["--source", "simulated", "--web-config-file", "/nonexistent.yml"], "nonexistent"),
        (["--no-such-flag"], "unrecognized arguments"),
    ],
)
def test_bad_settings_exit_2_with_one_line(capsys, argv, needle):
    code, err = run_main(capsys, *argv)
    assert code == 2
    assert len(err) == 1, err
    assert needle in err[0]


def test_bad_yaml_setting_exits_2(capsys, tmp_path):
    config = tmp_path / "exporter.yaml"
    config.write_text("source: simulated\ninterval: soon\n")
    code, err = run_main(capsys, "--config", str(config))
    assert code == 2
    # The value came from the file: the line names the file and its key, not a flag.
    assert err == [
        f"autoglm-exporter: error: {config}: interval: 'soon' is not a number; "
        "give a number such as 1"
    ]


@pytest.mark.parametrize("source", ["auto", "nvml"])
def test_without_a_driver_nvml_stops_with_one_line_naming_the_fix(capsys, source):
    code, err = run_main(capsys, "--source", source)
    assert code == 1
    assert len(err) == 1
    assert "no NVIDIA driver" in err[0]
    assert "--source simulated" in err[0]


def test_taken_port_exits_2(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        code, err = run_main(
            capsys, "--source", "simulated", "--gpus", "1", "--listen", f"127.0.0.1:{port}"
        )
    assert code == 2
    assert "cannot listen on" in err[-1]


def metric_lines(url: str, prefix: str) -> list[str]:
    text = requests.get(f"{url}/metrics", timeout=5).text
    return [line for line in text.splitlines() if line.startswith(prefix)]


@pytest.mark.timeout(90)
def test_running_exporter_serves_health_metrics_formats_and_takes_faults(start_exporter):
    exporter = start_exporter("--source", "simulated", "--gpus", "2", "--interval", "0.2")
    url = exporter.url
    assert requests.get(f"{url}/healthz", timeout=5).text == "ok\n"
    wait_until(
        lambda: requests.get(f"{url}/readyz", timeout=5).status_code == 200,
        timeout=20,
        what="ready",
    )

    assert len(metric_lines(url, "DCGM_FI_DEV_GPU_UTIL{")) == 2
    om = requests.get(
        f"{url}/metrics",
        headers={"Accept": "application/openmetrics-text; version=1.0.0", "Accept-Encoding": ""},
        timeout=5,
    )
    assert om.headers["Content-Type"].startswith("application/openmetrics-text")
    assert om.text.endswith("# EOF\n")
    raw = requests.get(
        f"{url}/metrics", headers={"Accept-Encoding": "gzip"}, timeout=5, stream=True
    )
    assert raw.headers["Content-Encoding"] == "gzip"
    assert b"DCGM_FI_DEV_FB_USED{" in gzip.decompress(raw.raw.read())

    # Faults at run time: an Xid is counted (from 0: critical codes exist before their first
    # event) and shown; a lost GPU's series go away.
    def xid79_on_gpu1() -> list[str]:
        lines = metric_lines(url, 'autoglm_gpu_xid_errors_total{gpu="1"')
        return [line.rsplit(" ", 1)[1] for line in lines if 'xid="79"' in line]

    assert xid79_on_gpu1() == ["0"]
    reply = requests.post(f"{url}/debug/faults", data="xid:gpu=1:code=79", timeout=5)
    assert reply.status_code == 200, reply.text
    wait_until(lambda: xid79_on_gpu1() == ["1"], timeout=20, what="the Xid counter")
    xid_field = metric_lines(url, 'DCGM_FI_DEV_XID_ERRORS{gpu="1"')
    assert xid_field and xid_field[0].endswith(" 79")
    assert requests.post(f"{url}/debug/faults", data="lost:gpu=0", timeout=5).ok
    wait_until(
        lambda: [x.split('"')[1] for x in metric_lines(url, "DCGM_FI_DEV_GPU_UTIL{")] == ["1"],
        timeout=20,
        what="GPU 0's series to be dropped",
    )
    assert any(
        'gpu="0"' in line and 'reason="gpu_is_lost"' in line
        for line in metric_lines(url, "autoglm_exporter_collect_errors_total")
    )
    bad = requests.post(f"{url}/debug/faults", data="melt:gpu=0", timeout=5)
    assert bad.status_code == 400 and "unknown fault kind" in bad.text
    assert requests.delete(f"{url}/debug/faults", timeout=5).ok
    wait_until(
        lambda: len(metric_lines(url, "DCGM_FI_DEV_GPU_UTIL{")) == 2, timeout=20, what="recovery"
    )

    # The simulated GPUs take an outside load (the batcher's, under `autoglm up`).
    load = requests.put(f"{url}/debug/load", json={"gpu": 1, "utilization": 0.25}, timeout=5)
    assert load.status_code == 200, load.text
    wait_until(
        lambda: metric_lines(url, 'DCGM_FI_DEV_GPU_UTIL{gpu="1"')[0].endswith(" 25"),
        timeout=20,
        what="GPU 1 driven to 25 %",
    )

    assert exporter.stop(signal.SIGTERM) == 0


@pytest.mark.timeout(60)
def test_pod_resources_metrics_are_served_with_pod_labels(start_exporter, kubelet):
    uuid = SimulatedSource(1, "h100", 4, load_profile("constant:0.5")).devices()[0].uuid
    kubelet.service.reply = pb.ListPodResourcesResponse(
        pod_resources=[
            pod("ml", "chat-0", container("model", **{"nvidia.com/gpu": [f"{uuid}::0"]})),
            pod("ml", "chat-1", container("model", **{"nvidia.com/gpu": [f"{uuid}::1"]})),
        ]
    )
    exporter = start_exporter(
        "--source", "simulated", "--gpus", "1", "--model", "h100", "--seed", "4",
        "--kubernetes", "--pod-resources-socket", str(kubelet.socket_path),
    )  # fmt: skip
    url = exporter.url
    wait_until(
        lambda: metric_lines(url, "autoglm_exporter_pod_resources_up"), timeout=20, what="metrics"
    )
    # The watcher's own metrics travel with the exporter's registry onto /metrics.
    assert metric_lines(url, "autoglm_exporter_pod_resources_pods_attributed ") == [
        "autoglm_exporter_pod_resources_pods_attributed 2.0"
    ]
    assert metric_lines(url, "autoglm_exporter_pod_resources_devices_attributed ") == [
        "autoglm_exporter_pod_resources_devices_attributed 1.0"
    ]
    assert metric_lines(url, "autoglm_exporter_pod_resources_up ") == [
        "autoglm_exporter_pod_resources_up 1"
    ]
    pods = [
        line.split('pod="')[1].split('"')[0] for line in metric_lines(url, "DCGM_FI_DEV_GPU_UTIL{")
    ]
    assert pods == ["chat-0", "chat-1"]


@pytest.mark.timeout(60)
def test_unreachable_kubelet_is_counted_on_metrics(start_exporter, socket_dir):
    exporter = start_exporter(
        "--source", "simulated", "--gpus", "1", "--kubernetes",
        "--pod-resources-socket", str(socket_dir / "absent.sock"),
    )  # fmt: skip
    url = exporter.url
    wait_until(
        lambda: metric_lines(url, "autoglm_exporter_pod_resources_up"), timeout=20, what="metrics"
    )
    errors = metric_lines(url, "autoglm_exporter_pod_resources_refresh_errors_total{")
    assert errors and 'reason="socket_missing"' in errors[0]
    assert metric_lines(url, "autoglm_exporter_pod_resources_up ") == [
        "autoglm_exporter_pod_resources_up 0"
    ]
    assert "pod=" not in metric_lines(url, "DCGM_FI_DEV_GPU_UTIL{")[0]


@pytest.mark.timeout(60)
def test_sigint_stops_cleanly_with_prometheus_naming(start_exporter):
    exporter = start_exporter("--source", "simulated", "--gpus", "1", "--naming", "prometheus")
    wait_until(
        lambda: metric_lines(exporter.url, "autoglm_gpu_power_watts{"), timeout=20, what="metrics"
    )
    assert exporter.stop(signal.SIGINT) == 0


def test_fault_routes_exist_only_for_a_fault_taking_source():
    source = ScriptedSource([device(0)])
    service = ExporterService(source, listen="127.0.0.1:0", interval=0.2, deadline=0.2)
    service.start()
    try:
        wait_until(lambda: service.exposition is not None, timeout=20, what="the first collection")
        reply = requests.post(f"{service.server.url}/debug/faults", data="lost:gpu=0", timeout=5)
        assert reply.status_code == 404
        assert requests.get(f"{service.server.url}/readyz", timeout=5).status_code == 200
    finally:
        service.stop()
        source.close()


def test_whole_gpu_error_counters_are_served_at_0_before_the_first_error():
    """rate() and alerts over the error counter see 0, not nothing, until a GPU fails, and the
    failure then increases the very series that was there at 0."""
    source = SimulatedSource(2, "h100", 1, load_profile("constant:0.5"))
    service = ExporterService(
        source,
        listen="127.0.0.1:0",
        hostname="node-1",
        interval=0.2,
        deadline=0.2,
        simulation=source,
    )
    service.start()
    url = f"{service.server.url}/metrics"

    def error_counts() -> dict[tuple[tuple[str, str], ...], float]:
        families = text_string_to_metric_families(requests.get(url, timeout=5).text)
        return {
            tuple(sorted(s.labels.items())): s.value
            for family in families
            if family.name == "autoglm_exporter_collect_errors"
            for s in family.samples
        }

    def key(gpu: str, reason: str) -> tuple[tuple[str, str], ...]:
        labels = {"gpu": gpu, "field": "all", "reason": reason, "Hostname": "node-1"}
        return tuple(sorted(labels.items()))

    known = {key(gpu, reason) for gpu in ("0", "1") for reason in ("timeout", "gpu_is_lost")}
    try:
        wait_until(lambda: service.exposition is not None, timeout=20, what="the first collection")
        before = error_counts()
        assert set(before) == known
        assert before[key("0", "gpu_is_lost")] == before[key("1", "gpu_is_lost")] == 0.0
        source.inject(parse_fault("lost:gpu=1"))
        wait_until(
            lambda: error_counts()[key("1", "gpu_is_lost")] > 0, timeout=20, what="the lost GPU"
        )
        after = error_counts()
        assert set(after) == known
        assert after[key("0", "gpu_is_lost")] == 0.0
    finally:
        service.stop()
        source.close()


def test_readyz_is_503_until_a_collection_reads_a_gpu():
    source = ScriptedSource([device(0)])
    source.raises[0] = RuntimeError("driver not ready")
    service = ExporterService(source, listen="127.0.0.1:0", interval=0.2, deadline=0.2)
    service.start()
    try:
        wait_until(lambda: service.exposition is not None, timeout=20, what="the first collection")
        assert requests.get(f"{service.server.url}/readyz", timeout=5).status_code == 503
        assert requests.get(f"{service.server.url}/metrics", timeout=5).status_code == 200
        del source.raises[0]
        wait_until(
            lambda: requests.get(f"{service.server.url}/readyz", timeout=5).status_code == 200,
            timeout=20,
            what="ready",
        )
    finally:
        service.stop()
        source.close()
