"""Kubernetes' own HPA test cases, ported as data against the pure core.

Each case id names the Kubernetes test file and test (or table entry) it comes from:
``pkg/controller/podautoscaler/replica_calculator_test.go``, ``horizontal_test.go`` and
``pkg/apis/autoscaling/v2/defaults_test.go``. The inputs and expected results are Kubernetes';
only the shape is translated:

* a resource metric's per-container usage levels (millicores) and requests become one value per
  pod, the pod's utilization in percent of its request, with the request on each container, as
  the controller reads a Utilization query (every test pod has two containers, as there);
* ``hotCPUCreationTime``/``coolCPUCreationTime`` are one and three minutes before now, against the
  tests' initialization period of two minutes and readiness delay of ten seconds; Go's zero time
  (an unset start, transition or sample timestamp) is the epoch, long before now;
* custom-metric levels stay in milli-units: only ratios matter.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import pytest

from autoscaler.core.behavior import (
    ScaleEvent,
    ScalingState,
    TimedRecommendation,
    limit_rate,
    limit_rate_legacy,
    scale_down_limit,
    scale_up_limit,
    stabilize,
    stabilize_legacy,
)
from autoscaler.core.replica_calculator import (
    MAX_REPLICAS,
    MetricUnavailable,
    PodSample,
    ReadinessTimes,
    Tolerances,
    average_value_metric_replicas,
    count_ready,
    group_pods,
    pods_metric_replicas,
    resource_utilization_replicas,
    value_metric_replicas,
)
from autoscaler.spec import (
    Behavior,
    HPAScalingPolicy,
    HPAScalingRules,
    default_scale_down_rules,
    default_scale_up_rules,
    parse_spec,
)

RC = "replica_calculator_test.go"
HZ = "horizontal_test.go"
DF = "defaults_test.go"

NOW = 1_700_000_000.0
ZERO = 0.0  # Go's zero time.Time
HOT = NOW - 60.0  # hotCPUCreationTime
COOL = NOW - 180.0  # coolCPUCreationTime
READINESS = ReadinessTimes(initialization_period=120.0, initial_readiness_delay=10.0)
TOL = Tolerances(up=0.1, down=0.1)  # defaultTestingTolerance
INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class Pods:
    """A replicaCalcTestCase's pods: per-pod readiness, start time, phase and deletion."""

    current: int
    readiness: tuple[bool, ...] = ()
    start: tuple[float, ...] = ()
    phase: tuple[str, ...] = ()
    deleting: tuple[bool, ...] = ()

    @property
    def count(self) -> int:
        # failed pods are not counted in currentReplicas but are listed
        return max(self.current, len(self.phase))

    def build(self, values: list[float | None], containers: list[dict]) -> list[PodSample]:
        pods = []
        for i in range(self.count):
            pods.append(
                PodSample(
                    name=f"test-pod-{i}",
                    value=values[i] if i < len(values) else None,
                    ready=self.readiness[i] if i < len(self.readiness) else True,
                    phase=self.phase[i] if self.phase else "Running",  # type: ignore[arg-type]
                    deleting=bool(self.deleting and self.deleting[i]),
                    started_at=self.start[i] if self.start else ZERO,
                    ready_changed_at=ZERO,
                    sampled_at=ZERO,
                    window_seconds=60.0,
                    containers=containers[i] if i < len(containers) else {},
                )
            )
        return pods


T, F = True, False


@dataclass(frozen=True)
class ResourceCase:
    id: str
    pods: Pods
    requests: tuple[float, ...]  # cores per container
    levels: tuple[float, ...]  # millicores per container; fewer than pods = missing samples
    target: int
    expected: int | None  # None: the metric is invalid
    utilization: int | None = None
    container: str | None = None
    tolerances: Tolerances = TOL
    error: str = ""


def _resource_pods(case: ResourceCase) -> list[PodSample]:
    containers, values = [], []
    for i in range(case.pods.count):
        milli = case.requests[i] * 1000 if i < len(case.requests) else None
        per_container = {"cpu": milli} if milli is not None else {}
        containers.append({"container1": dict(per_container), "container2": dict(per_container)})
        if i < len(case.levels):
            # percent of the request, as a Utilization query reports it
            values.append(case.levels[i] / milli * 100.0 if milli else case.levels[i])
    return case.pods.build(values, containers)


RESOURCE_CASES = [
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale up",
        Pods(3),
        (1.0,) * 3,
        (300, 500, 700),
        30,
        5,
        50,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale up: container metric",
        Pods(3),
        (1.0,) * 3,
        (300, 500, 700),
        30,
        5,
        50,
        container="container2",
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale up: unready pod scales less",
        Pods(3, readiness=(F, T, T)),
        (1.0,) * 3,
        (300, 500, 700),
        30,
        4,
        60,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale up: hot-CPU pod scales less",
        Pods(3, start=(HOT, COOL, COOL)),
        (1.0,) * 3,
        (300, 500, 700),
        30,
        4,
        60,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/no scale: unready pods ignored",
        Pods(3, readiness=(T, F, F)),
        (1.0,) * 3,
        (400, 500, 700),
        30,
        3,
        40,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/no scale: hot-CPU pods ignored",
        Pods(3, readiness=(T, F, F), start=(COOL, HOT, HOT)),
        (1.0,) * 3,
        (400, 500, 700),
        30,
        3,
        40,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale up: failed pods ignored",
        Pods(2, readiness=(T, T, F, F), phase=("Running",) * 2 + ("Failed",) * 2),
        (1.0,) * 4,
        (500, 700),
        30,
        4,
        60,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale up: pods being deleted are ignored",
        Pods(2, readiness=(T, T, F, F), phase=("Running",) * 4, deleting=(F, F, T, T)),
        (1.0,) * 4,
        (500, 700),
        30,
        4,
        60,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale down",
        Pods(5),
        (1.0,) * 5,
        (100, 300, 500, 250, 250),
        50,
        3,
        28,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale down: container metric",
        Pods(5),
        (1.0,) * 5,
        (100, 300, 500, 250, 250),
        50,
        3,
        28,
        container="container2",
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale down: exclude unready pods",
        Pods(5, readiness=(T, T, T, F, F)),
        (1.0,) * 5,
        (100, 300, 500, 250, 250),
        50,
        2,
        30,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale down: exclude unscheduled pods",
        Pods(5, readiness=(T, F, F, F, F), phase=("Running",) + ("Pending",) * 4),
        (1.0,) * 5,
        (100,),
        50,
        1,
        10,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale down: ignore hot-CPU pods",
        Pods(5, start=(COOL,) * 3 + (HOT,) * 2),
        (1.0,) * 5,
        (100, 300, 500, 250, 250),
        50,
        2,
        30,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale down: failed pods ignored",
        Pods(5, readiness=(T,) * 5 + (F, F), phase=("Running",) * 5 + ("Failed",) * 2),
        (1.0,) * 7,
        (100, 300, 500, 250, 250),
        50,
        3,
        28,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcResourceScale/scale down: pods being deleted are ignored",
        Pods(5, readiness=(T,) * 5 + (F, F), phase=("Running",) * 7, deleting=(F,) * 5 + (T, T)),
        (1.0,) * 7,
        (100, 300, 500, 250, 250),
        50,
        3,
        28,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcTolerance", Pods(3), (0.9, 1.0, 1.1), (1010, 1030, 1020), 100, 3, 102
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcSuperfluousMetrics",
        Pods(4),
        (1.0,) * 4,
        (4000, 9500, 3000, 7000),
        100,
        24,
        587,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetrics", Pods(4), (1.0,) * 4, (400, 95), 100, 3, 24
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetricsNoChangeEq", Pods(2), (1.0,) * 2, (1000,), 100, 2, 100
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetricsNoChangeGt", Pods(2), (1.0,) * 2, (1900,), 100, 2, 190
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetricsNoChangeLt", Pods(2), (1.0,) * 2, (600,), 100, 2, 60
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetricsUnreadyChange",
        Pods(3, readiness=(F, T, T)),
        (1.0,) * 3,
        (100, 450),
        50,
        3,
        45,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetricsHotCpuNoChange",
        Pods(3, start=(HOT, COOL, COOL)),
        (1.0,) * 3,
        (100, 450),
        50,
        3,
        45,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetricsUnreadyScaleUp",
        Pods(3, readiness=(F, T, T)),
        (1.0,) * 3,
        (100, 2000),
        50,
        4,
        200,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetricsHotCpuScaleUp",
        Pods(3, readiness=(F, T, T), start=(HOT, COOL, COOL)),
        (1.0,) * 3,
        (100, 2000),
        50,
        4,
        200,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetricsUnreadyScaleDown",
        Pods(4, readiness=(F, T, T, T)),
        (1.0,) * 4,
        (100, 100, 100),
        50,
        3,
        10,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcMissingMetricsScaleDownTargetOver100",
        Pods(4, readiness=(F, T, T, T)),
        (1.0, 1.0, 2.0, 2.0),
        (200, 100, 100),
        300,
        2,
        6,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcDuringRollingUpdateWithMaxSurge",
        Pods(2, phase=("Running",) * 3),
        (1.0,) * 3,
        (100, 100),
        50,
        2,
        10,
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcConfigurableTolerance/Outside of a 0% tolerance",
        Pods(3),
        (0.9, 1.0, 1.1),
        (909, 1010, 1111),
        100,
        4,
        101,
        tolerances=Tolerances(up=0.0, down=0.0),
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcConfigurableTolerance/Within a 200% scale-up tolerance",
        Pods(3),
        (0.9, 1.0, 1.1),
        (1890, 1910, 1900),
        100,
        3,
        190,
        tolerances=Tolerances(up=2.0, down=0.1),
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcConfigurableTolerance/Outside 8% scale-up tolerance "
        "(and superfuous scale-down tolerance)",
        Pods(3),
        (0.9, 1.0, 1.1),
        (1100, 1080, 1090),
        100,
        4,
        109,
        tolerances=Tolerances(up=0.08, down=2.0),
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcConfigurableTolerance/Within a 36% scale-down tolerance",
        Pods(3),
        (0.9, 1.0, 1.1),
        (660, 640, 650),
        100,
        3,
        65,
        tolerances=Tolerances(up=0.1, down=0.36),
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcConfigurableTolerance/Outside a 34% scale-down tolerance",
        Pods(3),
        (0.9, 1.0, 1.1),
        (660, 640, 650),
        100,
        2,
        65,
        tolerances=Tolerances(up=0.1, down=0.34),
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcEmptyCPURequest",
        Pods(1),
        (),
        (200,),
        100,
        None,
        error="missing request for cpu",
    ),
    ResourceCase(
        f"{RC}::TestReplicaCalcEmptyMetrics",
        Pods(4),
        (1.0,) * 3,
        (),
        100,
        None,
        error="no metrics returned",
    ),
]


@pytest.mark.parametrize("case", RESOURCE_CASES, ids=lambda c: c.id)
def test_resource_utilization_cases(case: ResourceCase) -> None:
    pods = _resource_pods(case)

    def run():
        return resource_utilization_replicas(
            pods,
            case.pods.current,
            case.target,
            "cpu",
            case.tolerances,
            NOW,
            container=case.container,
            readiness=READINESS,
        )

    if case.expected is None:
        with pytest.raises(MetricUnavailable, match=case.error):
            run()
        return
    proposal = run()
    assert proposal.replicas == case.expected
    assert proposal.usage == case.utilization


def test_disjoint_metrics_make_the_metric_invalid() -> None:
    """replica_calculator_test.go::TestReplicaCalcDisjointResourcesMetrics: the only sample is
    for a pod the selector does not list, so no listed pod has one (the metrics source attaches
    samples to listed pods by name)."""
    pod = Pods(1).build([None], [{"c": {"cpu": 1000.0}}])
    with pytest.raises(MetricUnavailable):
        resource_utilization_replicas(pod, 1, 100, "cpu", TOL, NOW, readiness=READINESS)


@pytest.mark.parametrize("second_pass", [False, True], ids=["scales", "within tolerance"])
def test_computed_tolerance(second_pass: bool) -> None:
    """replica_calculator_test.go::TestReplicaCalcComputedToleranceAlgImplementation (and
    horizontal_test.go's twin): a target just past the tolerance scales, one just inside it
    does not, with requests jittered around 2x the usage."""
    start_pods, used_per_pod = 10, 150
    total_used = start_pods * used_per_pod
    total_requested = 2 * total_used
    requested_to_used = float(total_requested // total_used)
    per_pod_requested = total_requested // start_pods
    margin = 0.004 if second_pass else 0.01
    target = abs(1 / (requested_to_used * (1 - 0.1))) + margin
    percent_target = int(target * 100)
    used_ratio = total_used / (total_requested * (abs(1 / (requested_to_used * 0.9)) + 0.01))
    expected = start_pods if second_pass else math.ceil(used_ratio * start_pods)
    jitter = (100, -100, 10, -10, 2, -2, 1, -1, 0, 0)
    case = ResourceCase(
        "computed",
        Pods(start_pods),
        tuple((per_pod_requested + j) / 1000 for j in jitter),
        (total_used / 10,) * start_pods,
        percent_target,
        expected,
        total_used * 100 // total_requested,
    )
    proposal = resource_utilization_replicas(
        _resource_pods(case), start_pods, percent_target, "cpu", TOL, NOW, readiness=READINESS
    )
    assert (proposal.replicas, proposal.usage) == (expected, case.utilization)


@dataclass(frozen=True)
class CustomCase:
    id: str
    kind: str  # pods | object | external | object_per_pod | external_per_pod
    current: int
    levels: tuple[float, ...]
    target: float
    expected: int
    usage: float | None = None
    readiness: tuple[bool, ...] = ()
    start: tuple[float, ...] = ()
    phase: tuple[str, ...] = ()
    tolerances: Tolerances = TOL


CUSTOM_CASES = [
    CustomCase(
        f"{RC}::TestReplicaCalcScaleUpCM", "pods", 3, (20000, 10000, 30000), 15000, 4, 20000
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcScaleUpCMUnreadyHotCpuNoLessScale",
        "pods",
        3,
        (50000, 10000, 30000),
        15000,
        6,
        30000,
        readiness=(T, T, F),
        start=(COOL, COOL, HOT),
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcScaleUpCMUnreadyHotCpuScaleWouldScaleDown",
        "pods",
        3,
        (50000, 15000, 30000),
        15000,
        7,
        95000 / 3,
        readiness=(F, T, F),
        start=(HOT, COOL, HOT),
    ),
    CustomCase(f"{RC}::TestReplicaCalcScaleDownCM", "pods", 5, (12000,) * 5, 20000, 3, 12000),
    CustomCase(
        f"{RC}::TestReplicaCalcToleranceCM", "pods", 3, (20000, 21000, 21000), 20000, 3, 62000 / 3
    ),
    CustomCase(
        f"{RC}::TestPlainMetricReplicaCalcMissingMetricsNoChangeEq",
        "pods",
        5,
        (20000, 19000, 21000),
        20000,
        5,
        20000,
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcDuringRollingUpdateWithMaxSurgeCM",
        "pods",
        2,
        (10000, 10000),
        17000,
        2,
        10000,
        phase=("Running",) * 3,
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcConfigurableToleranceCM",
        "pods",
        3,
        (20000, 21000, 21000),
        20000,
        4,
        62000 / 3,
        tolerances=Tolerances(up=0.01, down=0.1),
    ),
    CustomCase(f"{RC}::TestReplicaCalcScaleUpCMObject", "object", 3, (20000,), 15000, 4, 20000),
    CustomCase(
        f"{RC}::TestReplicaCalcScaleUpCMObjectIgnoresUnreadyPods",
        "object",
        3,
        (50000,),
        10000,
        5,
        50000,
        readiness=(F, T, F),
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcScaleUpCMExternalIgnoresUnreadyPods",
        "external",
        3,
        (8600,),
        4400,
        2,
        8600,
        readiness=(F, T, F),
    ),
    CustomCase(f"{RC}::TestReplicaCalcScaleDownCMObject", "object", 5, (12000,), 20000, 3, 12000),
    CustomCase(f"{RC}::TestReplicaCalcScaleDownCMExternal", "external", 5, (8600,), 14334, 3, 8600),
    CustomCase(f"{RC}::TestReplicaCalcToleranceCMObject", "object", 3, (20666,), 20000, 3, 20666),
    CustomCase(f"{RC}::TestReplicaCalcToleranceCMExternal", "external", 3, (8600,), 8888, 3, 8600),
    CustomCase(
        f"{RC}::TestReplicaCalcConfigurableToleranceCMObject",
        "object",
        3,
        (20666,),
        20000,
        4,
        20666,
        tolerances=Tolerances(up=0.01, down=0.1),
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcConfigurableToleranceCMExternal",
        "external",
        3,
        (8900,),
        8800,
        4,
        8900,
        tolerances=Tolerances(up=0.01, down=0.1),
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcScaleUpOverflow",
        "object",
        3,
        (INT64_MAX,),
        1,
        MAX_REPLICAS,
        INT64_MAX,
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcScaleUpCMPerPodObject", "object_per_pod", 3, (20000,), 5000, 4, 6667
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcScaleDownPerPodCMObject", "object_per_pod", 5, (6000,), 2000, 3, 1200
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcTolerancePerPodCMObject",
        "object_per_pod",
        4,
        (20166,),
        5000,
        4,
        5042,
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcConfigurableTolerancePerPodCMObject",
        "object_per_pod",
        4,
        (20208,),
        5000,
        5,
        5052,
        tolerances=Tolerances(up=0.01, down=0.1),
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcScaleUpPerPodCMExternal",
        "external_per_pod",
        3,
        (8600,),
        2150,
        4,
        2867,
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcScaleDownPerPodCMExternal",
        "external_per_pod",
        5,
        (8600,),
        2867,
        3,
        1720,
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcTolerancePerPodCMExternal",
        "external_per_pod",
        3,
        (8600,),
        2900,
        3,
        2867,
    ),
    CustomCase(
        f"{RC}::TestReplicaCalcConfigurableTolerancePerPodCMExternal",
        "external_per_pod",
        3,
        (8600,),
        2800,
        4,
        2867,
        tolerances=Tolerances(up=0.01, down=0.1),
    ),
    CustomCase(
        f"{RC}::TestExternalPerPodMetricReplicaOverflow",
        "external_per_pod",
        1,
        (INT64_MAX,),
        1,
        MAX_REPLICAS,
        INT64_MAX,
    ),
    CustomCase(
        f"{RC}::TestExternalPerPodMetricUsageOverflow",
        "external_per_pod",
        1,
        (INT64_MAX,),
        INT64_MAX,
        1,
        INT64_MAX,
    ),
]


@pytest.mark.parametrize("case", CUSTOM_CASES, ids=lambda c: c.id)
def test_custom_and_external_metric_cases(case: CustomCase) -> None:
    pods = Pods(case.current, case.readiness, case.start, case.phase)
    if case.kind == "pods":
        proposal = pods_metric_replicas(
            pods.build(list(case.levels), []), case.current, case.target, case.tolerances, NOW
        )
        assert proposal.usage == pytest.approx(case.usage)
    elif case.kind in ("object", "external"):
        ready = count_ready(pods.build([], []))
        proposal = value_metric_replicas(
            case.levels[0], case.current, case.target, case.tolerances, ready
        )
        assert proposal.usage == case.usage
    else:
        proposal = average_value_metric_replicas(
            case.levels[0], case.current, case.target, case.tolerances
        )
        # the HPA reports the per-pod usage rounded up to a whole milli-unit
        assert math.ceil(proposal.usage) == pytest.approx(case.usage)
    assert proposal.replicas == case.expected


def _pod(
    name,
    phase="Succeeded",
    start=None,
    ready=None,
    changed=None,
    value=1.0,
    sampled=None,
    window=0.0,
):
    return PodSample(
        name,
        value,
        ready=ready,
        phase=phase,
        started_at=start,
        ready_changed_at=changed,
        sampled_at=sampled,
        window_seconds=window,
    )


GROUP_CASES = [
    ("void", [], True, 0, set(), set()),
    (
        "count in a ready pod - memory",
        [_pod("bentham", sampled=NOW, window=60)],
        False,
        1,
        set(),
        set(),
    ),
    (
        "unready a pod without ready condition - CPU",
        [_pod("lucretius", start=NOW)],
        True,
        0,
        {"lucretius"},
        set(),
    ),
    (
        "count in a ready pod with fresh metrics during initialization period - CPU",
        [_pod("bentham", start=NOW - 60, ready=True, changed=NOW - 30, sampled=NOW, window=30)],
        True,
        1,
        set(),
        set(),
    ),
    (
        "unready a ready pod without fresh metrics during initialization period - CPU",
        [_pod("bentham", start=NOW - 60, ready=True, changed=NOW - 30, sampled=NOW, window=60)],
        True,
        0,
        {"bentham"},
        set(),
    ),
    (
        "unready an unready pod during initialization period - CPU",
        [_pod("lucretius", start=NOW - 600, ready=False, changed=NOW - 594)],
        True,
        0,
        {"lucretius"},
        set(),
    ),
    (
        "count in a ready pod without fresh metrics after initialization period - CPU",
        [
            _pod(
                "bentham",
                start=NOW - 180,
                ready=True,
                changed=NOW - 180,
                sampled=NOW - 120,
                window=60,
            )
        ],
        True,
        1,
        set(),
        set(),
    ),
    (
        "count in an unready pod that was ready after initialization period - CPU",
        [_pod("lucretius", start=NOW - 600, ready=False, changed=NOW - 540)],
        True,
        1,
        set(),
        set(),
    ),
    # the older table's boundary: unready exactly at start + delay is not "never ready"
    (
        "ignore pod that has never been ready after initialization period - CPU",
        [_pod("lucretius", start=NOW - 600, ready=False, changed=NOW - 590)],
        True,
        1,
        set(),
        set(),
    ),
    (
        "a missing pod",
        [_pod("epicurus", start=NOW - 180, value=None)],
        True,
        0,
        set(),
        {"epicurus"},
    ),
    (
        "several pods",
        [
            _pod("lucretius", start=NOW),
            _pod("niccolo", start=NOW - 180, ready=True, changed=NOW - 180),
            _pod("epicurus", start=NOW - 180, value=None),
        ],
        True,
        1,
        {"lucretius"},
        {"epicurus"},
    ),
    (
        "pending pods are ignored",
        [_pod("unscheduled", phase="Pending", value=None)],
        True,
        0,
        {"unscheduled"},
        set(),
    ),
]


@pytest.mark.parametrize(
    ("pods", "cpu", "ready", "unready", "missing"),
    [case[1:] for case in GROUP_CASES],
    ids=[f"{RC}::TestGroupPods/{case[0]}" for case in GROUP_CASES],
)
def test_group_pods_cases(pods, cpu, ready, unready, missing) -> None:
    groups = group_pods(pods, NOW, readiness_rules=cpu, readiness=READINESS)
    assert groups.ready_count == ready
    assert groups.unready == unready
    assert groups.missing == missing


# --- horizontal_test.go --------------------------------------------------------------------


def rules(pods=0, pods_period=0, percent=0, percent_period=0, window=0) -> HPAScalingRules:
    """horizontal_test.go's generateScalingRules."""
    policies = []
    if pods:
        policies.append(HPAScalingPolicy("Pods", pods, pods_period))
    if percent:
        policies.append(HPAScalingPolicy("Percent", percent, percent_period))
    return HPAScalingRules(window, "Max", tuple(policies))


def spread(changes: list[int], period: float) -> list[ScaleEvent]:
    """horizontal_test.go's generateEventsUniformDistribution: each event in the middle of its
    share of the last ``period`` seconds, oldest first."""
    segment = period / len(changes)
    return [
        ScaleEvent(change, NOW - (period - segment * (i + 1) + segment / 2))
        for i, change in enumerate(changes)
    ]


@dataclass(frozen=True)
class RuleCase:
    name: str
    current: int
    desired: int
    min_replicas: int
    max_replicas: int
    expected: int
    reason: str
    up: HPAScalingRules | None = None
    down: HPAScalingRules | None = None
    up_events: list[ScaleEvent] = field(default_factory=list)
    down_events: list[ScaleEvent] = field(default_factory=list)


UP3 = spread([1, 5, 9], 120)
OUTDATED = [8, 12, 9, 11]
RULE_CASES = [
    RuleCase("prenormalized desired replicas within range", 5, 7, 3, 8, 7, "DesiredWithinRange"),
    RuleCase("prenormalized desired replicas < minReplicas", 3, 1, 2, 8, 2, "TooFewReplicas"),
    RuleCase(
        "prenormalized desired replicas within range when minReplicas is 0",
        1,
        0,
        0,
        10,
        0,
        "DesiredWithinRange",
    ),
    RuleCase(
        "maxReplicas is the limit because maxReplicas < scaleUpLimit",
        20,
        1000,
        1,
        10,
        10,
        "TooManyReplicas",
    ),
    RuleCase(
        "desired replica count is more than the maximum replica count",
        100,
        1000,
        100,
        150,
        150,
        "TooManyReplicas",
    ),
    RuleCase(
        "scaleUpLimit is the limit because scaleUpLimit < maxReplicas with user policies",
        3,
        1000,
        1,
        2000,
        4,
        "ScaleUpLimit",
        up=rules(percent=1, percent_period=60),
    ),
    RuleCase(
        "scaleDownLimit is the limit because scaleDownLimit > minReplicas with user defined "
        "policies",
        1000,
        3,
        3,
        2000,
        980,
        "ScaleDownLimit",
        down=rules(20, 60),
    ),
    RuleCase("scaleUp with default behavior", 10, 50, 1, 1000, 20, "ScaleUpLimit"),
    RuleCase(
        "scaleUp with pods policy larger than percent policy",
        10,
        500,
        1,
        1000,
        110,
        "ScaleUpLimit",
        up=rules(100, 60, 100, 60),
    ),
    RuleCase(
        "scaleUp with percent policy larger than pods policy",
        10,
        500,
        1,
        1000,
        20,
        "ScaleUpLimit",
        up=rules(2, 60, 100, 60),
    ),
    RuleCase(
        "scaleUp with spec MaxReplicas limitation with large pod policy",
        10,
        50,
        1,
        1000,
        50,
        "DesiredWithinRange",
        up=rules(100, 60),
    ),
    RuleCase(
        "scaleUp with spec MaxReplicas limitation with large percent policy",
        10,
        50,
        1,
        1000,
        50,
        "DesiredWithinRange",
        up=rules(10000, 60),
    ),
    RuleCase(
        "scaleUp with pod policy limitation", 10, 50, 1, 1000, 40, "ScaleUpLimit", up=rules(30, 60)
    ),
    RuleCase(
        "scaleUp with percent policy limitation",
        10,
        50,
        1,
        1000,
        30,
        "ScaleUpLimit",
        up=rules(percent=200, percent_period=60),
    ),
    RuleCase(
        "scaleDown with percent policy larger than pod policy",
        100,
        2,
        1,
        1000,
        80,
        "ScaleDownLimit",
        down=rules(20, 60, 1, 60, 300),
    ),
    RuleCase(
        "scaleDown with pod policy larger than percent policy",
        100,
        2,
        1,
        1000,
        98,
        "ScaleDownLimit",
        down=rules(2, 60, 1, 60, 300),
    ),
    RuleCase(
        "scaleDown with spec MinReplicas=nil limitation with large pod policy",
        10,
        0,
        1,
        1000,
        1,
        "TooFewReplicas",
        down=rules(100, 60, window=300),
    ),
    RuleCase(
        "scaleDown with spec MinReplicas limitation with large pod policy",
        10,
        0,
        1,
        1000,
        1,
        "TooFewReplicas",
        down=rules(100, 60, window=300),
    ),
    RuleCase(
        "scaleDown with spec MinReplicas limitation with large percent policy",
        10,
        2,
        5,
        1000,
        5,
        "TooFewReplicas",
        down=rules(percent=100, percent_period=60, window=300),
    ),
    RuleCase(
        "scaleDown with pod policy limitation",
        10,
        2,
        1,
        1000,
        5,
        "ScaleDownLimit",
        down=rules(5, 60, window=300),
    ),
    RuleCase(
        "scaleDown with percent policy limitation",
        10,
        5,
        1,
        1000,
        5,
        "DesiredWithinRange",
        down=rules(percent=50, percent_period=60, window=300),
    ),
    RuleCase(
        "scaleUp with spec MaxReplicas limitation with large pod policy and events",
        100,
        500,
        1,
        200,
        200,
        "TooManyReplicas",
        up=rules(300, 60),
        up_events=UP3,
    ),
    RuleCase(
        "scaleUp with spec MaxReplicas limitation with large percent policy and events",
        100,
        500,
        1,
        200,
        200,
        "TooManyReplicas",
        up=rules(percent=10000, percent_period=60),
        up_events=UP3,
    ),
    RuleCase(
        "scaleUp with currentReplicas limitation with rate.PeriodSeconds with a lot of "
        "recent scale up events",
        100,
        500,
        1,
        1000,
        100,
        "ScaleUpLimit",
        up=rules(5, 120),
        up_events=UP3,
    ),
    RuleCase(
        "scaleUp with pod policy and previous scale up events",
        100,
        500,
        1,
        1000,
        235,
        "ScaleUpLimit",
        up=rules(150, 120),
        up_events=UP3,
    ),
    RuleCase(
        "scaleUp with percent policy and previous scale up events",
        100,
        500,
        1,
        1000,
        255,
        "ScaleUpLimit",
        up=rules(percent=200, percent_period=120),
        up_events=UP3,
    ),
    RuleCase(
        "scaleUp with percent policy and previous scale up and down events",
        6,
        24,
        1,
        1000,
        16,
        "ScaleUpLimit",
        up=rules(percent=300, percent_period=300),
        up_events=spread([4], 120),
        down_events=spread([2], 120),
    ),
    RuleCase(
        "scaleDown with default policy and previous events",
        10,
        5,
        1,
        1000,
        5,
        "DesiredWithinRange",
        down_events=UP3,
    ),
    RuleCase(
        "scaleDown with spec MinReplicas=nil limitation with large pod policy and previous events",
        100,
        0,
        1,
        1000,
        1,
        "TooFewReplicas",
        down=rules(115, 120, window=300),
        down_events=UP3,
    ),
    RuleCase(
        "scaleDown with spec MinReplicas limitation with large pod policy and previous events",
        100,
        0,
        5,
        1000,
        5,
        "TooFewReplicas",
        down=rules(130, 120, window=300),
        down_events=UP3,
    ),
    RuleCase(
        "scaleDown with spec MinReplicas limitation with large percent policy and previous events",
        100,
        2,
        5,
        1000,
        5,
        "TooFewReplicas",
        down=rules(percent=100, percent_period=120, window=300),
        down_events=UP3,
    ),
    RuleCase(
        "scaleDown with pod policy limitation and previous events",
        100,
        2,
        1,
        1000,
        100,
        "ScaleDownLimit",
        down=rules(5, 120, window=300),
        down_events=UP3,
    ),
    RuleCase(
        "scaleDown with percent policy limitation and previous events",
        100,
        0,
        1,
        1000,
        56,
        "ScaleDownLimit",
        down=rules(percent=50, percent_period=120, window=300),
        down_events=spread([2, 4, 6], 120),
    ),
    RuleCase(
        "scaleDown with percent policy and previous scale up and down events",
        10,
        1,
        1,
        1000,
        6,
        "ScaleDownLimit",
        down=rules(percent=50, percent_period=180),
        up_events=spread([2], 120),
        down_events=spread([4], 120),
    ),
    RuleCase(
        "scaleDown with previous events preventing further scale down",
        100,
        0,
        1,
        1000,
        100,
        "ScaleDownLimit",
        down=rules(percent=10, percent_period=120, window=300),
        down_events=spread([10, 10, 10], 120),
    ),
    RuleCase(
        "scaleDown with with previous events still allowing more scale down",
        10,
        5,
        1,
        1000,
        5,
        "DesiredWithinRange",
        down=rules(percent=1000, percent_period=120, window=300),
        down_events=spread([10, 10, 10], 120),
    ),
    RuleCase(
        "check 'outdated' flag for events for one behavior for up",
        100,
        200,
        1,
        1000,
        200,
        "DesiredWithinRange",
        up=rules(1000, 60),
        up_events=spread(OUTDATED, 120),
    ),
    RuleCase(
        "check that events were not marked 'outdated' for two different policies in the "
        "behavior for up",
        100,
        200,
        1,
        1000,
        200,
        "DesiredWithinRange",
        up=rules(1000, 120, 100, 60),
        up_events=spread(OUTDATED, 120),
    ),
    RuleCase(
        "check that events were marked 'outdated' for two different policies in the "
        "behavior for up",
        100,
        200,
        1,
        1000,
        200,
        "DesiredWithinRange",
        up=rules(1000, 30, 100, 60),
        up_events=spread(OUTDATED, 120),
    ),
    RuleCase(
        "check 'outdated' flag for events for one behavior for down",
        100,
        5,
        1,
        1000,
        5,
        "DesiredWithinRange",
        down=rules(1000, 60, window=300),
        down_events=spread(OUTDATED, 120),
    ),
    RuleCase(
        "check that events were not marked 'outdated' for two different policies in the "
        "behavior for down",
        100,
        5,
        1,
        1000,
        5,
        "DesiredWithinRange",
        down=rules(1000, 120, 100, 60, 300),
        down_events=spread(OUTDATED, 120),
    ),
    RuleCase(
        "check that events were marked 'outdated' for two different policies in the "
        "behavior for down",
        100,
        5,
        1,
        1000,
        5,
        "DesiredWithinRange",
        down=rules(1000, 30, 100, 60, 300),
        down_events=spread(OUTDATED, 120),
    ),
]


@pytest.mark.parametrize(
    "case", RULE_CASES, ids=[f"{HZ}::TestScalingWithRules/{c.name}" for c in RULE_CASES]
)
def test_scaling_with_rules_cases(case: RuleCase) -> None:
    behavior = Behavior(
        case.up or default_scale_up_rules(), case.down or default_scale_down_rules()
    )
    state = ScalingState(
        scale_up_events=list(case.up_events), scale_down_events=list(case.down_events)
    )
    limited = limit_rate(
        state, behavior, case.min_replicas, case.max_replicas, case.current, case.desired, NOW
    )
    assert (limited.replicas, limited.reason) == (case.expected, case.reason)


def test_scale_up_and_down_limits_with_min_select_policy() -> None:
    """horizontal_test.go::TestCalculateScaleUpLimitWithScalingRules and
    TestCalculateScaleDownLimitWithBehaviors: Min selects the smaller change."""
    both = HPAScalingRules(
        300, "Min", (HPAScalingPolicy("Pods", 2, 60), HPAScalingPolicy("Percent", 50, 60))
    )
    assert scale_up_limit(ScalingState(), both, 1, NOW) == 2
    assert scale_down_limit(ScalingState(), both, 5, NOW) == 3


CONVERT_CASES = [
    ("prenormalized desired replicas within range", 5, 7, 3, 8, 7, "DesiredWithinRange"),
    ("prenormalized desired replicas < minReplicas", 3, 1, 2, 8, 2, "TooFewReplicas"),
    ("prenormalized desired zeroed replicas within range", 1, 0, 0, 10, 0, "DesiredWithinRange"),
    (
        "maxReplicas is the limit because maxReplicas < scaleUpLimit",
        20,
        1000,
        1,
        10,
        10,
        "TooManyReplicas",
    ),
    # calculateScaleUpLimit(3) = max(2 * 3, 4)
    (
        "scaleUpLimit is the limit because scaleUpLimit < maxReplicas",
        3,
        1000,
        1,
        2000,
        6,
        "ScaleUpLimit",
    ),
]


@pytest.mark.parametrize(
    ("current", "desired", "min_replicas", "max_replicas", "expected", "reason"),
    [c[1:] for c in CONVERT_CASES],
    ids=[f"{HZ}::TestConvertDesiredReplicasWithRules/{c[0]}" for c in CONVERT_CASES],
)
def test_convert_desired_replicas_without_behavior(
    current, desired, min_replicas, max_replicas, expected, reason
) -> None:
    limited = limit_rate_legacy(min_replicas, max_replicas, current, desired)
    assert (limited.replicas, limited.reason) == (expected, reason)


NORMALIZE_CASES = [
    ("empty log", [], 5, 5),
    ("stabilize", [(4, 120), (5, 60)], 3, 5),
    ("no stabilize", [(1, 120), (2, 60)], 3, 3),
    ("no stabilize - old recommendations", [(10, 600), (9, 540)], 3, 3),
    ("stabilize - old recommendations", [(10, 600), (4, 60), (5, 120), (9, 540)], 3, 5),
]


@pytest.mark.parametrize(
    ("history", "desired", "expected"),
    [c[1:] for c in NORMALIZE_CASES],
    ids=[f"{HZ}::TestNormalizeDesiredReplicas/{c[0]}" for c in NORMALIZE_CASES],
)
def test_normalize_desired_replicas_without_behavior(history, desired, expected) -> None:
    """The 5-minute scale-down window of an HPA without behavior; the log keeps nothing older
    than the window (Kubernetes overwrites one old entry in place: the same decisions)."""
    state = ScalingState(
        recommendations=[TimedRecommendation(r, NOW - age) for r, age in history], seeded=True
    )
    assert stabilize_legacy(state, 300.0, desired, NOW).replicas == expected
    assert all(r.at >= NOW - 300 for r in state.recommendations)
    assert state.recommendations[-1] == TimedRecommendation(desired, NOW)


# --- defaults_test.go: what a behavior section gets when parts are left out -----------------


def _direction(direction: str, given: dict) -> HPAScalingRules:
    spec = parse_spec(
        {
            "scaleTargetRef": {"kind": "Deployment", "name": "d"},
            "maxReplicas": 5,
            "metrics": [
                {"name": "m", "query": "q", "target": {"type": "AverageValue", "averageValue": 1}}
            ],
            "behavior": {direction: given},
        }
    )
    assert spec.behavior is not None
    return spec.behavior.scale_up if direction == "scaleUp" else spec.behavior.scale_down


def _policies(*items):
    return [{"type": t, "value": v, "periodSeconds": p} for t, v, p in items]


DEFAULT_CASES = [
    (
        f"{DF}::TestGenerateScaleDownRules/Default values",
        "scaleDown",
        {},
        [("Percent", 100, 15)],
        None,
        "Max",
    ),
    (
        f"{DF}::TestGenerateScaleDownRules/All parameters are specified",
        "scaleDown",
        {
            "policies": _policies(("Pods", 1, 2), ("Percent", 3, 4)),
            "stabilizationWindowSeconds": 25,
            "selectPolicy": "Max",
        },
        [("Pods", 1, 2), ("Percent", 3, 4)],
        25,
        "Max",
    ),
    (
        f"{DF}::TestGenerateScaleDownRules/Percent policy is specified",
        "scaleDown",
        {"policies": _policies(("Percent", 1, 2)), "selectPolicy": "Min"},
        [("Percent", 1, 2)],
        None,
        "Min",
    ),
    (
        f"{DF}::TestGenerateScaleDownRules/Pods policy is specified",
        "scaleDown",
        {"policies": _policies(("Pods", 3, 4))},
        [("Pods", 3, 4)],
        None,
        "Max",
    ),
    (
        f"{DF}::TestGenerateScaleUpRules/Default values",
        "scaleUp",
        {},
        [("Pods", 4, 15), ("Percent", 100, 15)],
        0,
        "Max",
    ),
    (
        f"{DF}::TestGenerateScaleUpRules/All parameters are specified",
        "scaleUp",
        {
            "policies": _policies(("Pods", 1, 2), ("Percent", 3, 4)),
            "stabilizationWindowSeconds": 25,
            "selectPolicy": "Max",
        },
        [("Pods", 1, 2), ("Percent", 3, 4)],
        25,
        "Max",
    ),
    (
        f"{DF}::TestGenerateScaleUpRules/Pod policy is specified",
        "scaleUp",
        {"policies": _policies(("Pods", 1, 2)), "selectPolicy": "Min"},
        [("Pods", 1, 2)],
        0,
        "Min",
    ),
    (
        f"{DF}::TestGenerateScaleUpRules/Percent policy is specified",
        "scaleUp",
        {"policies": _policies(("Percent", 7, 10))},
        [("Percent", 7, 10)],
        0,
        "Max",
    ),
    (
        f"{DF}::TestGenerateScaleUpRules/Pod policy and stabilization window are specified",
        "scaleUp",
        {"policies": _policies(("Pods", 4, 2)), "stabilizationWindowSeconds": 25},
        [("Pods", 4, 2)],
        25,
        "Max",
    ),
    (
        f"{DF}::TestGenerateScaleUpRules/Percent policy and stabilization window are specified",
        "scaleUp",
        {"policies": _policies(("Percent", 7, 60)), "stabilizationWindowSeconds": 25},
        [("Percent", 7, 60)],
        25,
        "Max",
    ),
]


@pytest.mark.parametrize(
    ("direction", "given", "policies", "window", "select"),
    [c[1:] for c in DEFAULT_CASES],
    ids=[c[0] for c in DEFAULT_CASES],
)
def test_behavior_defaults_cases(direction, given, policies, window, select) -> None:
    got = _direction(direction, given)
    assert [(p.type, p.value, p.period_seconds) for p in got.policies] == policies
    assert got.stabilization_window_seconds == window  # None: the controller's flag applies
    assert got.select_policy == select


STABILIZE_CASES = [
    # name, history (replicas, seconds ago), current, desired, expected, up window, down window
    ("empty recommendations for scaling down", [], 100, 5, 5, 0, 0),
    ("simple scale down stabilization", [(4, 120), (5, 60)], 100, 3, 5, 0, 180),
    ("simple scale up stabilization", [(4, 120), (5, 60)], 1, 7, 4, 300, 0),
    ("no scale down stabilization", [(1, 120), (2, 60)], 100, 3, 3, 300, 0),
    ("no scale up stabilization", [(4, 120), (5, 60)], 1, 3, 3, 0, 300),
    (
        "no scale down stabilization, reuse recommendation element",
        [(10, 600), (9, 540)],
        100,
        3,
        3,
        0,
        0,
    ),
    (
        "no scale up stabilization, reuse recommendation element",
        [(10, 600), (9, 540)],
        1,
        100,
        100,
        0,
        0,
    ),
    (
        "scale down stabilization, reuse one of obsolete recommendation element",
        [(10, 600), (4, 60), (5, 120), (9, 540)],
        100,
        3,
        5,
        0,
        180,
    ),
    (
        "scale up stabilization, reuse one of obsolete recommendation element",
        [(10, 6000), (6, 60), (5, 120), (9, 180)],
        1,
        100,
        5,
        300,
        0,
    ),
    (
        "scale up and down stabilization, do not scale up when prenormalized rec goes down",
        [(2, 6000), (3, 180)],
        2,
        1,
        2,
        300,
        300,
    ),
    (
        "scale up and down stabilization, do not scale down when prenormalized rec goes up",
        [(2, 6000), (1, 180)],
        2,
        3,
        2,
        300,
        300,
    ),
]


@pytest.mark.parametrize(
    ("history", "current", "desired", "expected", "up_window", "down_window"),
    [c[1:] for c in STABILIZE_CASES],
    ids=[f"{HZ}::TestNormalizeDesiredReplicasWithBehavior/{c[0]}" for c in STABILIZE_CASES],
)
def test_stabilization_with_behavior_cases(
    history, current, desired, expected, up_window, down_window
) -> None:
    behavior = Behavior(
        HPAScalingRules(up_window, "Max", default_scale_up_rules().policies),
        HPAScalingRules(down_window, "Max", default_scale_down_rules().policies),
    )
    state = ScalingState(
        recommendations=[TimedRecommendation(r, NOW - age) for r, age in history], seeded=True
    )
    assert stabilize(state, behavior, current, desired, NOW).replicas == expected
