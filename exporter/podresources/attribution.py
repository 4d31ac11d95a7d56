"""Which pods use which GPU, from a kubelet pod-resources ``List`` reply (no I/O here).

The NVIDIA device plugin hands GPUs to containers as resources whose device ids the kubelet
reports back: ``nvidia.com/gpu`` with ``GPU-<uuid>`` ids, ``nvidia.com/mig-<profile>`` with
``MIG-<uuid>`` ids (mixed MIG strategy; with the single strategy MIG ids come under
``nvidia.com/gpu``), and with time-slicing or MPS sharing each GPU is advertised several times as
``GPU-<uuid>::<n>`` -- under the same names, or with ``.shared`` appended when the plugin renames
shared resources. Every container holding any replica of a device is attributed to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
SHARED_SUFFIX = ".shared"
REPLICA_SEPARATOR = "::"


@dataclass(frozen=True, order=True)
class PodRef:
    """A container that holds a GPU (or a share of one)."""

    namespace: str
    pod: str
    container: str


class _Devices(Protocol):
    resource_name: str
    device_ids: Iterable[str]


class _Container(Protocol):
    name: str
    devices: Iterable[_Devices]


class _Pod(Protocol):
    name: str
    namespace: str
    containers: Iterable[_Container]


class _ListReply(Protocol):
    pod_resources: Iterable[_Pod]


def is_gpu_resource(resource_name: str) -> bool:
    """Whether a kubelet resource name is an NVIDIA GPU or MIG device, shared or not."""
    name = resource_name.removesuffix(SHARED_SUFFIX)
    return name == GPU_RESOURCE or name.startswith(MIG_RESOURCE_PREFIX)


def device_uuid(device_id: str) -> str:
    """The device a kubelet device id stands for: ``GPU-abc::3`` (a time-slice) -> ``GPU-abc``."""
    return device_id.partition(REPLICA_SEPARATOR)[0]


def attribution_from_reply(reply: _ListReply) -> dict[str, list[PodRef]]:
    """Map each GPU/MIG UUID to the containers holding it, sorted and without duplicates."""
    holders: dict[str, set[PodRef]] = {}
    for pod in reply.pod_resources:
        for container in pod.containers:
            ref = PodRef(namespace=pod.namespace, pod=pod.name, container=container.name)
            for devices in container.devices:
                if not is_gpu_resource(devices.resource_name):
                    continue
                for device_id in devices.device_ids:
                    uuid = device_uuid(device_id)
                    if uuid:
                        holders.setdefault(uuid, set()).add(ref)
    return {uuid: sorted(refs) for uuid, refs in sorted(holders.items())}
