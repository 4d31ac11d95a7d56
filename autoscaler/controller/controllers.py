"""The two drivers of the reconciler: GPUAutoscaler objects in a cluster, a spec file locally.

Each keeps the core's :class:`ScalingState` per autoscaler in memory (keyed by the object's uid,
so a deleted and re-created autoscaler starts afresh, with its first recommendation equal to the
current count, as the HPA does after a controller restart).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from autoscaler.controller.kube import KubeAPI, KubeError
from autoscaler.controller.kube_target import KubernetesScaleTarget
from autoscaler.controller.reconciler import Reconciler, ReconcileResult, rfc3339
from autoscaler.core import ScalingState
from autoscaler.local import LocalProcessGroup
from autoscaler.spec import GPUAutoscalerSpec, SpecError, parse_spec

log = logging.getLogger(__name__)


class KubernetesController:
    """Reconciles one GPUAutoscaler (``name``) or every one in ``namespace``."""

    def __init__(
        self,
        kube: KubeAPI,
        reconciler: Reconciler,
        namespace: str,
        name: str | None = None,
        may_act: Callable[[], bool] = lambda: True,
    ) -> None:
        self.kube, self.reconciler = kube, reconciler
        self.namespace, self.name = namespace, name
        self.may_act = may_act
        self.states: dict[str, ScalingState] = {}

    def reconcile_all(self) -> dict[str, ReconcileResult]:
        try:
            if self.name:
                objects = [self.kube.get_autoscaler(self.namespace, self.name)]
            else:
                objects = self.kube.list_autoscalers(self.namespace)
        except KubeError as exc:
            self.reconciler.m.errors.labels(
                self.namespace, self.name or "", "list_autoscalers"
            ).inc()
            log.error("cannot read GPUAutoscalers", extra={"error": str(exc)})
            return {}
        seen, results = set(), {}
        for obj in objects:
            meta = obj.get("metadata") or {}
            seen.add(meta.get("uid", meta.get("name")))
            results[meta.get("name", "")] = self.reconcile_object(obj)
        for uid in set(self.states) - seen:
            del self.states[uid]
        return results

    def reconcile_object(self, obj: dict[str, Any]) -> ReconcileResult:
        meta = obj.get("metadata") or {}
        name = meta.get("name", "")
        previous = obj.get("status") or {}

        def notify(event_type: str, reason: str, message: str) -> None:
            if self.may_act():
                self.kube.create_event(self.namespace, obj, event_type, reason, message)

        try:
            spec = parse_spec(obj)
        except SpecError as exc:
            self.reconciler.m.errors.labels(self.namespace, name, "invalid_spec").inc()
            log.error("invalid GPUAutoscaler spec", extra={"autoscaler": name, "error": str(exc)})
            status = {
                "conditions": [
                    {
                        "type": "ScalingActive",
                        "status": "False",
                        "reason": "InvalidSpec",
                        "message": str(exc),
                        "lastTransitionTime": rfc3339(self.reconciler.clock()),
                    }
                ]
            }
            if _condition_reason(previous, "ScalingActive") != "InvalidSpec":
                notify("Warning", "InvalidSpec", str(exc))
            self._write_status(name, meta, status)
            return ReconcileResult(status, errors=[str(exc)])

        state = self.states.setdefault(meta.get("uid", name), ScalingState())
        ref = spec.scale_target_ref
        target = KubernetesScaleTarget(self.kube, self.namespace, ref.kind, ref.name)
        result = self.reconciler.reconcile(
            self.namespace, name, spec, target, state, previous, notify
        )
        self._write_status(name, meta, result.status)
        return result

    def _write_status(self, name: str, meta: dict[str, Any], status: dict[str, Any]) -> None:
        if not status or not self.may_act():
            return
        if "generation" in meta:
            status = {**status, "observedGeneration": meta["generation"]}
        try:
            self.kube.patch_autoscaler_status(self.namespace, name, status)
        except KubeError as exc:
            self.reconciler.m.errors.labels(self.namespace, name, "update_status").inc()
            log.warning("cannot write status", extra={"autoscaler": name, "error": str(exc)})


class LocalController:
    """Drives a local process group from a spec; status and events go to the log."""

    def __init__(
        self, spec: GPUAutoscalerSpec, target: LocalProcessGroup, reconciler: Reconciler
    ) -> None:
        self.spec, self.target, self.reconciler = spec, target, reconciler
        self.state = ScalingState()
        self.status: dict[str, Any] = {}
        self.name = spec.scale_target_ref.name

    def reconcile_all(self) -> dict[str, ReconcileResult]:
        restarted = self.target.supervise()
        if restarted:
            self.reconciler.m.errors.labels("local", self.name, "worker_exited").inc(restarted)

        def notify(event_type: str, reason: str, message: str) -> None:
            log.log(
                logging.WARNING if event_type == "Warning" else logging.INFO,
                "event",
                extra={"autoscaler": self.name, "reason": reason, "event_message": message},
            )

        result = self.reconciler.reconcile(
            "local", self.name, self.spec, self.target, self.state, self.status, notify
        )
        self.status = {**self.status, **result.status}
        return {self.name: result}


def _condition_reason(status: dict[str, Any], ctype: str) -> str | None:
    for cond in status.get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == ctype:
            return cond.get("reason")
    return None
