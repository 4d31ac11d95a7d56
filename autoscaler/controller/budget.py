"""GPUBudget objects in a cluster: who they govern, each tenant's grant, status, Events, metrics.

:class:`BudgetCoordinator` wraps the GPUAutoscaler controller. At the start of a tick it reads
the budgets, the autoscalers and, for every governed one, its scale and the GPUs its pod
template requests; the reconciler then asks :meth:`BudgetCoordinator.admit` before each scale,
and the pure core (:mod:`autoscaler.core.budget`) caps the decision. A tenant reconciled later in
the same tick sees the proposals already made; one not yet reconciled counts with its last one.

Two controller replicas never over-commit a budget, even in the moment both believe they lead:
every grant that grows a tenant is first written to the budget's status (``status.tenants[]
.granted``) with the ``resourceVersion`` read, so a second writer gets 409 and grows nothing
this tick; the headroom a grant may use counts the others' ``max(current, granted)``, so GPUs
granted but not yet scheduled are not handed out twice.

A budget that cannot be parsed, references autoscalers that do not exist or overlaps another
budget is reported in its conditions and an Event; an autoscaler under two budgets gets the
smaller of the two grants, so an overlap never over-commits either.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import CollectorRegistry, Gauge
from pydantic import ValidationError

from autoglm.schema_errors import first_error_line
from autoscaler.budget_spec import BudgetPolicyModel, GPUBudgetSpecModel
from autoscaler.controller.kube import KubeAPI, KubeError
from autoscaler.controller.reconciler import Admission, rfc3339
from autoscaler.core.behavior import ScalingState
from autoscaler.core.budget import REASONS, Share, Tenant, admit, behavior_floor
from autoscaler.spec import GPUAutoscalerSpec, SpecError, parse_quantity, parse_spec, spec_path

log = logging.getLogger(__name__)

PLURAL = "gpubudgets"
KIND = "GPUBudget"
# A GPUAutoscaler can name its budget with this label instead of being selected by it.
BUDGET_LABEL = "autoscaling.autoglm.io/gpu-budget"
CONDITION = "BudgetLimited"
# The grant could not be recorded because another writer changed the budget first.
CONTENDED = "Contended"


class BudgetSpecError(ValueError):
    """A GPUBudget whose spec cannot be used; the message names the field and the fix."""


@dataclass(frozen=True)
class TenantPolicy:
    priority: int = 0
    weight: float = 1.0
    guaranteed: Mapping[str, float] = field(default_factory=dict)
    cap: Mapping[str, float] = field(default_factory=dict)
    preempt: bool = False


@dataclass(frozen=True)
class BudgetSpec:
    name: str
    totals: Mapping[str, float]  # extended resource name -> GPUs
    match_labels: Mapping[str, str] | None  # None: no selector
    tenants: Mapping[str, TenantPolicy]  # autoscaler name -> its policy
    default: TenantPolicy

    def selects(self, obj: Mapping[str, Any]) -> bool:
        meta = obj.get("metadata") or {}
        labels = meta.get("labels") or {}
        if meta.get("name") in self.tenants or labels.get(BUDGET_LABEL) == self.name:
            return True
        if self.match_labels is None:
            return False
        return all(labels.get(k) == v for k, v in self.match_labels.items())

    def policy(self, autoscaler: str) -> TenantPolicy:
        return self.tenants.get(autoscaler, self.default)


def parse_budget(obj: Mapping[str, Any]) -> BudgetSpec:
    """A GPUBudget object's spec, validated by :class:`GPUBudgetSpecModel` (the CRD's schema)."""
    meta, spec = obj.get("metadata") or {}, obj.get("spec")
    if not isinstance(spec, Mapping):
        raise BudgetSpecError("spec: required; give spec.resources and spec.selector or tenants")
    try:
        written = GPUBudgetSpecModel.model_validate(dict(spec))
    except ValidationError as exc:
        raise BudgetSpecError(_one_line(exc)) from None
    match_labels = None
    if written.selector is not None:
        match_labels = dict(written.selector.match_labels or {})
    default = _policy(written.default, TenantPolicy())
    tenants = {t.autoscaler: _policy(t, default) for t in written.tenants or []}
    return BudgetSpec(str(meta.get("name", "")), written.resources, match_labels, tenants, default)


def _one_line(exc: ValidationError) -> str:
    error = exc.errors(include_url=False)[0]
    if error["type"] == "too_short" and tuple(error["loc"]) == ("resources",):
        return "spec.resources: give at least one resource, e.g. nvidia.com/gpu: 8"
    return first_error_line(exc, GPUBudgetSpecModel, spec_path)


def _policy(written: BudgetPolicyModel | None, base: TenantPolicy) -> TenantPolicy:
    """``written``'s fields, and ``base``'s where it leaves one unset."""
    if written is None:
        return base
    return TenantPolicy(
        priority=base.priority if written.priority is None else written.priority,
        weight=base.weight if written.weight is None else written.weight,
        guaranteed=written.guaranteed or base.guaranteed,
        cap=written.cap or base.cap,
        preempt=base.preempt if written.preempt is None else written.preempt,
    )


class BudgetMetrics:
    """``autoglm_budget_*``: per budget and resource, and per tenant."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        pool, tenant = ("budget", "resource"), ("budget", "autoscaler", "resource")
        self.total = Gauge(
            "autoglm_budget_total_gpus", "GPUs in the budget.", pool, registry=registry
        )
        self.used = Gauge(
            "autoglm_budget_used_gpus",
            "GPUs the governed autoscalers' replicas request now.",
            pool,
            registry=registry,
        )
        self.demand = Gauge(
            "autoglm_budget_demand_gpus",
            "GPUs the autoscaler's own proposal would request.",
            tenant,
            registry=registry,
        )
        self.allowed = Gauge(
            "autoglm_budget_allowed_gpus",
            "GPUs the budget lets the autoscaler have now.",
            tenant,
            registry=registry,
        )
        self.limited = Gauge(
            "autoglm_budget_limited",
            "1 while the budget holds the autoscaler below its proposal, by reason.",
            (*tenant, "reason"),
            registry=registry,
        )
        self.priority = Gauge(
            "autoglm_budget_priority",
            "The autoscaler's priority in the budget (best-effort is the lowest).",
            ("budget", "autoscaler"),
            registry=registry,
        )
        self.problems = Gauge(
            "autoglm_budget_condition",
            "1 while a budget condition that needs an operator holds (invalid, missing, overlap).",
            ("budget", "condition"),
            registry=registry,
        )


@dataclass
class _Member:
    name: str
    uid: str
    spec: GPUAutoscalerSpec
    current: int
    gpus: Mapping[str, float]  # per replica, by resource


@dataclass
class _Budget:
    spec: BudgetSpec
    obj: dict[str, Any]
    members: list[str]
    granted: dict[str, int]


class BudgetCoordinator:
    """Runs the wrapped controller's tick between reading the budgets and writing their status."""

    def __init__(
        self,
        kube: KubeAPI,
        controller: Any,  # KubernetesController: reconcile_all(), states by uid, may_act
        namespace: str,
        metrics: BudgetMetrics,
        clock: Callable[[], float],
    ) -> None:
        self.kube, self.controller, self.namespace = kube, controller, namespace
        self.m, self.clock = metrics, clock
        self.budgets: dict[str, _Budget] = {}
        self.members: dict[str, _Member] = {}
        self.proposals: dict[str, int] = {}  # last proposal per autoscaler, across ticks
        self.shares: dict[tuple[str, str, str], Share] = {}  # (budget, autoscaler, resource)
        self.conditions: dict[str, list[dict[str, str]]] = {}  # budget -> its conditions
        self.invalid: list[dict[str, Any]] = []  # budgets whose spec cannot be used
        self.read_failed = False  # this tick runs on the last budgets read; status is left alone

    def reconcile_all(self) -> dict:
        self.begin_tick()
        try:
            return self.controller.reconcile_all()
        finally:
            self.end_tick()

    # --- reading --------------------------------------------------------------------------------

    def begin_tick(self) -> None:
        """Read the budgets and their tenants. When they cannot be read, the last ones read
        stay in force (a read error must not lift every cap)."""
        try:
            objects = self.kube.list_objects(self.namespace, PLURAL)
            autoscalers = (
                self.kube.list_objects(self.namespace, self.kube.plural) if objects else []
            )
        except KubeError as exc:
            if exc.not_found:  # the GPUBudget CRD is not installed: there are no budgets
                self.budgets, self.members = {}, {}
                return
            log.error(
                "cannot read GPUBudgets; the last ones read stay in force",
                extra={"error": str(exc)},
            )
            self.read_failed = True
            return
        self.read_failed = False
        self.budgets, self.members, self.shares = {}, {}, {}
        self.conditions, self.invalid = {}, []
        names = {(o.get("metadata") or {}).get("name") for o in autoscalers}
        claimed: dict[str, list[str]] = {}
        for obj in objects:
            name = obj["metadata"]["name"]
            try:
                spec = parse_budget(obj)
            except BudgetSpecError as exc:
                self._problem(obj, "Valid", False, "InvalidSpec", str(exc))
                self.invalid.append(obj)
                continue
            self._problem(obj, "Valid", True, "SpecAccepted", "the spec is valid")
            missing = sorted(set(spec.tenants) - names)
            self._problem(
                obj,
                "ReferencesResolved",
                not missing,
                "MissingAutoscalers" if missing else "AllFound",
                f"no GPUAutoscaler named {', '.join(missing)} in {self.namespace}"
                if missing
                else "every named autoscaler exists",
            )
            members = [o["metadata"]["name"] for o in autoscalers if spec.selects(o)]
            for member in members:
                claimed.setdefault(member, []).append(name)
            granted = {
                t["autoscaler"]: int(t.get("granted") or 0)
                for t in (obj.get("status") or {}).get("tenants") or []
                if isinstance(t, Mapping)
                and isinstance(t.get("autoscaler"), str)
                and t["autoscaler"]
            }
            self.budgets[name] = _Budget(spec, obj, members, granted)
        for budget in self.budgets.values():
            others = sorted(
                {b for m in budget.members for b in claimed[m] if b != budget.spec.name}
            )
            self._problem(
                budget.obj,
                "Overlapping",
                not others,  # the condition is a problem while True; stored inverted below
                "Overlaps" if others else "Exclusive",
                f"governs autoscalers that {', '.join(others)} also governs; each gets the "
                "smaller grant"
                if others
                else "no other budget governs these autoscalers",
                problem_when_true=True,
            )
        for obj in autoscalers:
            name = obj["metadata"]["name"]
            if name in claimed:
                member = self._member(obj)
                if member is not None:
                    self.members[name] = member
                    self.proposals.setdefault(name, member.current)

    def _member(self, obj: dict[str, Any]) -> _Member | None:
        """The autoscaler's spec, current replicas and GPUs per replica; None when unreadable
        (it is then not admitted to grow, see :meth:`admit`)."""
        meta = obj["metadata"]
        try:
            spec = parse_spec(obj)
            ref = spec.scale_target_ref
            current = self.kube.get_scale(self.namespace, ref.kind, ref.name).replicas
            gpus = self._template_gpus(ref.kind, ref.name)
        except (SpecError, KubeError) as exc:
            log.warning(
                "cannot size a governed autoscaler",
                extra={"autoscaler": meta["name"], "error": str(exc)},
            )
            return None
        return _Member(meta["name"], meta.get("uid", meta["name"]), spec, current, gpus)

    def _template_gpus(self, kind: str, name: str) -> dict[str, float]:
        """Requests summed over the pod template's containers (init containers run before and
        do not add to what a running replica holds)."""
        workload = self.kube.read_workload(self.namespace, kind, name)
        out: dict[str, float] = {}
        template = workload.spec.template if workload.spec else None
        for container in (template.spec.containers if template and template.spec else None) or []:
            requests = (container.resources.requests if container.resources else None) or {}
            for resource, quantity in requests.items():
                try:
                    out[resource] = out.get(resource, 0.0) + parse_quantity(quantity, resource)
                except SpecError:
                    continue  # not a number: not something a budget counts
        return out

    # --- admitting ------------------------------------------------------------------------------

    def admit(
        self,
        name: str,
        state: ScalingState,
        current: int,
        desired: int,
        now: float,
    ) -> Admission | None:
        """The replicas ``name`` may have now; None when no budget governs it."""
        governing = [b for b in self.budgets.values() if name in b.members]
        if not governing:
            return None
        member = self.members.get(name)
        if member is None:
            return Admission(
                min(current, desired),
                CONTENDED,
                "the budget could not read this autoscaler's target; it is not allowed to grow",
            )
        member.current = current
        self.proposals[name] = desired
        allowed, reason, notes = desired, None, []
        for budget in governing:
            unreadable = [m for m in budget.members if m not in self.members]
            if unreadable and allowed > current:
                # GPUs an unreadable tenant holds are unknown: nobody may grow onto them.
                allowed, reason = current, CONTENDED
                notes.append(f"{budget.spec.name}: cannot read {', '.join(unreadable)}")
            for resource, total in budget.spec.totals.items():
                if member.gpus.get(resource, 0.0) <= 0:
                    continue
                tenants = self._tenants(budget, resource, name, state, now)
                held_by = {
                    m: max(self.members[m].current, budget.granted.get(m, 0))
                    for m in budget.members
                    if m in self.members
                }
                share = admit(total, tenants, name, held_by)
                self.shares[(budget.spec.name, name, resource)] = share
                if share.allowed < allowed:
                    allowed, reason = share.allowed, share.reason
                    notes.append(f"{budget.spec.name}/{resource}: {share.reason}")
        if allowed > current and not self._record_growth(governing, name, allowed):
            allowed, reason = current, CONTENDED
            notes.append("another controller changed the budget first; next tick decides again")
        if reason is None:
            return Admission(allowed, None, "within every budget")
        message = (
            f"the budget allows {allowed} of the {desired} replicas proposed ({'; '.join(notes)})"
        )
        return Admission(allowed, reason, message)

    def _tenants(self, budget: _Budget, resource: str, me: str, my_state, now) -> list[Tenant]:
        states = getattr(self.controller, "states", {})
        out = []
        for name in budget.members:
            member = self.members.get(name)
            if member is None:
                continue
            policy = budget.spec.policy(name)
            state = my_state if name == me else states.get(member.uid, ScalingState())
            cap = policy.cap.get(resource)
            out.append(
                Tenant(
                    name=name,
                    gpus_per_replica=member.gpus.get(resource, 0.0),
                    current=member.current,
                    proposal=self.proposals.get(name, member.current),
                    floor=behavior_floor(member.spec, state, member.current, now),
                    priority=policy.priority,
                    weight=policy.weight,
                    guaranteed_gpus=policy.guaranteed.get(resource, 0.0),
                    cap_gpus=cap,
                    preempt=policy.preempt,
                )
            )
        return out

    def _record_growth(self, governing: list[_Budget], name: str, allowed: int) -> bool:
        """Write the grant to every governing budget before the scale; False on any conflict.
        A dry run scales nothing, so it records nothing."""
        if getattr(getattr(self.controller, "reconciler", None), "dry_run", False):
            return True
        for budget in governing:
            if budget.granted.get(name, 0) >= allowed:
                continue
            granted = {**budget.granted, name: allowed}
            try:
                self._patch_status(budget.obj, {"tenants": _tenant_status(granted, {})})
            except KubeError as exc:
                log.warning(
                    "grant not recorded; not growing",
                    extra={"budget": budget.spec.name, "autoscaler": name, "error": str(exc)},
                )
                return False
            budget.granted = granted
        return True

    # --- reporting ------------------------------------------------------------------------------

    def end_tick(self) -> None:
        if self.read_failed:
            return
        for budget in self.budgets.values():
            name = budget.spec.name
            granted = {}
            for member in budget.members:
                m = self.members.get(member)
                if m is None:
                    continue
                grants = [s for (b, a, _), s in self.shares.items() if b == name and a == member]
                granted[member] = min((s.allowed for s in grants), default=m.current)
                self.m.priority.labels(name, member).set(budget.spec.policy(member).priority)
            resources = []
            for resource, total in budget.spec.totals.items():
                used = sum(
                    self.members[m].current * self.members[m].gpus.get(resource, 0.0)
                    for m in budget.members
                    if m in self.members
                )
                self.m.total.labels(name, resource).set(total)
                self.m.used.labels(name, resource).set(used)
                resources.append({"name": resource, "total": total, "used": used})
            shares = {(a, r): s for (b, a, r), s in self.shares.items() if b == name}
            for (member, resource), share in shares.items():
                self.m.demand.labels(name, member, resource).set(share.demand_gpus)
                self.m.allowed.labels(name, member, resource).set(share.allowed_gpus)
                for reason in (*REASONS, CONTENDED):
                    self.m.limited.labels(name, member, resource, reason).set(
                        1 if share.reason == reason else 0
                    )
            status = {
                "resources": resources,
                "tenants": _tenant_status(granted, shares),
                "conditions": self.conditions.get(name, []),
            }
            if "generation" in budget.obj.get("metadata", {}):
                status["observedGeneration"] = budget.obj["metadata"]["generation"]
            self._write(budget.obj, status)
        for obj in self.invalid:
            self._write(obj, {"conditions": self.conditions[obj["metadata"]["name"]]})

    def _write(self, obj: dict[str, Any], status: dict[str, Any]) -> None:
        try:
            self._patch_status(obj, status)
        except KubeError as exc:
            log.warning(
                "cannot write budget status",
                extra={"budget": obj["metadata"]["name"], "error": str(exc)},
            )

    def _problem(
        self,
        obj: dict[str, Any],
        ctype: str,
        ok: bool,
        reason: str,
        message: str,
        problem_when_true: bool = False,
    ) -> None:
        """Record a condition on the budget (written at the end of the tick); an Event when it
        turns into a problem."""
        status = ("False" if ok else "True") if problem_when_true else ("True" if ok else "False")
        name = obj["metadata"]["name"]
        self.m.problems.labels(name, ctype).set(0 if ok else 1)
        previous = {
            c.get("type"): c
            for c in (obj.get("status") or {}).get("conditions") or []
            if isinstance(c, Mapping)
        }.get(ctype)
        since = rfc3339(self.clock())
        if previous is not None and previous.get("status") == status:
            since = previous.get("lastTransitionTime", since)
        elif not ok and self.controller.may_act():
            self.kube.create_event(self.namespace, obj, "Warning", reason, message)
        self.conditions.setdefault(name, []).append(
            {
                "type": ctype,
                "status": status,
                "reason": reason,
                "message": message[:1024],
                "lastTransitionTime": since,
            }
        )

    def _patch_status(self, obj: dict[str, Any], status: dict[str, Any]) -> dict[str, Any]:
        """Merge-patch the status with the resourceVersion last read (a 409 means another
        writer got there first); the object as it is now."""
        if not self.controller.may_act():
            raise KubeError("patch gpubudget status", None, "NotLeader", "not the leader")
        meta = obj["metadata"]
        body = {"metadata": {"resourceVersion": meta.get("resourceVersion")}, "status": status}
        obj = self.kube.patch_object_status(self.namespace, PLURAL, meta["name"], body)
        meta.update(resourceVersion=obj["metadata"]["resourceVersion"])
        return obj


def _tenant_status(
    granted: Mapping[str, int], shares: Mapping[tuple[str, str], Share]
) -> list[dict[str, Any]]:
    out = []
    for name in sorted(granted):
        entry: dict[str, Any] = {"autoscaler": name, "granted": granted[name]}
        mine = {r: s for (a, r), s in shares.items() if a == name}
        if mine:
            entry["resources"] = [
                {
                    "name": r,
                    "demand": s.demand_gpus,
                    "allowed": s.allowed_gpus,
                    "reason": s.reason or "",
                }
                for r, s in sorted(mine.items())
            ]
        out.append(entry)
    return out
