"""Several tenants, each with its own trace, SLO and priority, under one GPU budget.

Every tick each tenant's autoscaler decides as in :func:`autoscaler.simulator.engine.simulate`
(same spec, same core); the proposals then go through the budget allocation
(:func:`autoscaler.core.budget.allocate`) with each tenant's scale-down floor, and each fleet is
scaled to what the budget allows. A best-effort tenant (batch work with a backlog that never
runs dry) is the lowest priority and takes whatever GPUs are left, so the budget's use shows how
much of the pool the backfill recovers. Each online tenant is scored with the single-fleet
report (:func:`autoscaler.simulator.report.summarise`), plus how often the budget cut it.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from autoscaler.core import MetricInput, ScalingState, decide, record_scale
from autoscaler.core.budget import Tenant, allocate, behavior_floor
from autoscaler.simulator.engine import (
    SimulationConfig,
    SimulationResult,
    Timeline,
    policy_spec,
    sized_replicas,
    warm_start_replicas,
)
from autoscaler.simulator.fleet import Fleet
from autoscaler.simulator.report import summarise, window_scores
from autoscaler.simulator.trace import Trace, from_arrivals

BACKFILL = "backfill"


@dataclass(frozen=True)
class TenantSetup:
    """One online tenant: its load, its fleet model and SLO, and its place in the budget."""

    name: str
    trace: Trace
    config: SimulationConfig
    priority: int = 0
    weight: float = 1.0
    guaranteed_gpus: float = 0.0
    cap_gpus: float | None = None
    gpus_per_replica: float = 1.0


@dataclass
class TenantOutcome:
    result: SimulationResult
    limited_ticks: Counter = field(default_factory=Counter)  # reason -> ticks cut below proposal
    ticks: int = 0


@dataclass
class BudgetRun:
    total_gpus: float
    tenants: dict[str, TenantOutcome]
    used_gpu_seconds: float  # online and best-effort, while the traces run (not the drain)
    backfill_gpu_seconds: float
    duration: float  # the traces' span: what use and GPU-hours are measured over
    over_budget_ticks: int  # ticks on which floors kept the pool over (a budget never shrinks here)


def parse_tenant_flag(text: str) -> tuple[str, int, float, float]:
    """``NAME:PRIORITY:SLO_SECONDS:SHIFT_SECONDS`` as its four values."""
    parts = text.split(":")
    if len(parts) != 4 or not parts[0]:
        raise ValueError("give NAME:PRIORITY:SLO_SECONDS:SHIFT_SECONDS, e.g. chat:10:8:0")
    try:
        priority, slo, shift = int(parts[1]), float(parts[2]), float(parts[3])
    except ValueError as exc:
        raise ValueError("PRIORITY is an integer, SLO_SECONDS and SHIFT_SECONDS numbers") from exc
    if not (slo > 0 and math.isfinite(slo) and math.isfinite(shift)):
        raise ValueError("SLO_SECONDS must be > 0 and SHIFT_SECONDS finite")
    return parts[0], priority, slo, shift


def rotated_trace(trace: Trace, shift: float, keep: float | None = None) -> Trace:
    """The trace started ``shift`` seconds later and wrapped around: the same load over the same
    span with its bursts elsewhere, so tenants built from one trace do not peak together.
    ``keep``: only the first ``keep`` seconds."""
    arrivals = np.mod(trace.arrivals + shift, trace.duration + 1e-9)
    if keep is not None:
        arrivals = arrivals[arrivals < keep]
    return from_arrivals(arrivals, source=f"{trace.source} shifted {shift:g} s")


def tenant_peak_replicas(setup: TenantSetup) -> int:
    """The most replicas the tenant's own autoscaler asks for over its trace with no budget:
    its peak need, against which a budget is sized."""
    run = simulate_tenants([setup], total_gpus=math.inf, backfill_gpus_per_replica=None)
    return max(run.tenants[setup.name].result.timeline.replicas, default=0)


def simulate_tenants(
    setups: list[TenantSetup],
    total_gpus: float,
    backfill_gpus_per_replica: float | None = 1.0,
) -> BudgetRun:
    """Replay every tenant's trace together; ``backfill_gpus_per_replica`` None: no best-effort
    tenant."""
    if len({s.name for s in setups}) != len(setups) or BACKFILL in {s.name for s in setups}:
        raise ValueError(f"tenant names must be unique and not {BACKFILL!r}")
    ticks = {s.config.tick for s in setups}
    if len(ticks) != 1:
        raise ValueError("every tenant must share one tick: the budget allocates per tick")
    tick = ticks.pop()
    state = {s.name: _TenantState(s) for s in setups}
    lowest = min((s.priority for s in setups), default=0) - 1
    backfill_replicas = 0
    used = backfill_used = 0.0
    over_ticks = 0
    horizon = max(s.trace.duration for s in setups)
    end = max(s.trace.duration + s.config.drain_limit for s in setups)
    t = 0.0
    while t < end:
        t += tick
        tenants = [st.propose(t) for st in state.values()]
        if backfill_gpus_per_replica is not None and math.isfinite(total_gpus):
            tenants.append(
                Tenant(
                    BACKFILL,
                    backfill_gpus_per_replica,
                    backfill_replicas,
                    math.floor(total_gpus / backfill_gpus_per_replica),
                    priority=lowest,
                )
            )
        shares = allocate(total_gpus, tenants) if math.isfinite(total_gpus) else None
        in_use = 0.0
        for st in state.values():
            allowed = st.proposal if shares is None else shares[st.setup.name].allowed
            st.apply(t, allowed, None if shares is None else shares[st.setup.name].reason)
            in_use += st.fleet.replica_count * st.setup.gpus_per_replica
        if shares is not None and BACKFILL in shares and backfill_gpus_per_replica is not None:
            backfill_replicas = shares[BACKFILL].allowed
            in_use += backfill_replicas * backfill_gpus_per_replica
            if t <= horizon:
                backfill_used += backfill_replicas * backfill_gpus_per_replica * tick
        if t <= horizon:
            used += in_use * tick
        over_ticks += int(in_use > total_gpus + 1e-9)
        if t >= end - max(s.config.drain_limit for s in setups) and all(
            st.drained for st in state.values()
        ):
            break
    return BudgetRun(
        total_gpus,
        {name: st.finish(t) for name, st in state.items()},
        used,
        backfill_used,
        horizon,
        over_ticks,
    )


class _TenantState:
    """One tenant's fleet, autoscaler state and timeline during a replay."""

    def __init__(self, setup: TenantSetup) -> None:
        self.setup, cfg = setup, setup.config
        self.spec = policy_spec(cfg, "hpa")
        self.fleet = Fleet(
            setup.trace.arrivals,
            setup.trace.work,
            cfg.service,
            cfg.cold_start,
            warm_start_replicas(setup.trace, cfg),
        )
        self.scaling = ScalingState()
        self.timeline = Timeline()
        self.outcome = TenantOutcome(result=None)  # type: ignore[arg-type]  # set in finish
        self.proposal = self.fleet.replica_count
        self.ups = self.downs = 0

    @property
    def drained(self) -> bool:
        return not np.isnan(self.fleet.finished).any() and self.fleet.queue_length == 0

    def propose(self, t: float) -> Tenant:
        cfg, fleet = self.setup.config, self.fleet
        fleet.advance(t)
        arrivals = self.setup.trace.arrivals
        hi = np.searchsorted(arrivals, t, side="right")
        lo = np.searchsorted(arrivals, t - cfg.metric_window, side="right")
        rate = (hi - lo) / cfg.metric_window if cfg.metric_window > 0 else 0.0
        self.timeline.t.append(t)
        self.timeline.rate.append(rate)
        self.timeline.forecast.append(math.nan)
        self.timeline.queue.append(fleet.queue_length)
        backlog = fleet.queue_length if cfg.slo_backlog else 0
        value = float(sized_replicas(cfg, rate, backlog)) if cfg.sizing == "slo" else rate
        inputs = [MetricInput(self.spec.metrics[0], value=value)]
        if len(self.spec.metrics) > 1:
            inputs.append(MetricInput(self.spec.metrics[1], value=float(fleet.queue_length)))
        current = fleet.replica_count
        self.proposal = decide(self.spec, current, inputs, self.scaling, t).desired_replicas
        s = self.setup
        return Tenant(
            s.name,
            s.gpus_per_replica,
            current,
            self.proposal,
            floor=behavior_floor(self.spec, self.scaling, current, t),
            priority=s.priority,
            weight=s.weight,
            guaranteed_gpus=s.guaranteed_gpus,
            cap_gpus=s.cap_gpus,
        )

    def apply(self, t: float, allowed: int, reason: str | None) -> None:
        current = self.fleet.replica_count
        self.outcome.ticks += 1
        if reason is not None:
            self.outcome.limited_ticks[reason] += 1
        if allowed != current:
            self.fleet.scale_to(allowed)
            record_scale(self.scaling, t, current, allowed)
            self.ups += allowed > current
            self.downs += allowed < current
        self.timeline.replicas.append(self.fleet.replica_count)
        self.timeline.ready.append(self.fleet.ready_count)

    def finish(self, t: float) -> TenantOutcome:
        fleet, trace = self.fleet, self.setup.trace
        fleet.advance(t)
        self.outcome.result = SimulationResult(
            policy="hpa",
            config=self.setup.config,
            trace=trace,
            latency=fleet.finished - trace.arrivals,
            queueing=fleet.started - trace.arrivals,
            billed_seconds=fleet.billed_seconds(t),
            busy_seconds=fleet.busy_seconds,
            end_time=t,
            timeline=self.timeline,
            scale_ups=self.ups,
            scale_downs=self.downs,
            drivers=Counter(),
            forecast_models=Counter(),
            unfinished=int(np.isnan(fleet.finished).sum()),
        )
        return self.outcome


def summarise_run(run: BudgetRun, setups: list[TenantSetup]) -> dict[str, Any]:
    """Per tenant: SLO minutes, breach minutes, GPU-hours, share of ticks limited (by reason);
    for the budget: its size and the share of it used (best-effort included)."""
    rows = []
    for setup in setups:
        outcome = run.tenants[setup.name]
        summary = summarise(outcome.result)
        # GPU-hours ordered while the traces run: a starved tenant's queue drains for longer,
        # and the others' idle minimum over that drain is not the budget's doing.
        ordered = window_scores(outcome.result, 0.0, run.duration + setup.config.tick)
        limited = sum(outcome.limited_ticks.values())
        rows.append(
            {
                "tenant": setup.name,
                "priority": setup.priority,
                "slo_seconds": setup.config.slo_seconds,
                "slo_minutes": summary["slo_minutes"],
                "breach_minutes": summary["breach_minutes"],
                "minutes": summary["minutes"],
                "gpu_hours": ordered["gpu_hours"] * setup.gpus_per_replica,
                "limited_share": limited / max(outcome.ticks, 1),
                "limited_by": dict(outcome.limited_ticks),
                "unfinished": summary["unfinished"],
            }
        )
    capacity = run.total_gpus * run.duration
    return {
        "total_gpus": run.total_gpus,
        "used_share": run.used_gpu_seconds / capacity if capacity > 0 else 0.0,
        "backfill_gpu_hours": run.backfill_gpu_seconds / 3600.0,
        "over_budget_ticks": run.over_budget_ticks,
        "simulated_seconds": run.duration,
        "tenants": rows,
    }
