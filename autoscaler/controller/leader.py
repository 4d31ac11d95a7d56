"""Leader election on a coordination.k8s.io/v1 Lease: two controller replicas never both act.

The rules are client-go's: a candidate may take the lease when nobody holds it, when it holds it
already, or when the record (holder, renewTime) has not changed for ``leaseDurationSeconds`` as
measured on the candidate's own clock since it first saw that record (never comparing clocks
across machines). Every write carries the lease's ``resourceVersion``, so two candidates racing
for an expired lease cannot both win: one gets a 409. The holder considers itself leader only
until ``renew_deadline`` after its last successful renewal, which is shorter than the lease
duration, so a holder cut off from the API stops acting before anyone else may take over.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime

import kubernetes.client
from kubernetes.client.exceptions import ApiException

log = logging.getLogger(__name__)


class LeaderElector:
    """Acquire and renew one Lease; call :meth:`tick` every ``retry`` seconds."""

    def __init__(
        self,
        api_client: kubernetes.client.ApiClient,
        namespace: str,
        name: str,
        identity: str,
        *,
        lease_duration: float = 15.0,
        renew_deadline: float = 10.0,
        clock: Callable[[], float] = time.time,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        if not 0 < renew_deadline < lease_duration:
            raise ValueError(
                "renew_deadline must be > 0 and shorter than lease_duration, "
                "or a cut-off leader could still act after another took over"
            )
        if not identity:
            raise ValueError("identity must be non-empty (e.g. the pod name)")
        self.api = kubernetes.client.CoordinationV1Api(api_client)
        self.namespace, self.name, self.identity = namespace, name, identity
        self.lease_duration, self.renew_deadline = lease_duration, renew_deadline
        self.clock = clock
        self.on_change = on_change
        self._renewed_at: float | None = None
        self._observed: tuple[str | None, str | None] | None = None
        self._observed_at = 0.0
        self._was_leader = False

    def is_leader(self) -> bool:
        """True while our last successful renewal is younger than the renew deadline."""
        return (
            self._renewed_at is not None and self.clock() - self._renewed_at < self.renew_deadline
        )

    def tick(self) -> bool:
        """Try to acquire or renew the lease once; returns whether we lead now."""
        try:
            self._try_acquire_or_renew()
        except (ApiException, OSError) as exc:
            status = getattr(exc, "status", None)
            log.warning(
                "lease acquire/renew failed",
                extra={"lease": self.name, "status": status, "error": str(exc)[:200]},
            )
        leading = self.is_leader()
        if leading != self._was_leader:
            self._was_leader = leading
            log.info(
                "became leader" if leading else "stopped leading",
                extra={"lease": self.name, "identity": self.identity},
            )
            if self.on_change:
                self.on_change(leading)
        return leading

    def release(self) -> None:
        """Give the lease up on shutdown so a peer takes over at once instead of after expiry."""
        if not self.is_leader():
            return
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
            if lease.spec and lease.spec.holder_identity == self.identity:
                lease.spec.holder_identity = None
                lease.spec.lease_duration_seconds = 1
                lease.spec.renew_time = self._now()
                self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except (ApiException, OSError) as exc:
            log.warning("could not release the lease", extra={"error": str(exc)[:200]})
        self._renewed_at = None
        if self._was_leader:
            self._was_leader = False
            if self.on_change:
                self.on_change(False)

    def _now(self) -> datetime:
        return datetime.fromtimestamp(self.clock(), tz=UTC)

    def _try_acquire_or_renew(self) -> None:
        now = self.clock()
        try:
            lease = self.api.read_namespaced_lease(self.name, self.namespace)
        except ApiException as exc:
            if exc.status != 404:
                raise
            self._create(now)
            return
        spec = lease.spec or kubernetes.client.V1LeaseSpec()
        record = (spec.holder_identity, spec.renew_time.isoformat() if spec.renew_time else None)
        if record != self._observed:
            self._observed, self._observed_at = record, now
        duration = spec.lease_duration_seconds or self.lease_duration
        held_by_other = bool(spec.holder_identity) and spec.holder_identity != self.identity
        if held_by_other and now < self._observed_at + duration:
            self._renewed_at = None
            return
        if held_by_other or not spec.holder_identity:
            spec.lease_transitions = (spec.lease_transitions or 0) + (1 if held_by_other else 0)
            spec.acquire_time = self._now()
        spec.holder_identity = self.identity
        spec.lease_duration_seconds = int(self.lease_duration)
        spec.renew_time = self._now()
        lease.spec = spec
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:
                log.info("lost a race for the lease", extra={"lease": self.name})
                return
            raise
        self._renewed_at = now

    def _create(self, now: float) -> None:
        lease = kubernetes.client.V1Lease(
            api_version="coordination.k8s.io/v1",
            kind="Lease",
            metadata=kubernetes.client.V1ObjectMeta(name=self.name, namespace=self.namespace),
            spec=kubernetes.client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=int(self.lease_duration),
                acquire_time=self._now(),
                renew_time=self._now(),
                lease_transitions=0,
            ),
        )
        try:
            self.api.create_namespaced_lease(self.namespace, lease)
        except ApiException as exc:
            if exc.status == 409:
                return  # another candidate created it first; we read it next tick
            raise
        self._renewed_at = now
