"""Pod attribution from the kubelet pod-resources v1 gRPC API (``List`` over a unix socket).

``api.proto`` is the vendored interface definition; ``api_pb2*.py`` are generated from it by
``scripts/gen-podresources``.
"""

from exporter.podresources.attribution import PodRef, attribution_from_reply, is_gpu_resource
from exporter.podresources.watcher import DEFAULT_MAX_MESSAGE_BYTES, PodResourcesWatcher

__all__ = [
    "DEFAULT_MAX_MESSAGE_BYTES",
    "PodRef",
    "PodResourcesWatcher",
    "attribution_from_reply",
    "is_gpu_resource",
]
