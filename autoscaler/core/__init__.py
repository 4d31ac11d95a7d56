"""The pure decision core: HPA-exact per-metric maths, behavior rules and the predictive candidate.

No I/O and no clock: callers pass ``now``. The controller, the local mode and the simulator all
decide through :func:`decide` and report completed scales through :func:`record_scale`.
"""

from autoscaler.core.behavior import ScalingState, record_scale
from autoscaler.core.decision import Decision, MetricInput, MetricOutcome, decide
from autoscaler.core.replica_calculator import PodSample, Tolerances

__all__ = [
    "Decision",
    "MetricInput",
    "MetricOutcome",
    "PodSample",
    "ScalingState",
    "Tolerances",
    "decide",
    "record_scale",
]
