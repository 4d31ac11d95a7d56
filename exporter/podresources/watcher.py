"""Keep pod attribution fresh from the kubelet pod-resources API, in the background.

Scrapes never wait on the kubelet: a thread calls ``List`` every ``interval`` seconds with a
deadline and swaps in the new attribution; scrapes read the last one. When a refresh fails (the
kubelet restarting, the socket not mounted, a slow reply) the last good attribution stays, the
failure is counted by reason and logged, and :attr:`PodResourcesWatcher.healthy` turns false
until a refresh succeeds again. A node with many pods can answer with more than gRPC's default
4 MiB receive limit, so the limit is raised (64 MiB by default).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable

import grpc
from prometheus_client import CollectorRegistry, Counter, Gauge

from exporter.podresources import api_pb2, api_pb2_grpc
from exporter.podresources.attribution import PodRef, attribution_from_reply

log = logging.getLogger(__name__)

DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024 * 1024


class PodResourcesWatcher:
    """Refreshes ``{GPU or MIG UUID: [PodRef, ...]}`` from the kubelet in a background thread."""

    def __init__(
        self,
        socket_path: str,  # the default lives in ExporterConfig (--pod-resources-socket)
        interval: float = 10.0,
        timeout: float = 5.0,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if interval <= 0 or timeout <= 0:
            raise ValueError("interval and timeout must be > 0 seconds")
        self.socket_path = socket_path
        self.interval = interval
        self.timeout = timeout
        self.max_message_bytes = max_message_bytes
        self._clock = clock
        # Replaced whole by each successful refresh, never changed in place: readers need no lock.
        self._attribution: dict[str, list[PodRef]] = {}
        self._healthy = False
        self._last_success: float | None = None
        self._last_error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

        # Up and last-success are rendered by the exporter from ``healthy``/``last_success``
        # (autoglm_exporter_pod_resources_up, ..._last_success_timestamp_seconds).
        registry = registry if registry is not None else CollectorRegistry()
        self._errors = Counter(
            "autoglm_exporter_pod_resources_refresh_errors",
            "Failed refreshes of pod attribution from the kubelet pod-resources API, by reason.",
            ["reason"],
            registry=registry,
        )
        self._pods = Gauge(
            "autoglm_exporter_pod_resources_pods_attributed",
            "Pods holding at least one GPU or MIG device in the last good attribution.",
            registry=registry,
        )
        self._devices = Gauge(
            "autoglm_exporter_pod_resources_devices_attributed",
            "GPU or MIG devices held by at least one pod in the last good attribution.",
            registry=registry,
        )

    @property
    def healthy(self) -> bool:
        """Whether the latest refresh succeeded (false before the first one)."""
        return self._healthy

    @property
    def last_success(self) -> float | None:
        """Clock time of the latest successful refresh, or ``None``."""
        return self._last_success

    @property
    def last_error(self) -> str | None:
        """Why the latest refresh failed (``None`` after a success), for health endpoints."""
        return self._last_error

    def attribution(self) -> dict[str, list[PodRef]]:
        """The last good attribution; treat it as read-only (it is shared, not copied)."""
        return self._attribution

    def start(self) -> None:
        """Refresh now and then every ``interval`` seconds in a daemon thread."""
        if self._thread is not None:
            raise RuntimeError("PodResourcesWatcher already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="podresources-watcher", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop the thread and wait for it (at most one call's deadline)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def refresh(self) -> bool:
        """Call ``List`` once and swap in the result; on failure keep the last good one."""
        if not os.path.exists(self.socket_path):
            self._failed(
                "socket_missing",
                f"{self.socket_path} does not exist; mount the kubelet's pod-resources folder "
                "(hostPath /var/lib/kubelet/pod-resources) or fix --pod-resources-socket",
            )
            return False
        options = [("grpc.max_receive_message_length", self.max_message_bytes)]
        try:
            # A fresh channel each time: the kubelet recreates its socket when it restarts, and a
            # long-lived channel would wait out its reconnect back-off instead of retrying now.
            with grpc.insecure_channel(f"unix://{self.socket_path}", options=options) as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                reply = stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code() if isinstance(exc, grpc.Call) else None
            reason = code.name.lower() if code is not None else "unknown"
            details = exc.details() if isinstance(exc, grpc.Call) else str(exc)
            self._failed(reason, details or reason)
            return False
        attribution = attribution_from_reply(reply)
        now = self._clock()
        self._attribution = attribution
        self._last_success = now
        self._pods.set(len({(r.namespace, r.pod) for refs in attribution.values() for r in refs}))
        self._devices.set(len(attribution))
        if not self._healthy and self._last_error is not None:
            log.info("pod-resources refresh recovered", extra={"socket": self.socket_path})
        self._healthy = True
        self._last_error = None
        return True

    def _failed(self, reason: str, details: str) -> None:
        self._errors.labels(reason).inc()
        if self._healthy or self._last_error != reason:
            log.warning(
                "pod-resources refresh failed; keeping the last good pod attribution",
                extra={
                    "socket": self.socket_path,
                    "reason": reason,
                    "details": details,
                    "last_success": self._last_success,
                },
            )
        self._healthy = False
        self._last_error = reason

    def _run(self) -> None:
        while True:
            try:
                self.refresh()
            except Exception:  # a parse bug must not end attribution for the process' lifetime
                self._failed("internal_error", "unexpected error while refreshing")
                log.exception("pod-resources refresh crashed")
            if self._stop.wait(self.interval):
                return
