"""The chart's batch inference job: an Indexed Job of `autoglm job run`, off by default."""

from __future__ import annotations

import json
from typing import Any

import kubernetes_validate
import pytest
import yaml

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
        ("job.endpointAuth.username=a:b", "at '/job/endpointAuth/username'"),
        ("job.endpointAuth.password=secret", "additional properties 'password' not allowed"),
        ("job.webConfig.config.rate_limit.burst=1", "at '/job/webConfig/config'"),
    ],
)
def test_schema_rejects_bad_job_values(flag: str, message: str) -> None:
    stderr = render_failure("--set", flag)
    assert "values don't meet the specifications of the schema" in stderr
    assert message in stderr


# --- credentials toward the batcher, and the job's own /metrics behind a web config --------

BCRYPT = "$2y$10$Y8bxkraO9eohc855OubO1e5vdVNt4JiSACI21myLen.eap9FzqVTS"
TLS_FILES = {"cert_file": "/etc/autoglm/tls/tls.crt", "key_file": "/etc/autoglm/tls/tls.key"}
BATCHER_TLS = (
    "batcher.webConfig.enabled=true",
    "batcher.webConfig.tlsSecret=batcher-tls",
    f"batcher.webConfig.config.tls_server_config.cert_file={TLS_FILES['cert_file']}",
    f"batcher.webConfig.config.tls_server_config.key_file={TLS_FILES['key_file']}",
)
PASSWORD = ("job.endpointAuth.username=job", "job.endpointAuth.passwordSecret=job-auth")


def mounted_files(job: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    """Path in the container -> (Secret or ConfigMap, its name, its key), for the projected
    files of the container's mounts."""
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    files = {}
    for mount in container(job)["volumeMounts"]:
        for source in volumes[mount["name"]].get("projected", {}).get("sources", []):
            ((kind, ref),) = source.items()
            for item in ref["items"]:
                path = f"{mount['mountPath']}/{item['path']}"
                files[path] = (kind, ref["name"], item["key"])
    return files


def test_the_client_credentials_reach_the_runner_as_its_flags() -> None:
    job = one(
        job_objects(
            "batcher.enabled=false",
            "job.endpoint=https://fleet.ml.svc:8443",
            *PASSWORD,
            "job.endpointAuth.passwordKey=pw",
            "job.endpointAuth.caConfigMap=fleet-ca",
            "job.endpointAuth.caKey=bundle.pem",
            "job.endpointAuth.clientCertSecret=job-client",
        ),
        "Job",
    )
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(job, version, strict=True)
    config = load_config(JobConfig, container(job)["args"], prog="autoglm job run")
    assert config.endpoint == "https://fleet.ml.svc:8443"
    assert config.username == "job"
    files = mounted_files(job)
    assert files[config.password_file] == ("secret", "job-auth", "pw")
    assert files[config.ca_file] == ("configMap", "fleet-ca", "bundle.pem")
    assert files[config.cert_file] == ("secret", "job-client", "tls.crt")
    assert files[config.key_file] == ("secret", "job-client", "tls.key")
    assert len(files) == 4
    (mount,) = [m for m in container(job)["volumeMounts"] if m["name"] == "endpoint-auth"]
    assert mount["readOnly"] is True and "subPath" not in mount  # a rotated Secret reaches it


def test_without_credentials_the_job_sends_plain_http_and_mounts_nothing() -> None:
    job = one(job_objects(), "Job")
    config = load_config(JobConfig, container(job)["args"], prog="autoglm job run")
    assert config.endpoint.startswith("http://")
    assert not (config.username or config.password_file or config.ca_file or config.cert_file)
    assert not mounted_files(job)
    assert not config.web_config_file


def test_toward_the_releases_batcher_with_tls_the_job_uses_https_and_its_ca_only() -> None:
    """The batcher's tlsSecret holds its private key: only ca.crt is projected to the job."""
    objects = render(sets=(*JOB, *BATCHER_TLS, *PASSWORD))
    job = one(objects, "Job")
    config = load_config(JobConfig, container(job)["args"], prog="autoglm job run")
    service = one(objects, "Service", "-batcher")["metadata"]["name"]
    assert config.endpoint == f"https://{service}.{NAMESPACE}.svc:8000"
    assert mounted_files(job)[config.ca_file] == ("secret", "batcher-tls", "ca.crt")
    assert ("secret", "batcher-tls", "tls.key") not in mounted_files(job).values()
    # A CA of the user's wins over the batcher's.
    job = one(render(sets=(*JOB, *BATCHER_TLS, *PASSWORD, "job.endpointAuth.caSecret=ca")), "Job")
    config = load_config(JobConfig, container(job)["args"], prog="autoglm job run")
    assert mounted_files(job)[config.ca_file] == ("secret", "ca", "ca.crt")
    # The chart cannot read an existingSecret: webConfig.tls says it serves TLS.
    job = one(
        render(
            sets=(
                *JOB,
                "batcher.webConfig.enabled=true",
                "batcher.webConfig.existingSecret=batcher-web",
                "batcher.webConfig.tls=true",
            )
        ),
        "Job",
    )
    config = load_config(JobConfig, container(job)["args"], prog="autoglm job run")
    assert config.endpoint.startswith("https://") and not config.ca_file  # the system CAs


def test_the_jobs_metrics_web_config_is_mounted_passed_and_scraped_over_https() -> None:
    tls = (
        "job.webConfig.enabled=true",
        "job.webConfig.tlsSecret=job-tls",
        f"job.webConfig.config.tls_server_config.cert_file={TLS_FILES['cert_file']}",
        f"job.webConfig.config.tls_server_config.key_file={TLS_FILES['key_file']}",
        f"job.webConfig.config.basic_auth_users.prometheus={BCRYPT}",
    )
    objects = job_objects(*tls, monitoring_api=True)
    job = one(objects, "Job")
    config = load_config(JobConfig, container(job)["args"], prog="autoglm job run")
    assert config.web_config_file == "/etc/autoglm/web/web-config.yml"
    secret = one(objects, "Secret", "-job-web-config")
    web_config = yaml.safe_load(secret["stringData"]["web-config.yml"])
    assert web_config["tls_server_config"] == TLS_FILES
    pod = job["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m for m in container(job)["volumeMounts"]}
    assert (
        volumes[mounts["/etc/autoglm/web"]["name"]]["secret"]["secretName"]
        == (secret["metadata"]["name"])
    )
    assert volumes[mounts["/etc/autoglm/tls"]["name"]]["secret"]["secretName"] == "job-tls"
    assert mounts["/etc/autoglm/web"]["readOnly"] and mounts["/etc/autoglm/tls"]["readOnly"]

    monitor = one(objects, "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"] == {
        "serverName": f"{job['metadata']['name']}.{NAMESPACE}.svc",
        "ca": {"secret": {"name": "job-tls", "key": "ca.crt"}},
    }
    # The user's endpoint fields are merged (basic auth) or replace the chart's (tlsConfig).
    auth = {"username": {"name": "scrape", "key": "u"}, "password": {"name": "scrape", "key": "p"}}
    mine = {"serverName": "job.example", "insecureSkipVerify": False}
    objects = render(
        sets=(*JOB, *tls),
        monitoring_api=True,
        extra=(
            "--set-json",
            f"job.podMonitor.endpoint={json.dumps({'basicAuth': auth, 'tlsConfig': mine})}",
        ),
    )
    monitor = one(objects, "PodMonitor")
    model = prometheus_operator().PodMonitor.model_validate(monitor)
    dumped = model.model_dump(by_alias=True, exclude_unset=True, exclude_none=True, mode="json")
    assert dumped == monitor, "the PodMonitor has fields the operator does not know"
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["basicAuth"] == auth and endpoint["tlsConfig"] == mine
    assert endpoint["scheme"] == "https" and endpoint["port"] == "metrics"


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("job.endpointAuth.username=job",), "basic auth needs both username and passwordSecret"),
        (
            ("job.endpointAuth.passwordSecret=auth",),
            "basic auth needs both username and passwordSecret",
        ),
        (
            ("job.endpointAuth.caSecret=ca",),
            "but the job sends to http://gpu-open-autoglm-batcher.autoglm.svc:8000",
        ),
        (
            ("job.endpointAuth.clientCertSecret=me", "job.endpoint=http://fleet:8000"),
            "use an https:// job.endpoint",
        ),
        (
            (*BATCHER_TLS, "job.endpointAuth.caSecret=a", "job.endpointAuth.caConfigMap=b"),
            "set either caSecret or caConfigMap, not both",
        ),
        (
            (f"batcher.webConfig.config.basic_auth_users.job={BCRYPT}", *BATCHER_TLS),
            "sets basic_auth_users but job.endpointAuth.username is empty",
        ),
        (
            (
                *BATCHER_TLS,
                "batcher.webConfig.config.tls_server_config.client_auth_type="
                "RequireAndVerifyClientCert",
            ),
            "job.endpointAuth.clientCertSecret is empty",
        ),
        (
            ("job.webConfig.enabled=true",),
            "job.webConfig.enabled is true but there is no web config",
        ),
    ],
)
def test_credentials_the_runner_or_the_batcher_would_refuse_fail_with_the_fix(
    flags: tuple[str, ...], message: str
) -> None:
    args: list[str] = []
    for flag in (*JOB, *flags):
        args += ["--set", flag]
    assert message in render_failure(*args)


def test_a_batcher_that_asks_credentials_of_another_endpoint_is_not_checked() -> None:
    """The checks read only this release's batcher: the job may send elsewhere."""
    job = one(
        job_objects(
            f"batcher.webConfig.config.basic_auth_users.job={BCRYPT}",
            *BATCHER_TLS,
            "job.endpoint=http://other.ml.svc:8000",
        ),
        "Job",
    )
    assert "--endpoint=http://other.ml.svc:8000" in container(job)["args"]
