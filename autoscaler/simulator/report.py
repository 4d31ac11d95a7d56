"""What a simulation run achieved: SLO attainment, cost, utilization, scaling activity; and plots.

* ``slo_requests``: share of requests whose latency (or queueing delay, per ``slo_on``) is within
  the SLO; a request never served counts as a breach.
* ``slo_minutes``: share of minutes (by arrival, minutes with requests) whose p99 is within it.
  Both count only requests arriving at or after ``score_from`` (a replay's warm-up); the cost
  figures always cover the whole replay.
* ``gpu_hours``: replica-hours paid for, from the order of a replica to its removal.
* ``mean_utilization``: the load served over the capacity paid for, in the autoscaler's own units
  (work served divided by what the paid replicas could serve at full batches); the policies aim
  it at ``target_utilization``. ``busy_fraction`` is the share of paid time a replica was busy.
* With best-effort backfill: ``online_busy`` (the same as ``busy_fraction``), ``backfill_busy``
  (the share of paid time spent on best-effort slices), ``total_busy`` (their sum) and
  ``backfill_replica_hours`` (best-effort work done). ``starting_share`` is the share of paid
  time replicas spent starting (cold starts), which no work can use: ``1 - starting_share``
  bounds ``total_busy``.
* With SLO sizing: ``sized_latency_seconds``, the latency the sizing held (the SLO, less one
  best-effort slice when ``reserve_quantum`` reserves it), as the controller's
  ``status.slo.sizedLatencySeconds``; ``slo_objective``, the share of minutes the per-request
  quantile was derived from (None: ``slo_quantile`` itself was sized for).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autoscaler.simulator.engine import SimulationResult, sized_latency


def summarise(result: SimulationResult) -> dict[str, Any]:
    cfg = result.config
    scored = result.trace.arrivals >= cfg.score_from
    measured = (result.latency if cfg.slo_on == "latency" else result.queueing)[scored]
    served = np.isfinite(measured)
    within = served & (np.nan_to_num(measured, nan=np.inf) <= cfg.slo_seconds)
    minute = np.floor(result.trace.arrivals[scored] / 60.0).astype(np.int64)
    p99 = _p99_per_minute(minute, np.where(served, measured, np.inf))
    billed = max(result.billed_seconds, 1e-9)
    work_seconds = float(result.trace.work.sum()) / cfg.service.capacity_rps
    finite = measured[served]
    return {
        "policy": result.policy,
        "requests": len(result.trace),
        "scored_requests": int(scored.sum()),
        "score_from_seconds": cfg.score_from,
        "unfinished": result.unfinished,
        "slo_seconds": cfg.slo_seconds,
        "slo_on": cfg.slo_on,
        "slo_requests": float(within.mean()) if len(within) else 1.0,
        "slo_minutes": float((p99 <= cfg.slo_seconds).mean()) if len(p99) else 1.0,
        "breach_minutes": int((p99 > cfg.slo_seconds).sum()),
        "minutes": len(p99),
        "p50_seconds": float(np.percentile(finite, 50)) if finite.size else None,
        "p99_seconds": float(np.percentile(finite, 99)) if finite.size else None,
        "gpu_hours": float(billed) / 3600.0,
        "mean_utilization": float(work_seconds / billed),
        "target_utilization": cfg.target_utilization,
        "busy_fraction": float(result.busy_seconds / billed),
        "online_busy": float(result.busy_seconds / billed),
        "backfill_busy": float(result.backfill_seconds / billed),
        "total_busy": float((result.busy_seconds + result.backfill_seconds) / billed),
        "backfill_replica_hours": result.backfill_seconds / 3600.0,
        "starting_share": float(result.starting_seconds / billed),
        "backfill_quantum_seconds": result.backfill_quantum,
        "sizing": cfg.sizing,
        "sized_latency_seconds": sized_latency(cfg) if cfg.sizing == "slo" else None,
        "slo_objective": cfg.slo_objective if cfg.sizing == "slo" else None,
        "mean_replicas": float(billed / max(result.end_time, 1e-9)),
        "max_replicas": int(max(result.timeline.replicas, default=0)),
        "scale_ups": result.scale_ups,
        "scale_downs": result.scale_downs,
        "drivers": dict(result.drivers),
        "forecaster": (
            result.forecast_models.most_common(1)[0][0] if result.forecast_models else None
        ),
        "forecast_models": dict(result.forecast_models),
        "simulated_seconds": result.end_time,
    }


def window_scores(result: SimulationResult, start: float, end: float) -> dict[str, Any]:
    """SLO breach minutes and GPU-hours of one run within ``[start, end)`` seconds.

    Why: a setting chosen on a trace must be judged on a part of it that did not choose it, so
    a run is scored on a window. Minutes are whole, as in :func:`summarise` (requests by
    arrival): a minute belongs to the window its start lies in, so adjacent windows share none.
    GPU-hours are the replica count after each tick times the tick, over the ticks in the
    window: what the autoscaler ordered there (a replica draining its last batch after removal
    is not counted, so the whole-run sum can be slightly below ``summarise``'s billed figure).
    """
    if not start < end:
        raise ValueError("a window needs start < end")
    cfg = result.config
    arrivals = result.trace.arrivals
    minute_start = np.floor(arrivals / 60.0) * 60.0
    inside = (arrivals >= cfg.score_from) & (minute_start >= start) & (minute_start < end)
    measured = (result.latency if cfg.slo_on == "latency" else result.queueing)[inside]
    minute = np.floor(arrivals[inside] / 60.0).astype(np.int64)
    p99 = _p99_per_minute(minute, np.where(np.isfinite(measured), measured, np.inf))
    t = np.asarray(result.timeline.t)
    ticks = (t >= start) & (t < end)  # the count after tick t holds until the next tick
    ordered = float(np.asarray(result.timeline.replicas)[ticks].sum()) * cfg.tick
    return {
        "window_seconds": (start, end),
        "breach_minutes": int((p99 > cfg.slo_seconds).sum()),
        "minutes": len(p99),
        "slo_minutes": float((p99 <= cfg.slo_seconds).mean()) if len(p99) else 1.0,
        "gpu_hours": ordered / 3600.0,
    }


def _p99_per_minute(minute: np.ndarray, values: np.ndarray) -> np.ndarray:
    """p99 of ``values`` for each distinct minute (``minute`` is sorted, as arrivals are)."""
    if minute.size == 0:
        return np.zeros(0)
    bounds = np.flatnonzero(np.diff(minute)) + 1
    return np.array([np.percentile(g, 99) for g in np.split(values, bounds)])


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(payload, indent=2, sort_keys=True, default=_jsonable) + "\n")


def _jsonable(value: Any) -> Any:
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} as JSON")


def plot(results: Sequence[SimulationResult], path: str | Path, title: str = "") -> None:
    """Load, replicas and per-minute p99 latency over time, one column of panels per run set."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(12, 9), sharex=True)
    load_ax, rep_ax, lat_ax = axes
    first = results[0]
    hours = np.asarray(first.timeline.t) / 3600.0
    cap = first.config.target_rate_per_replica
    load_ax.plot(hours, np.asarray(first.timeline.rate), lw=0.6, color="0.3", label="request rate")
    for r in results:
        if r.policy == "predictive":
            fc = np.asarray(r.timeline.forecast)
            load_ax.plot(hours[: len(fc)], fc[: len(hours)], lw=0.6, label="forecast upper")
        t = np.asarray(r.timeline.t) / 3600.0
        rep_ax.step(t, r.timeline.replicas, where="post", lw=0.8, label=r.policy)
        minute = np.floor(r.trace.arrivals / 60.0).astype(np.int64)
        measured = r.latency if r.config.slo_on == "latency" else r.queueing
        p99 = _p99_per_minute(minute, np.where(np.isfinite(measured), measured, np.nan))
        lat_ax.plot(np.unique(minute) / 60.0, p99, lw=0.6, label=r.policy)
    rep_ax.plot(
        hours,
        np.asarray(first.timeline.rate) / cap,
        lw=0.5,
        color="0.6",
        ls=":",
        label="rate / target per replica",
    )
    lat_ax.axhline(first.config.slo_seconds, color="red", lw=0.8, ls="--", label="SLO")
    lat_ax.set_yscale("log")
    load_ax.set_ylabel("requests/s")
    rep_ax.set_ylabel("replicas")
    lat_ax.set_ylabel(f"p99 {first.config.slo_on} per minute (s)")
    lat_ax.set_xlabel("hours")
    for ax in axes:
        ax.legend(loc="upper right", fontsize=7)
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
