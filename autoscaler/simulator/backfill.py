"""Best-effort backfill on the online fleet: the work, its time quantum and its slack controller.

Best-effort work (offline inference that can wait: embeddings, evaluations, re-scoring) runs
only on replicas the online load leaves idle, in slices of one ``quantum`` of replica time, so an
online request that arrives while every replica runs a slice waits at most about one quantum.
Online requests always take a replica first when one frees up.

The share of replicas that may run best-effort slices is set by a feedback loop in the spirit of
Heracles (Lo et al., ISCA 2015): every decision period it reads the online latency slack, the SLO
minus the recent online p99, as a share of the SLO. Under ``margin`` the share drops to zero at
once (the online service is at risk); over twice the margin it grows by ``grow_step``; in between
it holds. Shrinking at once and growing in steps is what keeps the online SLO first: a wrong
grow costs one period of slices, a late shrink costs breached minutes.

``reserve_quantum`` makes SLO sizing leave the quantum out of the latency budget: an online
request may wait up to one quantum for a slice to end, so under backfill the fleet is sized for
``SLO - quantum``. A fleet sized to the edge of its SLO otherwise lets each slice tip the minutes
at that edge over it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autoscaler.core.slo_sizing import ServiceModel

# The default quantum's share of the room a full online batch leaves inside the SLO.
DEFAULT_QUANTUM_SHARE = 0.1


@dataclass(frozen=True)
class BackfillConfig:
    """A best-effort backlog and how it is let onto the fleet.

    ``work_seconds`` is the backlog in replica-seconds (``math.inf``: it never runs dry);
    ``quantum_seconds`` the longest best-effort slice (``None``: :func:`default_quantum`);
    ``reserve_quantum``: SLO sizing holds ``SLO - quantum`` (module docstring).
    """

    work_seconds: float = math.inf
    quantum_seconds: float | None = None
    margin: float = 0.1
    grow_step: float = 0.1
    window_seconds: float = 60.0
    reserve_quantum: bool = False

    def __post_init__(self) -> None:
        if math.isnan(self.work_seconds) or self.work_seconds <= 0:
            raise ValueError("best-effort work must be > 0 replica-seconds (inf: never runs dry)")
        if self.quantum_seconds is not None and not (
            math.isfinite(self.quantum_seconds) and self.quantum_seconds > 0
        ):
            raise ValueError("the best-effort quantum must be a finite number of seconds > 0")
        if not 0 < self.margin < 0.5:
            raise ValueError("the slack margin must be in (0, 0.5), a share of the SLO, e.g. 0.1")
        if not 0 < self.grow_step <= 1:
            raise ValueError("the best-effort grow step must be in (0, 1], e.g. 0.1")
        if not (math.isfinite(self.window_seconds) and self.window_seconds > 0):
            raise ValueError("the slack window must be a finite number of seconds > 0")

    def quantum(self, service: ServiceModel, slo_seconds: float) -> float:
        if self.quantum_seconds is not None:
            return self.quantum_seconds
        return default_quantum(service, slo_seconds)


def default_quantum(service: ServiceModel, slo_seconds: float) -> float:
    """A tenth of the room a full online batch leaves inside the SLO (a tenth of the SLO when
    there is none): the most an online request should wait for a best-effort slice to end."""
    room = slo_seconds - service.batch_seconds(service.max_batch)
    return DEFAULT_QUANTUM_SHARE * (room if room > 0 else slo_seconds)


class SlackController:
    """The best-effort share of replicas, from the online latency slack (pure; no clock)."""

    def __init__(self, config: BackfillConfig, slo_seconds: float, share: float = 1.0) -> None:
        self.config = config
        self.slo_seconds = slo_seconds
        self.share = share

    def update(self, online_p99: float | None) -> float:
        """Adjust and return the share after reading the recent online p99 (None: no requests,
        which leaves the whole slack)."""
        slack = 1.0 if online_p99 is None else (self.slo_seconds - online_p99) / self.slo_seconds
        if slack < self.config.margin:
            self.share = 0.0
        elif slack > 2 * self.config.margin:
            self.share = min(1.0, self.share + self.config.grow_step)
        return self.share

    def allowed_replicas(self, ready: int) -> int:
        """How many of ``ready`` replicas may run best-effort slices at this share."""
        return math.floor(self.share * ready + 1e-9)
