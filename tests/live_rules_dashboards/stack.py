"""A live monitoring stack, all real processes on 127.0.0.1.

Two exporter processes on simulated GPUs (``gpu-node-a`` with four GPUs, three of them attributed
to pods by a kubelet pod-resources gRPC server on a unix socket; ``gpu-node-b`` with two); the
autoscaler in local mode, scaling real batcher workers (the bundled demo model, a tiny queue) on
fixed ports; the predictor forecasting the batchers' request rate from this Prometheus; a
Prometheus that scrapes all of them every second and evaluates ``alerts/rules.yaml`` every
second; and an Alertmanager that routes every alert to a webhook receiver in this process.

At start node A gets an application Xid (13, not critical) and one failing field, as a real node
has now and then, so the Xid and error panels have data; a steady trickle of requests feeds the
batcher, predictor and autoscaler panels; the tests inject the serious faults and the overload.
A batch job (``autoglm-job run``, capped at 10 requests a second) sends best-effort requests to
the first worker, so the best-effort and job panels have data.
A second autoscaler runs in Kubernetes mode against the fake API server, with two
GPUAutoscalers under one GPUBudget too small for both, so the budget panels have data.
The predictor has a second target whose query returns several series, a real misconfiguration,
so its query-error series exist; the autoscaler's first reconcile, before its worker is up,
counts a real metric_empty error.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
import yaml

from exporter.podresources import api_pb2 as pb
from exporter.sources import SimulatedSource, load_profile
from tests.autoscaler.fake_kube import FakeKubeServer
from tests.exporter.fake_kubelet import FakeKubelet, KubeletServer, container, pod
from tests.exporter.processes import ExporterProcess
from tests.live import LiveProcess, Prometheus, free_port, scrape_job
from tests.live_alertmanager import Alertmanager, WebhookReceiver
from tests.live_rules_dashboards.load import SteadyLoad
from tests.waiting import wait_until

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


# The batcher workers: tiny queue and batches so a burst of a few requests overloads them.
BATCHER_ARGS = (
    "--model", "batcher.models.demo:factory", "--max-batch-size", "4", "--max-queue", "4",
    "--slo-seconds", "0.25", "--torch-threads", "1", "--log-level", "warning",
)  # fmt: skip
MODEL_NAME = "demo"
MAX_WORKERS = 2
AUTOSCALER = ("local", "demo")  # namespace and name, as its series label them
FORECAST_TARGET = "requests"  # the autoscaler's metric and the predictor's target share it
HORIZONS_S = (2, 4)
STEADY_RATE = 20.0  # requests per second while nothing is overloaded
SESSION_S = 360.0  # no load outlives this, whatever happens to the tests
READY_S = 180.0  # a component's start on a busy machine, where importing alone can take a minute
REQUEST_RATE = 'sum(rate(autoglm_batcher_requests_total{job="autoglm-batcher"}[5s]))'
JOB_LINES = 60_000  # best-effort requests, more than the job answers within SESSION_S


def _job_input(path: Path) -> Path:
    line = '{"inputs": [{"name": "input", "shape": [1, 16], "datatype": "FP32", "data": %s}]}\n'
    path.write_text("".join(line % ([round(i % 97 / 97, 3)] * 16) for i in range(JOB_LINES)))
    return path


def _pod_resources(gpu_uuids: list[str]) -> pb.ListPodResourcesResponse:
    pods = [
        pod(namespace, name, container(ctr, **{"nvidia.com/gpu": [gpu_uuids[index]]}))
        for index, (namespace, name, ctr) in PODS_A.items()
    ]
    return pb.ListPodResourcesResponse(pod_resources=pods)


def _worker_ports() -> int:
    """A first port such that it and the next ``MAX_WORKERS - 1`` were free a moment ago."""
    for _ in range(50):
        base = free_port()
        if all(_port_free(base + i) for i in range(1, MAX_WORKERS)):
            return base
    raise RuntimeError("no run of free ports for the batcher workers")


def _port_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


BUDGET_NAMESPACE = "teams"


def _budget_cluster(workdir: Path) -> tuple[FakeKubeServer, Path]:
    """The fake API server with ``chat`` (priority 10) and ``batch`` (priority 0), each asking
    for 6 one-GPU replicas under a 4-GPU budget, and a kubeconfig pointing at it."""
    kube = FakeKubeServer().start()
    for name in ("chat", "batch"):
        kube.fake.add_workload(BUDGET_NAMESPACE, name, 1, {"app": name})
        kube.fake.add_custom(
            "gpuautoscalers",
            {
                "metadata": {"name": name, "namespace": BUDGET_NAMESPACE},
                "spec": {
                    "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": name},
                    "minReplicas": 1,
                    "maxReplicas": 10,
                    "metrics": [
                        {
                            "name": "demand",
                            "type": "External",
                            "query": "vector(6)",
                            "target": {"type": "AverageValue", "averageValue": "1"},
                        }
                    ],
                },
            },
        )
    kube.fake.add_custom(
        "gpubudgets",
        {
            "metadata": {"name": "team", "namespace": BUDGET_NAMESPACE},
            "spec": {
                "resources": {"nvidia.com/gpu": 4},
                "tenants": [
                    {"autoscaler": "chat", "priority": 10},
                    {"autoscaler": "batch", "priority": 0},
                ],
            },
        },
    )
    kubeconfig = workdir / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
                "users": [{"name": "sa", "user": {"token": "t"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "sa"}}],
                "current-context": "fake",
            }
        )
    )
    return kube, kubeconfig


def _autoscaler_spec(path: Path) -> Path:
    """The GPUAutoscaler the local autoscaler follows: one replica per 15 requests/s (so the
    steady load already asks for a second worker), with a forecast 2 s ahead, and the HPA's
    scale-down stabilization shortened to this test's seconds."""
    spec = {
        "apiVersion": "autoscaling.autoglm.io/v1alpha1",
        "kind": "GPUAutoscaler",
        "metadata": {"name": AUTOSCALER[1], "namespace": AUTOSCALER[0]},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "demo"},
            "minReplicas": 1,
            "maxReplicas": MAX_WORKERS,
            "metrics": [
                {
                    "name": FORECAST_TARGET,
                    "type": "External",
                    "query": REQUEST_RATE,
                    "target": {"type": "AverageValue", "averageValue": "15"},
                    "prediction": {"horizonSeconds": 2, "quantile": 0.9, "warmupSeconds": 2},
                }
            ],
            "behavior": {"scaleDown": {"stabilizationWindowSeconds": 5}},
        },
    }
    path.write_text(yaml.safe_dump(spec))
    return path


def _predictor_config(path: Path, prometheus_url: str, listen: str) -> Path:
    config = {
        "listen": listen,
        "prometheus_url": prometheus_url,
        "refit_interval": "20s",
        "update_interval": "1s",
        "log_level": "warning",
        "targets": [
            {
                "name": FORECAST_TARGET,
                "query": REQUEST_RATE,
                "step": "1s",
                "lookback": "2m",
                "horizons": list(HORIZONS_S),
                "seasons": [],
                "models": ["ets_log"],
            },
            {
                # Not aggregated: one series per outcome and worker, which the predictor refuses.
                "name": "requests_by_outcome",
                "query": 'rate(autoglm_batcher_requests_total{outcome=~"ok|rejected"}[5s])',
                "step": "1s",
                "lookback": "2m",
                "horizons": [2],
                "seasons": [],
            },
        ],
    }
    path.write_text(yaml.safe_dump(config))
    return path


@dataclass
class LiveStack:
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: WebhookReceiver
    exporter_a: ExporterProcess
    exporter_b: ExporterProcess
    worker_address: str  # the first batcher worker, which the autoscaler never scales away
    started_at: float  # unix time the exporters started

    @property
    def infer_url(self) -> str:
        return f"http://{self.worker_address}/v2/models/{MODEL_NAME}/infer"

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
    kubelet_service = FakeKubelet()
    kubelet_service.reply = _pod_resources(gpu_uuids)
    kubelet = KubeletServer(workdir / "kubelet.sock", kubelet_service)
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
            NODE_A, GPUS_A, SEED_A, "--kubernetes", "--pod-resources-socket",
            str(kubelet.socket_path), "--pod-resources-interval", "1", *faults,
        )  # fmt: skip
        started.append(exporter_a)
        exporter_b = _exporter(NODE_B, GPUS_B, SEED_B, "--no-kubernetes")
        started.append(exporter_b)
        base_port = _worker_ports()
        workers = [f"127.0.0.1:{base_port + i}" for i in range(MAX_WORKERS)]
        predictor_address = f"127.0.0.1:{free_port()}"
        autoscaler_address = f"127.0.0.1:{free_port()}"
        budget_autoscaler_address = f"127.0.0.1:{free_port()}"
        job_address = f"127.0.0.1:{free_port()}"
        prometheus = Prometheus(
            workdir / "prometheus",
            [
                scrape_job("autoglm-exporter", [exporter_a.address, exporter_b.address]),
                scrape_job("autoglm-batcher", workers),
                scrape_job("autoglm-predictor", [predictor_address]),
                scrape_job("autoglm-autoscaler", [autoscaler_address, budget_autoscaler_address]),
                scrape_job("autoglm-job", [job_address]),
            ],
            rule_files=[RULES],
            extra_config=alertmanager.prometheus_config(),
        ).start()
        started.append(prometheus)
        autoscaler = LiveProcess(
            [
                "autoglm-autoscaler", "run", "--mode", "local",
                "--spec-file", str(_autoscaler_spec(workdir / "autoscaler.yaml")),
                "--worker-command", "autoglm-batcher",
                *(f"--worker-command={arg}" for arg in BATCHER_ARGS),
                "--worker-command=--listen=127.0.0.1:{port}",
                "--worker-base-port", str(base_port), "--pod-label", "instance",
                "--prometheus-url", prometheus.url, "--interval", "2",
                "--listen", autoscaler_address, "--log-level", "warning",
            ],
            ready_url=f"http://{autoscaler_address}/healthz",
            log_path=workdir / "autoscaler.log",
        )  # fmt: skip
        autoscaler.start(ready_timeout=READY_S)
        started.append(autoscaler)
        kube, kubeconfig = _budget_cluster(workdir)
        started.append(kube)
        budget_autoscaler = LiveProcess(
            [
                "autoglm-autoscaler", "run", "--mode", "kubernetes",
                "--namespace", BUDGET_NAMESPACE, "--kubeconfig", str(kubeconfig),
                "--prometheus-url", prometheus.url, "--interval", "2",
                "--listen", budget_autoscaler_address, "--log-level", "warning",
            ],
            ready_url=f"http://{budget_autoscaler_address}/healthz",
            log_path=workdir / "budget-autoscaler.log",
        )  # fmt: skip
        budget_autoscaler.start(ready_timeout=READY_S)
        started.append(budget_autoscaler)
        predictor = LiveProcess(
            [
                "autoglm-predictor", "serve", "--config",
                str(_predictor_config(workdir / "predictor.yaml", prometheus.url,
                                      predictor_address)),
            ],
            ready_url=f"http://{predictor_address}/metrics",
            log_path=workdir / "predictor.log",
        )  # fmt: skip
        predictor.start(ready_timeout=READY_S)
        started.append(predictor)
        stack = LiveStack(
            prometheus, alertmanager, webhook, exporter_a, exporter_b, workers[0], started_at
        )
        _wait_ready(f"http://{workers[0]}/v2/health/ready", timeout=READY_S)
        job = LiveProcess(
            [
                "autoglm-job", "run", "--input", str(_job_input(workdir / "job.jsonl")),
                "--output", str(workdir / "job-answers.jsonl"),
                "--endpoint", f"http://{workers[0]}", "--model", MODEL_NAME,
                "--job-name", "live", "--max-concurrency", "2", "--max-rate", "10",
                "--metrics-listen", job_address, "--log-level", "warning",
            ],
            ready_url=f"http://{job_address}/metrics",
            log_path=workdir / "job.log",
        )  # fmt: skip
        job.start(ready_timeout=READY_S)
        started.append(job)
        steady = SteadyLoad(stack.infer_url, STEADY_RATE, SESSION_S)
        started.append(steady)
        prometheus.wait_for(
            "count(namespace_workload_pod:DCGM_FI_DEV_GPU_UTIL:relabel) and count(up == 1) >= 5",
            lambda result: bool(result),
            timeout=READY_S,
        )
        yield stack
    finally:
        for part in reversed(started):
            part.stop()  # type: ignore[attr-defined]
        kubelet.stop()


def _wait_ready(url: str, timeout: float) -> None:
    """Until ``url`` answers 200: the worker the autoscaler started has loaded its model."""

    def answers() -> bool:
        try:
            return requests.get(url, timeout=1).status_code == 200
        except requests.RequestException:
            return False

    wait_until(answers, timeout=timeout, what=f"{url} to be ready", interval=0.2)
