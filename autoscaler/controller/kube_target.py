"""A Kubernetes workload as a :class:`~autoscaler.scale_target.ScaleTarget`, through its scale
subresource."""

from __future__ import annotations

from autoscaler.controller.kube import KubeAPI
from autoscaler.core.replica_calculator import PodSample
from autoscaler.scale_target import TargetScale


class KubernetesScaleTarget:
    """A Deployment/StatefulSet/ReplicaSet through its scale subresource."""

    def __init__(self, api: KubeAPI, namespace: str, kind: str, name: str) -> None:
        self.api, self.namespace, self.kind, self.name = api, namespace, kind, name
        self.description = f"{kind}/{name}"
        self._selector = ""
        self._read_version = ""

    def get_scale(self) -> TargetScale:
        scale = self.api.get_scale(self.namespace, self.kind, self.name)
        self._selector = scale.selector
        self._read_version = scale.resource_version
        return TargetScale(scale.replicas, scale.status_replicas)

    def set_replicas(self, replicas: int) -> None:
        """Write with the version :meth:`get_scale` read; a change since then raises a conflict
        (:class:`~autoscaler.controller.kube.KubeError` with ``conflict``)."""
        self.api.set_scale(self.namespace, self.kind, self.name, replicas, self._read_version)

    def pods(self) -> list[PodSample]:
        """Pods of the selector read from the scale subresource by the last :meth:`get_scale`."""
        if not self._selector:
            self.get_scale()
        return self.api.list_pods(self.namespace, self._selector)
