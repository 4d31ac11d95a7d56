"""The chart's batch inference job: an Indexed Job of `autoglm job run`, off by default."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from autoglm.config import load_config
from jobs.config import JobConfig
from tests.helm.chart import (
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    helm,
    of_kind,
    one,
    prometheus_operator,
    render,
    render_failure,
)

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]

JOB = (
    "job.enabled=true",
    "batcher.enabled=true",
    "job.input.configMap=requests",
    "job.output.persistentVolumeClaim=answers",
    "job.completions=4",
    "job.parallelism=2",
)


def job_objects(*sets: str, monitoring_api: bool = False) -> list[dict[str, Any]]:
    return [
        o
        for o in render(sets=(*JOB, *sets), monitoring_api=monitoring_api)
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "job"
    ]


def container(job: dict[str, Any]) -> dict[str, Any]:
    (only,) = job["spec"]["template"]["spec"]["containers"]
    return only


def test_off_by_default() -> None:
    objects = render(monitoring_api=True)
    assert not of_kind(objects, "Job") and not of_kind(objects, "PodMonitor")


def test_an_indexed_job_valid_for_every_supported_kubernetes() -> None:
    job = one(job_objects(), "Job")
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert (spec["completions"], spec["parallelism"]) == (4, 2)
    assert spec["template"]["spec"]["restartPolicy"] == "Never"
    rules = spec["podFailurePolicy"]["rules"]
    assert {
        "action": "Ignore",
        "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}],
    } in rules
    assert any(r["action"] == "FailJob" and r["onExitCodes"]["values"] == [2] for r in rules)


def test_the_pods_are_non_root_read_only_and_bounded() -> None:
    job = one(job_objects(), "Job")
    pod = job["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    c = container(job)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["resources"]["limits"] and c["resources"]["requests"]
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert mounts["/input"]["readOnly"] is True and "/output" in mounts and "/tmp" in mounts


def test_the_runner_accepts_the_arguments_the_chart_passes() -> None:
    objects = render(sets=JOB)
    c = container(one(objects, "Job"))
    assert c["command"] == ["autoglm-job", "run"]
    config = load_config(JobConfig, c["args"], prog="autoglm job run")
    assert config.shard_count == 4 and config.shard_index == -1  # from JOB_COMPLETION_INDEX
    assert config.input == "/input/requests.jsonl" and config.output == "/output/answers.jsonl"
    assert config.metrics_listen == ":9500" and not config.fail_on_invalid
    service = one(objects, "Service", "-batcher")
    host = f"{service['metadata']['name']}.{NAMESPACE}.svc"
    assert config.endpoint == f"http://{host}:{service['spec']['ports'][0]['port']}"
    (port,) = c["ports"]
    assert port["containerPort"] == 9500 and port["name"] == "metrics"


def test_input_from_a_claim_or_a_config_map() -> None:
    pod = one(job_objects(), "Job")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["input"] == {"name": "input", "configMap": {"name": "requests"}}
    assert volumes["output"]["persistentVolumeClaim"] == {"claimName": "answers"}
    pod = one(job_objects("job.input.configMap=", "job.input.persistentVolumeClaim=corpus"), "Job")[
        "spec"
    ]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["input"]["persistentVolumeClaim"] == {"claimName": "corpus", "readOnly": True}


def test_an_explicit_endpoint_needs_no_batcher_in_the_release() -> None:
    job = one(
        job_objects("batcher.enabled=false", "job.endpoint=https://fleet.ml.svc:8443/"), "Job"
    )
    assert "--endpoint=https://fleet.ml.svc:8443" in container(job)["args"]


def test_a_pod_monitor_scrapes_the_pods_when_prometheus_operator_is_there() -> None:
    assert not of_kind(job_objects(), "PodMonitor")
    monitor = one(job_objects(monitoring_api=True), "PodMonitor")
    model = prometheus_operator().PodMonitor.model_validate(monitor)
    dumped = model.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")
    assert dumped == monitor, "the PodMonitor has fields the operator does not know"
    assert monitor["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert monitor["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    pod_labels = one(job_objects(), "Job")["spec"]["template"]["metadata"]["labels"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= pod_labels.items()


def test_network_policy_lets_only_prometheus_reach_the_metrics() -> None:
    policy = one(job_objects("networkPolicy.enabled=true"), "NetworkPolicy")
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(policy, version, strict=True)
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 9500, "protocol": "TCP"}]
    assert rule["from"][0]["namespaceSelector"]


def test_helm_lint_strict_with_the_job() -> None:
    args = ["lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for flag in JOB:
        args += ["--set", flag]
    result = helm(*args, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("job.input.persistentVolumeClaim=corpus",), "set exactly one of persistentVolumeClaim"),
        (("job.input.configMap=",), "set exactly one of persistentVolumeClaim"),
        (("job.output.persistentVolumeClaim=",), "job.output.persistentVolumeClaim is required"),
        (("batcher.enabled=false",), "job.endpoint is empty and batcher.enabled is false"),
        (("job.parallelism=5",), "job.parallelism 5 is more than job.completions 4"),
    ],
)
def test_inconsistent_job_values_fail_with_the_fix(flags: tuple[str, ...], message: str) -> None:
    args: list[str] = []
    for flag in (*JOB, *flags):
        args += ["--set", flag]
    assert message in render_failure(*args)


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("job.order=random", "at '/job/order': value must be one of"),
        ("job.name=Nightly_Run", "at '/job/name'"),
        ("job.endpoint=batcher:8000", "at '/job/endpoint'"),
        ("job.completions=0", "at '/job/completions'"),
        ("job.input.path=/abs/requests.jsonl", "at '/job/input/path'"),
        ("job.resources=null", "at '/job': missing property 'resources'"),
    ],
)
def test_schema_rejects_bad_job_values(flag: str, message: str) -> None:
    stderr = render_failure("--set", flag)
    assert "values don't meet the specifications of the schema" in stderr
    assert message in stderr
