"""Kubernetes API I/O for the controller, through the official ``kubernetes`` client.

Everything the reconciler needs from the cluster goes through :class:`KubeAPI`: the
GPUAutoscaler custom resources and their status, the scale subresource of the target workload
(read and written with the object's ``resourceVersion``, as the HPA does, so a concurrent writer
causes a 409 that we answer by re-reading, not a lost update), the pods behind the target's
selector, and Events. Client errors are turned into :class:`KubeError` with the HTTP status and
the API's reason so that callers can count and report them by kind.

Events repeat: a metric that stays unreachable is reported at every reconcile. As client-go's
event recorder does, an Event identical to one this process recorded (same object, type, reason
and message) is not created again: the existing one's ``count`` and ``lastTimestamp`` are patched,
so ``kubectl describe`` shows "x12 over 3m" instead of twelve objects in etcd. An Event the API
server has already expired (404 on the patch) is created anew.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, cast

import kubernetes.client
import urllib3.exceptions
from kubernetes.client.exceptions import ApiException

from autoscaler.core.replica_calculator import PodPhase, PodSample
from autoscaler.spec import SpecError, parse_quantity

log = logging.getLogger(__name__)

GROUP = "autoscaling.autoglm.io"
VERSION = "v1alpha1"
PLURAL = "gpuautoscalers"
KIND = "GPUAutoscaler"
COMPONENT = "autoglm-autoscaler"

# scaleTargetRef.kind -> (read scale, replace scale) method names on AppsV1Api
_SCALE_METHODS = {
    "Deployment": ("read_namespaced_deployment_scale", "replace_namespaced_deployment_scale"),
    "StatefulSet": ("read_namespaced_stateful_set_scale", "replace_namespaced_stateful_set_scale"),
    "ReplicaSet": ("read_namespaced_replica_set_scale", "replace_namespaced_replica_set_scale"),
}
# scaleTargetRef.kind -> the AppsV1Api method that reads the workload
_READ_WORKLOAD = {
    "Deployment": "read_namespaced_deployment",
    "StatefulSet": "read_namespaced_stateful_set",
    "ReplicaSet": "read_namespaced_replica_set",
}


class KubeError(Exception):
    """A Kubernetes API call failed; ``status`` is the HTTP code (None when unreachable)."""

    def __init__(self, action: str, status: int | None, reason: str, message: str) -> None:
        super().__init__(f"{action}: {reason}: {message}")
        self.action, self.status, self.reason, self.message = action, status, reason, message

    @property
    def conflict(self) -> bool:
        return self.status == 409

    @property
    def not_found(self) -> bool:
        return self.status == 404


@dataclass(frozen=True)
class ScaleInfo:
    """The scale subresource of a workload."""

    replicas: int
    status_replicas: int
    selector: str
    resource_version: str


def _wrap(action: str, exc: Exception) -> KubeError:
    if isinstance(exc, ApiException):
        reason, message = exc.reason or "", str(exc.body or "")
        try:
            status_obj = json.loads(exc.body or "{}")
            reason = status_obj.get("reason") or reason
            message = status_obj.get("message") or message
        except ValueError:
            pass
        return KubeError(action, exc.status, reason or "Error", message)
    return KubeError(action, None, "Unreachable", str(exc))


_CLIENT_ERRORS = (ApiException, urllib3.exceptions.HTTPError, OSError)

# Events remembered for de-duplication (client-go's event cache holds 4096).
EVENT_CACHE_SIZE = 4096


@dataclass
class _RecordedEvent:
    name: str
    count: int


class KubeAPI:
    """Typed access to the few API endpoints the controller uses."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        *,
        group: str = GROUP,
        version: str = VERSION,
        plural: str = PLURAL,
        identity: str = COMPONENT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.apps = kubernetes.client.AppsV1Api(api_client)
        self.core = kubernetes.client.CoreV1Api(api_client)
        self.custom = kubernetes.client.CustomObjectsApi(api_client)
        self.group, self.version, self.plural = group, version, plural
        self.identity = identity
        self.clock = clock
        # (namespace, object uid or name, type, reason, message) -> the Event recorded for it
        self._events: OrderedDict[tuple[str, ...], _RecordedEvent] = OrderedDict()

    # --- GPUAutoscaler objects -----------------------------------------------------------------

    def list_autoscalers(self, namespace: str) -> list[dict[str, Any]]:
        return self.list_objects(namespace, self.plural)

    def get_autoscaler(self, namespace: str, name: str) -> dict[str, Any]:
        try:
            return cast(
                dict[str, Any],
                self.custom.get_namespaced_custom_object(
                    self.group, self.version, namespace, self.plural, name
                ),
            )
        except _CLIENT_ERRORS as exc:
            raise _wrap(f"get {self.plural}/{name}", exc) from exc

    def patch_autoscaler_status(
        self, namespace: str, name: str, status: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch ``.status`` through the status subresource."""
        return self.patch_object_status(namespace, self.plural, name, {"status": dict(status)})

    # --- other custom objects of the group (GPUBudgets) ----------------------------------------

    def list_objects(self, namespace: str, plural: str) -> list[dict[str, Any]]:
        """The objects of ``plural`` in this API group and version."""
        try:
            body = self.custom.list_namespaced_custom_object(
                self.group, self.version, namespace, plural
            )
        except _CLIENT_ERRORS as exc:
            raise _wrap(f"list {plural} in {namespace}", exc) from exc
        return list(cast(dict[str, Any], body).get("items") or [])

    def patch_object_status(
        self, namespace: str, plural: str, name: str, body: Mapping[str, Any]
    ) -> dict[str, Any]:
        """Merge-patch ``body`` through the status subresource; a ``metadata.resourceVersion``
        in it makes a concurrent writer's change a 409 (``KubeError.conflict``)."""
        try:
            return cast(
                dict[str, Any],
                self.custom.patch_namespaced_custom_object_status(
                    self.group, self.version, namespace, plural, name, dict(body)
                ),
            )
        except _CLIENT_ERRORS as exc:
            raise _wrap(f"patch {plural}/{name}/status", exc) from exc

    # --- scale subresource ---------------------------------------------------------------------

    def _methods(self, kind: str) -> tuple[Callable[..., Any], Callable[..., Any]]:
        if kind not in _SCALE_METHODS:
            raise KubeError(
                f"scale {kind}",
                None,
                "UnsupportedKind",
                f"scaleTargetRef.kind {kind!r} is not supported; use one of "
                + ", ".join(_SCALE_METHODS),
            )
        read, replace = _SCALE_METHODS[kind]
        return getattr(self.apps, read), getattr(self.apps, replace)

    def get_scale(self, namespace: str, kind: str, name: str) -> ScaleInfo:
        read, _ = self._methods(kind)
        try:
            scale = read(name, namespace)
        except _CLIENT_ERRORS as exc:
            raise _wrap(f"get {kind}/{name} scale", exc) from exc
        return _scale_info(scale)

    def set_scale(
        self, namespace: str, kind: str, name: str, replicas: int, resource_version: str
    ) -> ScaleInfo:
        """Write ``spec.replicas`` only if the scale is still at ``resource_version``.

        The version must be the one the decision was made from: re-reading here would turn a
        concurrent change (a ``kubectl scale``, a second controller) into a silent overwrite.
        A 409 is raised as a :class:`KubeError` with ``conflict`` set and never retried here,
        because the number being written was computed from data that is now stale.
        """
        _, replace = self._methods(kind)
        body = kubernetes.client.V1Scale(
            api_version="autoscaling/v1",
            kind="Scale",
            metadata=kubernetes.client.V1ObjectMeta(
                name=name, namespace=namespace, resource_version=resource_version
            ),
            spec=kubernetes.client.V1ScaleSpec(replicas=replicas),
        )
        try:
            scale = replace(name, namespace, body)
        except _CLIENT_ERRORS as exc:
            raise _wrap(f"update {kind}/{name} scale", exc) from exc
        return _scale_info(scale)

    def read_workload(self, namespace: str, kind: str, name: str) -> Any:
        """The Deployment, StatefulSet or ReplicaSet itself (its pod template says what one
        replica requests)."""
        if kind not in _READ_WORKLOAD:
            raise KubeError(f"read {kind}", None, "UnsupportedKind", f"{kind} is not supported")
        try:
            return getattr(self.apps, _READ_WORKLOAD[kind])(name, namespace)
        except _CLIENT_ERRORS as exc:
            raise _wrap(f"get {kind}/{name}", exc) from exc

    # --- pods ----------------------------------------------------------------------------------

    def list_pods(self, namespace: str, selector: str) -> list[PodSample]:
        """Pods matched by ``selector`` as samples without values, for the metrics source to fill.

        Pods being deleted and failed pods are passed on with their state, because the HPA rules
        (in the core) decide what to do with them.
        """
        if not selector:
            raise KubeError(
                "list pods",
                None,
                "NoSelector",
                "the target's scale subresource has no status.selector; "
                "is the workload's selector set?",
            )
        try:
            pods = self.core.list_namespaced_pod(namespace, label_selector=selector)
        except _CLIENT_ERRORS as exc:
            raise _wrap(f"list pods {selector}", exc) from exc
        return [_pod_sample(pod) for pod in pods.items or []]

    # --- events --------------------------------------------------------------------------------

    def create_event(
        self,
        namespace: str,
        involved: Mapping[str, Any],
        event_type: str,
        reason: str,
        message: str,
    ) -> None:
        """Record a core/v1 Event on ``involved`` (a GPUAutoscaler object), or count a repeat of
        one already recorded; failures are logged, never raised (an Event is a courtesy)."""
        now = datetime.fromtimestamp(self.clock(), tz=UTC)
        meta = involved.get("metadata") or {}
        message = message[:1024]
        key = (namespace, meta.get("uid") or meta.get("name", ""), event_type, reason, message)
        try:
            if not self._count_repeat(namespace, key, now):
                self._create_event(namespace, key, involved, event_type, reason, message, now)
        except _CLIENT_ERRORS as exc:
            log.warning(
                "could not record event",
                extra={"reason": reason, "error": str(_wrap("record event", exc))},
            )

    def _count_repeat(self, namespace: str, key: tuple[str, ...], now: datetime) -> bool:
        """Patch the count of the Event recorded under ``key``; False when there is none (never
        recorded, or expired by the API server)."""
        recorded = self._events.get(key)
        if recorded is None:
            return False
        body = {"count": recorded.count + 1, "lastTimestamp": now.isoformat()}
        try:
            self.core.patch_namespaced_event(recorded.name, namespace, body)
        except ApiException as exc:
            if exc.status != 404:
                raise
            del self._events[key]
            return False
        recorded.count += 1
        self._events.move_to_end(key)
        return True

    def _create_event(
        self,
        namespace: str,
        key: tuple[str, ...],
        involved: Mapping[str, Any],
        event_type: str,
        reason: str,
        message: str,
        now: datetime,
    ) -> None:
        meta = involved.get("metadata") or {}
        event = kubernetes.client.CoreV1Event(
            metadata=kubernetes.client.V1ObjectMeta(
                generate_name=f"{meta.get('name', 'gpuautoscaler')}.", namespace=namespace
            ),
            involved_object=kubernetes.client.V1ObjectReference(
                api_version=involved.get("apiVersion", f"{self.group}/{self.version}"),
                kind=involved.get("kind", KIND),
                name=meta.get("name"),
                namespace=namespace,
                uid=meta.get("uid"),
                resource_version=meta.get("resourceVersion"),
            ),
            type=event_type,
            reason=reason,
            message=message,
            count=1,
            first_timestamp=now,
            last_timestamp=now,
            source=kubernetes.client.V1EventSource(component=COMPONENT),
            reporting_component=COMPONENT,
            reporting_instance=self.identity,
        )
        created = self.core.create_namespaced_event(namespace, event)
        # The API server names every Event it creates (ours ask for a generated name).
        self._events[key] = _RecordedEvent(cast(str, created.metadata.name), 1)
        if len(self._events) > EVENT_CACHE_SIZE:
            self._events.popitem(last=False)


def _scale_info(scale: kubernetes.client.V1Scale) -> ScaleInfo:
    return ScaleInfo(
        replicas=int(scale.spec.replicas or 0) if scale.spec else 0,
        status_replicas=int(scale.status.replicas or 0) if scale.status else 0,
        selector=(scale.status.selector or "") if scale.status else "",
        resource_version=(scale.metadata.resource_version if scale.metadata else None) or "",
    )


def _pod_sample(pod: kubernetes.client.V1Pod) -> PodSample:
    status = pod.status or kubernetes.client.V1PodStatus()
    ready, ready_changed = None, None
    for cond in status.conditions or []:
        if cond.type == "Ready":
            ready = cond.status == "True"
            ready_changed = _ts(cond.last_transition_time)
    phase = cast(PodPhase, status.phase) if status.phase in _PHASES else "Unknown"
    metadata = pod.metadata or kubernetes.client.V1ObjectMeta()
    containers = {
        c.name: _requests(c.resources.requests if c.resources else None)
        for c in (pod.spec.containers if pod.spec else None) or []
    }
    return PodSample(
        name=metadata.name or "",
        value=None,
        ready=ready,
        phase=phase,
        deleting=metadata.deletion_timestamp is not None,
        started_at=_ts(status.start_time),
        ready_changed_at=ready_changed,
        containers=containers,
    )


def _requests(raw: Mapping[str, str] | None) -> dict[str, float]:
    """A container's requests as numbers; one that is not a quantity is left out (and a
    Utilization target over it then reports the request missing)."""
    out: dict[str, float] = {}
    for resource, quantity in (raw or {}).items():
        try:
            out[resource] = parse_quantity(quantity, resource)
        except SpecError:
            log.warning("unparseable resource request", extra={"resource": resource})
    return out


_PHASES = ("Pending", "Running", "Succeeded", "Failed", "Unknown")


def _ts(value: datetime | str | None) -> float | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value.replace("Z", "+00:00"))
    return value.timestamp()
