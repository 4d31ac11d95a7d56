"""A live GPU monitoring stack, all real processes on 127.0.0.1.

Two exporter processes on simulated GPUs (``gpu-node-a`` with four GPUs, three of them attributed
to pods by a kubelet pod-resources gRPC server on a unix socket; ``gpu-node-b`` with two), a
Prometheus that scrapes them every second and evaluates ``alerts/rules.yaml`` every second, and an
Alertmanager that routes every alert to a webhook receiver in this process.

At start node A gets an application Xid (13, not critical) and one failing field, as a real node
has now and then, so the Xid and error panels have data; the tests inject the serious faults.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import requests

from exporter.podresources import api_pb2 as pb
from exporter.podresources import api_pb2_grpc
from exporter.sources import SimulatedSource, load_profile
from tests.exporter.processes import ExporterProcess
from tests.live import Prometheus, scrape_job
from tests.live_alertmanager import Alertmanager, WebhookReceiver

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "rules.yaml"
MODEL = "NVIDIA H100 80GB HBM3"
PROFILE = "constant:0.6"
NODE_A, NODE_B = "gpu-node-a", "gpu-node-b"
SEED_A, SEED_B = 11, 12
GPUS_A, GPUS_B = 4, 2
# GPU index on node A -> (namespace, pod, container); GPU 3 is allocated to nobody.
PODS_A = {
    0: ("llm", "llama-7d9f8c6b5-x2x4q", "server"),
    1: ("llm", "llama-7d9f8c6b5-b7k2p", "server"),
    2: ("search", "embed-0", "model"),
}
BACKGROUND_FAULTS_A = ("xid:gpu=0:code=13", "field-error:gpu=3:field=DCGM_FI_DEV_ENC_UTIL")


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's pod-resources ``List``, answering with fixed pods on fixed GPUs."""

    def __init__(self, reply: pb.ListPodResourcesResponse) -> None:
        self.reply = reply

    def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        return self.reply


def _pod_resources(gpu_uuids: list[str]) -> pb.ListPodResourcesResponse:
    pods = [
        pb.PodResources(
            name=pod,
            namespace=namespace,
            containers=[
                pb.ContainerResources(
                    name=container,
                    devices=[
                        pb.ContainerDevices(
                            resource_name="nvidia.com/gpu", device_ids=[gpu_uuids[index]]
                        )
                    ],
                )
            ],
        )
        for index, (namespace, pod, container) in PODS_A.items()
    ]
    return pb.ListPodResourcesResponse(pod_resources=pods)


@dataclass
class LiveStack:
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: WebhookReceiver
    exporter_a: ExporterProcess
    exporter_b: ExporterProcess
    started_at: float  # unix time the exporters started

    def inject(self, spec: str) -> None:
        """Inject a fault into node A's simulated GPUs through the running exporter."""
        reply = requests.post(f"{self.exporter_a.url}/debug/faults", data=spec, timeout=5)
        assert reply.status_code == 200, reply.text


def _exporter(hostname: str, gpus: int, seed: int, *extra: str) -> ExporterProcess:
    return ExporterProcess(
        [
            "--source", "simulated", "--gpus", str(gpus), "--seed", str(seed),
            "--model", MODEL, "--profile", PROFILE, "--hostname", hostname, *extra,
        ]
    )  # fmt: skip


@contextmanager
def running_stack(workdir: Path) -> Iterator[LiveStack]:
    """Start the whole stack in ``workdir``; everything started is stopped on exit."""
    gpu_uuids = [
        d.uuid for d in SimulatedSource(GPUS_A, MODEL, SEED_A, load_profile(PROFILE)).devices()
    ]
    socket_path = workdir / "kubelet.sock"
    kubelet = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    api_pb2_grpc.add_PodResourcesListerServicer_to_server(
        FakeKubelet(_pod_resources(gpu_uuids)), kubelet
    )
    kubelet.add_insecure_port(f"unix://{socket_path}")
    kubelet.start()
    started: list[object] = []
    try:
        webhook = WebhookReceiver().start()
        started.append(webhook)
        alertmanager = Alertmanager(workdir / "alertmanager", webhook.url).start()
        started.append(alertmanager)
        faults = [arg for spec in BACKGROUND_FAULTS_A for arg in ("--fault", spec)]
        started_at = time.time()
        exporter_a = _exporter(
            NODE_A, GPUS_A, SEED_A, "--kubernetes", "--pod-resources-socket", str(socket_path),
            "--pod-resources-interval", "1", *faults,
        )  # fmt: skip
        started.append(exporter_a)
        exporter_b = _exporter(NODE_B, GPUS_B, SEED_B, "--no-kubernetes")
        started.append(exporter_b)
        prometheus = Prometheus(
            workdir / "prometheus",
            [scrape_job("autoglm-exporter", [exporter_a.address, exporter_b.address])],
            rule_files=[RULES],
            extra_config=alertmanager.prometheus_config(),
        ).start()
        started.append(prometheus)
        prometheus.wait_for(
            "count(namespace_workload_pod:DCGM_FI_DEV_GPU_UTIL:relabel) and count(up == 1) == 2",
            lambda result: bool(result),
            timeout=60,
        )
        yield LiveStack(prometheus, alertmanager, webhook, exporter_a, exporter_b, started_at)
    finally:
        for part in reversed(started):
            part.stop()  # type: ignore[attr-defined]
        kubelet.stop(grace=None)
