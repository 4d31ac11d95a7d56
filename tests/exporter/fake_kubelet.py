"""A real gRPC server speaking the kubelet's pod-resources v1 API, on a unix socket.

The service is generated from the vendored ``exporter/podresources/api.proto``, so the exporter's
watcher talks to it through grpc exactly as it talks to a kubelet; only the answers are scripted.
"""

from __future__ import annotations

import threading
from concurrent import futures
from pathlib import Path

import grpc

from exporter.podresources import api_pb2 as pb
from exporter.podresources import api_pb2_grpc


def pod(namespace: str, name: str, *containers: pb.ContainerResources) -> pb.PodResources:
    return pb.PodResources(name=name, namespace=namespace, containers=list(containers))


def container(name: str, **resources: list[str]) -> pb.ContainerResources:
    """``container("c", **{"nvidia.com/gpu": ["GPU-..."]})``."""
    return pb.ContainerResources(
        name=name,
        devices=[
            pb.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in resources.items()
        ],
        cpu_ids=[2, 3],
    )


class FakeKubelet(api_pb2_grpc.PodResourcesListerServicer):
    """The kubelet's side of the API: answers ``List`` with whatever the test set."""

    def __init__(self) -> None:
        self.reply = pb.ListPodResourcesResponse()
        self.calls = 0
        self.hold: threading.Event | None = None  # set by a test to make List slow

    def List(
        self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext
    ) -> pb.ListPodResourcesResponse:
        self.calls += 1
        if self.hold is not None:
            self.hold.wait(10)
        return self.reply


class KubeletServer:
    """A grpc server on ``unix://<folder>/kubelet.sock`` that can be stopped and started again."""

    def __init__(self, socket_path: Path, service: FakeKubelet) -> None:
        self.socket_path = socket_path
        self.service = service
        self._server: grpc.Server | None = None

    def start(self) -> None:
        server = grpc.server(
            futures.ThreadPoolExecutor(max_workers=4),
            options=[("grpc.max_send_message_length", 256 * 1024 * 1024)],
        )
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(self.service, server)
        server.add_insecure_port(f"unix://{self.socket_path}")
        server.start()
        self._server = server

    def stop(self) -> None:
        if self._server is not None:
            if self.service.hold is not None:
                self.service.hold.set()
            self._server.stop(grace=None).wait()
            self._server = None
