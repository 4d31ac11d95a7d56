"""Where a run's paid GPU-time went, and in which phase of the load.

Each worker holds its GPU from its start to its stop, so every paid GPU-second is in one of
these states:

* **online**: running online batches;
* **best-effort**: running the job's batches on time online requests left idle;
* **starting**: holding a worker that is not ready yet (loading its model, warming up, or
  waiting for a CPU core on a busy machine): nothing can run on it;
* **idle, best-effort throttled**: a ready worker's batcher held best-effort work at zero
  because the online p99 came within its margin of the SLO (online first, by design);
* **idle, best-effort share cut**: the batcher allowed best-effort work only part of the device's
  time, backing off or growing back after a throttle;
* **idle, best-effort allowed**: nothing held best-effort work back, yet the device was idle:
  the job did not keep the worker supplied (its concurrency climbing back after refusals, the
  runner or the local Service short of CPU), or the gaps between online batches were shorter
  than a best-effort slice.

The states tell a user which knob matters: starting time is the cold start (and the machine),
throttled time is the online SLO's margin, share-cut time is how fast best-effort work returns
after a throttle, and allowed-but-idle time is the job's supply.

The load's phase (rising, falling or steady, from the profile's own target rate) tells when:
a fleet sized on a forecast pays for starts and tight latency while the load climbs, and for
workers held by the scale-down stabilization after it falls.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

PHASES = ("steady", "rising", "falling")
# The target rate changes by more than this share of the run's peak rate per second: the load
# is rising or falling. Half a percent a second is a day-long ramp played in a few minutes;
# slower drifts count as steady.
TREND_SHARE_PER_SECOND = 0.005
TREND_SECONDS = 5.0  # the trend is the target rate's change across this span around a sample


class PaidSample(Protocol):
    """What the breakdown reads of a stack sample (stack.report.Sample). Work is in percent of
    one GPU (100 = one GPU busy), summed over the workers."""

    @property
    def elapsed(self) -> float: ...
    @property
    def target_rps(self) -> float: ...
    @property
    def workers(self) -> int: ...
    @property
    def ready_workers(self) -> int: ...
    @property
    def online_work(self) -> float | None: ...
    @property
    def best_effort_work(self) -> float | None: ...
    @property
    def idle_throttled_work(self) -> float | None: ...
    @property
    def idle_share_cut_work(self) -> float | None: ...


@dataclass(frozen=True)
class PaidTime:
    """GPU-seconds paid over a stretch of the run and the state they were spent in."""

    seconds: float  # wall-clock seconds of the stretch
    gpu_seconds: float
    online: float
    best_effort: float
    starting: float
    idle_throttled: float
    idle_share_cut: float
    idle_allowed: float

    def share(self, state: str) -> float | None:
        """The share of the paid GPU-seconds spent in ``state`` (a field name), None if none
        were paid."""
        value: float = getattr(self, state)
        return value / self.gpu_seconds if self.gpu_seconds else None


STATES = ("online", "best_effort", "starting", "idle_throttled", "idle_share_cut", "idle_allowed")


def load_phases(samples: Sequence[PaidSample]) -> list[str]:
    """Each sample's phase of the load: ``rising`` or ``falling`` while the profile's target
    rate changes by more than :data:`TREND_SHARE_PER_SECOND` of the run's peak a second across
    :data:`TREND_SECONDS` around it, else ``steady``."""
    peak = max((s.target_rps for s in samples), default=0.0)
    phases = []
    for s in samples:
        around = [o for o in samples if abs(o.elapsed - s.elapsed) <= TREND_SECONDS / 2]
        first, last = around[0], around[-1]
        span = last.elapsed - first.elapsed
        slope = (last.target_rps - first.target_rps) / span if span > 0 else 0.0
        if peak > 0 and slope > TREND_SHARE_PER_SECOND * peak:
            phases.append("rising")
        elif peak > 0 and slope < -TREND_SHARE_PER_SECOND * peak:
            phases.append("falling")
        else:
            phases.append("steady")
    return phases


def breakdown(samples: Sequence[PaidSample], phase: str | None = None) -> PaidTime:
    """The run's paid time by state, integrating each sample over the time to the next; only the
    samples in ``phase`` when one is given. Idle time on ready workers that no sample explains
    (throttled or share cut) is counted as best-effort allowed."""
    phases = load_phases(samples) if phase is not None else []
    totals = dict.fromkeys(("seconds", "gpu_seconds", *STATES), 0.0)
    for i, (before, after) in enumerate(itertools.pairwise(samples)):
        if phase is not None and phases[i] != phase:
            continue
        dt = after.elapsed - before.elapsed
        online = (before.online_work or 0.0) / 100.0
        best_effort = (before.best_effort_work or 0.0) / 100.0
        starting = max(0, before.workers - before.ready_workers)
        throttled = (before.idle_throttled_work or 0.0) / 100.0
        share_cut = (before.idle_share_cut_work or 0.0) / 100.0
        ready_idle = max(0.0, before.ready_workers - online - best_effort)
        explained = min(ready_idle, throttled + share_cut)
        if explained < throttled + share_cut:  # the rates and gauges were read apart: scale
            throttled, share_cut = (
                explained * throttled / (throttled + share_cut),
                explained * share_cut / (throttled + share_cut),
            )
        totals["seconds"] += dt
        totals["gpu_seconds"] += before.workers * dt
        totals["online"] += online * dt
        totals["best_effort"] += best_effort * dt
        totals["starting"] += starting * dt
        totals["idle_throttled"] += throttled * dt
        totals["idle_share_cut"] += share_cut * dt
        totals["idle_allowed"] += (ready_idle - explained) * dt
    return PaidTime(**totals)


def by_phase(samples: Sequence[PaidSample]) -> dict[str, PaidTime]:
    """:func:`breakdown` for each phase of the load that the run went through."""
    parts = {phase: breakdown(samples, phase) for phase in PHASES}
    return {phase: part for phase, part in parts.items() if part.seconds > 0}
