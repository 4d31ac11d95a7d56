"""A real Prometheus scrapes the real exporter process (8 simulated GPUs) and answers PromQL.

The exporter also reads pod attribution from a real gRPC server on a unix socket that serves the
kubelet's pod-resources API, so the pod labels travel the whole way to PromQL.
"""

from __future__ import annotations

import pytest
import requests

from exporter.podresources import api_pb2 as pb
from exporter.sources import SimulatedSource, load_profile
from tests.exporter.fake_kubelet import container, pod
from tests.live import Prometheus, scrape_job

SEED = 3


def simulated_uuids() -> list[str]:
    source = SimulatedSource(8, "NVIDIA H100 80GB HBM3", SEED, load_profile("constant:0.5"))
    try:
        return [d.uuid for d in source.devices()]
    finally:
        source.close()


@pytest.mark.live
@pytest.mark.timeout(120)
def test_prometheus_scrapes_eight_simulated_gpus_with_pod_labels(start_exporter, kubelet, tmp_path):
    uuids = simulated_uuids()
    kubelet.service.reply = pb.ListPodResourcesResponse(
        pod_resources=[  # GPU 0 time-sliced by two pods; GPU 1 by one
            pod("ml", "chat-0", container("model", **{"nvidia.com/gpu": [f"{uuids[0]}::0"]})),
            pod("ml", "chat-1", container("model", **{"nvidia.com/gpu": [f"{uuids[0]}::1"]})),
            pod("ml", "embed-0", container("model", **{"nvidia.com/gpu": [uuids[1]]})),
        ]
    )
    exporter = start_exporter(
        "--source", "simulated", "--gpus", "8", "--seed", str(SEED), "--hostname", "e2e-node",
        "--kubernetes", "--pod-resources-socket", str(kubelet.socket_path),
        "--pod-resources-interval", "1",
    )  # fmt: skip
    with Prometheus(tmp_path / "prometheus", [scrape_job("gpu", [exporter.address])]) as prom:
        # The first scrape of a fresh Prometheus lands a few seconds after it starts.
        per_gpu = prom.wait_for(
            "avg by (gpu) (DCGM_FI_DEV_GPU_UTIL)", lambda r: len(r) == 8, timeout=60
        )
        assert sorted(int(s["metric"]["gpu"]) for s in per_gpu) == list(range(8))
        assert all(0.0 <= float(s["value"][1]) <= 100.0 for s in per_gpu)

        shared = prom.wait_for('DCGM_FI_DEV_GPU_UTIL{gpu="0"}', lambda r: len(r) == 2)
        assert sorted(s["metric"].get("pod", "") for s in shared) == ["chat-0", "chat-1"]
        assert {s["metric"]["namespace"] for s in shared} == {"ml"}
        assert prom.query('DCGM_FI_DEV_FB_USED{gpu="1"}')[0]["metric"]["pod"] == "embed-0"
        assert "pod" not in prom.query('DCGM_FI_DEV_FB_USED{gpu="5"}')[0]["metric"]

        # Prometheus negotiates OpenMetrics: DCGM counters keep their exact names there.
        replays = prom.query("count(DCGM_FI_DEV_PCIE_REPLAY_COUNTER)")
        assert replays and float(replays[0]["value"][1]) == 9  # 8 GPUs, GPU 0 twice
        labels = prom.query('DCGM_FI_DEV_FB_USED{gpu="5"}')[0]["metric"]
        assert {"UUID", "pci_bus_id", "device", "modelName", "Hostname"} <= set(labels)
        assert prom.query('up{job="gpu"}')[0]["value"][1] == "1"
        health = prom.query("autoglm_exporter_gpu_up")
        assert len(health) == 8 and all(s["value"][1] == "1" for s in health)
        assert {s["metric"]["Hostname"] for s in health} == {"e2e-node"}
        # Our per-GPU health joins with the DCGM series on DCGM's own label names.
        joined = prom.query("count(autoglm_exporter_gpu_up == 1 and on(UUID) DCGM_FI_DEV_GPU_UTIL)")
        assert joined and joined[0]["value"][1] == "8"
        assert prom.query("autoglm_exporter_pod_resources_up")[0]["value"][1] == "1"
        assert prom.query("autoglm_exporter_pod_resources_pods_attributed")[0]["value"][1] == "3"

        # A critical Xid's counter exists at 0 before its first event, so that first event is
        # an increase PromQL sees, on the series of each pod using the GPU.
        before = prom.query('autoglm_gpu_xid_errors_total{gpu="0", xid="79"}')
        assert sorted((s["metric"]["pod"], s["value"][1]) for s in before) == [
            ("chat-0", "0"), ("chat-1", "0"),
        ]  # fmt: skip
        reply = requests.post(f"{exporter.url}/debug/faults", data="xid:gpu=0:code=79", timeout=5)
        assert reply.status_code == 200, reply.text
        hit = prom.wait_for(
            'increase(autoglm_gpu_xid_errors_total{xid="79"}[30s]) > 0', lambda r: len(r) == 2
        )
        assert sorted(s["metric"]["pod"] for s in hit) == ["chat-0", "chat-1"]
        assert {s["metric"]["gpu"] for s in hit} == {"0"}
