"""What gets scaled, as the reconciler sees it: a replica count to read and set, and pods behind it.

The reconciler, the Kubernetes workload (:mod:`autoscaler.controller.kube_target`) and the local
worker processes (:mod:`autoscaler.local`) all import this module and none of them imports another,
so the controller cannot tell a Deployment from a handful of batcher workers on a laptop.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from autoscaler.core.replica_calculator import PodSample


@dataclass(frozen=True)
class TargetScale:
    """The target's size: what was asked (spec) and what exists (status)."""

    replicas: int
    status_replicas: int


class ScaleTarget(Protocol):
    """Something with a replica count that can be read and set, and pods behind it.

    ``set_replicas`` applies to the scale as last read by ``get_scale``: a target that others can
    change too (a Deployment) refuses the write with a conflict when it changed in between.
    """

    description: str

    def get_scale(self) -> TargetScale: ...

    def set_replicas(self, replicas: int) -> None: ...

    def pods(self) -> list[PodSample]: ...
