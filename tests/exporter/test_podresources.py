"""Pod attribution against a real gRPC server that implements the kubelet's pod-resources API.

The server (``tests/exporter/fake_kubelet.py``, the ``kubelet`` fixture) is the service from the
vendored ``api.proto``, served on a unix socket in a temp folder as the kubelet serves it; the
watcher talks to it through grpc exactly as in production.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from exporter.podresources import PodRef, PodResourcesWatcher, attribution_from_reply
from exporter.podresources import api_pb2 as pb
from tests.exporter.fake_kubelet import KubeletServer, container, pod
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)

GPU0 = "GPU-0b2c6d5e-1111-2222-3333-444455556666"
GPU1 = "GPU-9f8e7d6c-aaaa-bbbb-cccc-ddddeeeeffff"
MIG_A = "MIG-4d2a1b3c-0000-1111-2222-333344445555"
MIG_B = "MIG-7e6f5a4b-6666-7777-8888-999900001111"


class FakeClock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def watcher_for(server: KubeletServer, **kwargs: object) -> PodResourcesWatcher:
    return PodResourcesWatcher(str(server.socket_path), **kwargs)  # type: ignore[arg-type]


def test_normal_list_attributes_whole_gpus(kubelet: KubeletServer) -> None:
    kubelet.service.reply = pb.ListPodResourcesResponse(
        pod_resources=[
            pod("llm", "vllm-0", container("server", **{"nvidia.com/gpu": [GPU0, GPU1]})),
            pod("web", "nginx-1", container("nginx", **{"example.com/nic": ["eth1"]})),
            pod("kube-system", "dns", container("coredns")),
        ]
    )
    registry = CollectorRegistry()
    clock = FakeClock()
    watcher = watcher_for(kubelet, registry=registry, clock=clock)
    assert watcher.refresh()
    expected = [PodRef("llm", "vllm-0", "server")]
    assert watcher.attribution() == {GPU0: expected, GPU1: expected}
    assert watcher.healthy
    assert watcher.last_success == clock.now
    assert registry.get_sample_value("autoglm_exporter_pod_resources_pods_attributed") == 1
    assert registry.get_sample_value("autoglm_exporter_pod_resources_devices_attributed") == 2


def test_mig_devices_under_mixed_and_single_strategy(kubelet: KubeletServer) -> None:
    kubelet.service.reply = pb.ListPodResourcesResponse(
        pod_resources=[
            pod("a", "small", container("c", **{"nvidia.com/mig-1g.10gb": [MIG_A]})),
            pod(
                "b", "medium", container("c", **{"nvidia.com/mig-3g.40gb.shared": [f"{MIG_B}::2"]})
            ),
            pod("c", "single-strategy", container("c", **{"nvidia.com/gpu": [MIG_B]})),
        ]
    )
    watcher = watcher_for(kubelet)
    assert watcher.refresh()
    assert watcher.attribution() == {
        MIG_A: [PodRef("a", "small", "c")],
        MIG_B: [PodRef("b", "medium", "c"), PodRef("c", "single-strategy", "c")],
    }


def test_time_sliced_gpu_lists_every_pod_and_container(kubelet: KubeletServer) -> None:
    kubelet.service.reply = pb.ListPodResourcesResponse(
        pod_resources=[
            pod(
                "team-a",
                "chat-0",
                container("model", **{"nvidia.com/gpu": [f"{GPU0}::0", f"{GPU0}::3"]}),
                container("sidecar", **{"nvidia.com/gpu": [f"{GPU0}::1"]}),
            ),
            pod(
                "team-b", "embed-0", container("model", **{"nvidia.com/gpu.shared": [f"{GPU0}::2"]})
            ),
            pod("team-b", "embed-1", container("model", **{"nvidia.com/gpu": [f"{GPU1}::0"]})),
        ]
    )
    registry = CollectorRegistry()
    watcher = watcher_for(kubelet, registry=registry)
    assert watcher.refresh()
    assert watcher.attribution() == {
        GPU0: [
            PodRef("team-a", "chat-0", "model"),
            PodRef("team-a", "chat-0", "sidecar"),
            PodRef("team-b", "embed-0", "model"),
        ],
        GPU1: [PodRef("team-b", "embed-1", "model")],
    }
    assert registry.get_sample_value("autoglm_exporter_pod_resources_pods_attributed") == 3


def big_reply(filler_pods: int) -> pb.ListPodResourcesResponse:
    """A busy node: many pods holding other devices, and two holding GPUs at the end."""
    nics = [
        f"0000:{i:02x}:00.{j}-virtual-function-with-a-long-name" for i in range(4) for j in range(5)
    ]
    pods = [
        pod(f"ns-{i % 50}", f"worker-{i:06d}", container("app", **{"example.com/sriov": nics}))
        for i in range(filler_pods)
    ]
    pods.append(pod("llm", "big-0", container("server", **{"nvidia.com/gpu": [GPU0]})))
    pods.append(pod("llm", "big-1", container("server", **{"nvidia.com/mig-2g.20gb": [MIG_A]})))
    return pb.ListPodResourcesResponse(pod_resources=pods)


def test_reply_larger_than_grpc_default_limit_is_parsed(kubelet: KubeletServer) -> None:
    kubelet.service.reply = big_reply(6000)
    assert kubelet.service.reply.ByteSize() > 5 * 1024 * 1024
    watcher = watcher_for(kubelet)
    assert watcher.refresh()
    assert watcher.attribution() == {
        GPU0: [PodRef("llm", "big-0", "server")],
        MIG_A: [PodRef("llm", "big-1", "server")],
    }

    registry = CollectorRegistry()
    limited = watcher_for(kubelet, max_message_bytes=4 * 1024 * 1024, registry=registry)
    assert not limited.refresh()
    assert limited.last_error == "resource_exhausted"
    assert (
        registry.get_sample_value(
            "autoglm_exporter_pod_resources_refresh_errors_total", {"reason": "resource_exhausted"}
        )
        == 1
    )


def test_kubelet_down_keeps_last_good_attribution(
    kubelet: KubeletServer, caplog: pytest.LogCaptureFixture
) -> None:
    kubelet.service.reply = pb.ListPodResourcesResponse(
        pod_resources=[pod("llm", "vllm-0", container("server", **{"nvidia.com/gpu": [GPU0]}))]
    )
    registry = CollectorRegistry()
    clock = FakeClock()
    watcher = watcher_for(kubelet, registry=registry, clock=clock, timeout=2.0)
    assert watcher.refresh()
    good = watcher.attribution()
    first_success = clock.now

    kubelet.stop()
    clock.now += 10
    with caplog.at_level("WARNING", logger="exporter.podresources.watcher"):
        assert not watcher.refresh()
        assert not watcher.refresh()
    assert watcher.attribution() == good
    assert not watcher.healthy
    assert watcher.last_success == first_success
    errors = sum(
        s.value
        for m in registry.collect()
        if m.name == "autoglm_exporter_pod_resources_refresh_errors"
        for s in m.samples
        if s.name.endswith("_total")
    )
    assert errors == 2
    warnings = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1, "a persistent failure is logged once, not on every refresh"
    assert warnings[0].reason in ("unavailable", "socket_missing")

    kubelet.start()
    clock.now += 10
    assert watcher.refresh()
    assert watcher.healthy
    assert watcher.last_success == clock.now


def test_missing_socket(socket_dir: Path) -> None:
    registry = CollectorRegistry()
    watcher = PodResourcesWatcher(str(socket_dir / "absent.sock"), registry=registry)
    assert not watcher.refresh()
    assert watcher.attribution() == {}
    assert not watcher.healthy
    assert watcher.last_success is None
    assert watcher.last_error == "socket_missing"
    assert (
        registry.get_sample_value(
            "autoglm_exporter_pod_resources_refresh_errors_total", {"reason": "socket_missing"}
        )
        == 1
    )


def test_slow_kubelet_hits_the_deadline(kubelet: KubeletServer) -> None:
    kubelet.service.hold = threading.Event()
    watcher = watcher_for(kubelet, timeout=0.2)
    try:
        assert not watcher.refresh()
        assert watcher.last_error == "deadline_exceeded"
    finally:
        kubelet.service.hold.set()


def test_background_thread_follows_changes_and_stops(kubelet: KubeletServer) -> None:
    kubelet.service.reply = pb.ListPodResourcesResponse(
        pod_resources=[pod("a", "p0", container("c", **{"nvidia.com/gpu": [GPU0]}))]
    )
    watcher = watcher_for(kubelet, interval=0.05)
    watcher.start()
    try:
        wait_until(lambda: GPU0 in watcher.attribution(), timeout=10, what="GPU 0 attributed")
        kubelet.service.reply = pb.ListPodResourcesResponse(
            pod_resources=[pod("a", "p1", container("c", **{"nvidia.com/gpu": [GPU1]}))]
        )
        wait_until(lambda: GPU1 in watcher.attribution(), timeout=10, what="GPU 1 attributed")
        assert GPU0 not in watcher.attribution()
    finally:
        watcher.stop()
    assert not any(t.name == "podresources-watcher" for t in threading.enumerate())


def test_pure_attribution_ignores_other_resources_and_empty_ids() -> None:
    reply = pb.ListPodResourcesResponse(
        pod_resources=[
            pod("x", "p", container("c", **{"nvidia.com/gpu": [""], "amd.com/gpu": ["0"]})),
            pod("x", "q", container("c", **{"nvidia.com/gpux": ["GPU-z"]})),
        ]
    )
    assert attribution_from_reply(reply) == {}
