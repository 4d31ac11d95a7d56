"""The chart's containers run: their commands exist, their arguments parse, the `helm test`
pod passes against the exporter the chart starts, the job gets its answers from the batcher
the chart starts behind TLS and basic auth, and the autoscaler works with exactly the RBAC the
chart grants.

Commands and arguments are taken from the rendered manifests and run as they would in the pod,
with only what a cluster provides swapped for local stand-ins: listen addresses on 127.0.0.1,
mounted files written to a temp folder, the API server and Prometheus replaced by the fakes the
autoscaler's own tests use (they speak the real HTTP APIs, driven by the real clients).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import bcrypt
import pytest
import requests
import yaml

from autoglm.config import ConfigError, add_config_arguments, config_from_args
from autoscaler.config import AutoscalerConfig
from batcher.config import BatcherConfig
from exporter.config import ExporterConfig
from jobs.config import JobConfig
from predictor.config import PredictorConfig
from tests.autoscaler.fake_kube import FakeKubeServer
from tests.autoscaler.fake_prometheus import FakePrometheus
from tests.exporter.processes import ExporterProcess
from tests.helm.chart import CHART, NAMESPACE, ROOT, ci_values_files, one, pod_spec, render
from tests.live import LiveProcess, free_port
from tests.selfsigned import ScratchCA
from tests.waiting import wait_until

pytestmark = [pytest.mark.live, pytest.mark.timeout(180)]

SCRIPTS = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
# command in the manifest -> (sub-command the CLI takes first, settings class of its flags)
CLIS: dict[str, tuple[str | None, type]] = {
    "autoglm-exporter": (None, ExporterConfig),
    "autoglm-predictor": ("serve", PredictorConfig),
    "autoglm-autoscaler": ("run", AutoscalerConfig),
    "autoglm-batcher": (None, BatcherConfig),
    "autoglm-job": ("run", JobConfig),
}


def _containers(objects: list[dict]) -> list[tuple[dict, dict]]:
    return [
        (obj, c)
        for obj in objects
        if obj["kind"] in ("Deployment", "DaemonSet", "Job")
        for c in pod_spec(obj)["containers"]
    ]


def _expand(arg: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion of container args."""
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), arg)


def _rendered_data(objects: list[dict], kind: str, name: str) -> dict[str, str] | None:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found[0]["stringData" if kind == "Secret" else "data"] if found else None


def _mounted_files(
    objects: list[dict],
    obj: dict,
    container: dict,
    folder: Path,
    yours: dict[str, dict[str, str]] | None = None,
) -> dict[str, str]:
    """Write the ConfigMaps/Secrets the container mounts, as the kubelet would; returns mount
    path -> local folder. ``yours``: the ConfigMaps and Secrets the user made (name -> data),
    which the chart only names (one not given is left out); a projected volume takes each item's
    key from them. A claim
    becomes an empty folder; other volumes are left out."""
    yours = yours or {}
    volumes = {v["name"]: v for v in pod_spec(obj).get("volumes", [])}
    rewrites = {}
    for mount in container.get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            name = volume["configMap"]["name"]
            data = _rendered_data(objects, "ConfigMap", name) or yours.get(name)
        elif "secret" in volume:
            name = volume["secret"]["secretName"]
            data = _rendered_data(objects, "Secret", name) or yours.get(name)
        elif "projected" in volume:
            data = {}
            for source in volume["projected"]["sources"]:
                ((_, ref),) = source.items()
                given = yours.get(ref["name"], {})
                data |= {i["path"]: given[i["key"]] for i in ref["items"] if i["key"] in given}
        elif "persistentVolumeClaim" in volume:
            data = {}
        else:
            continue
        if data is None:
            continue
        local = folder / mount["name"]
        local.mkdir(parents=True, exist_ok=True)
        for key, text in data.items():
            (local / key).write_text(text)
        rewrites[mount["mountPath"]] = str(local)
    return rewrites


def _local_args(args: list[str], rewrites: dict[str, str]) -> list[str]:
    out = []
    for arg in args:
        for mount_path, local in rewrites.items():
            arg = arg.replace(mount_path + "/", local + "/")
        out.append(arg)
    return out


VALUES_CASES = [pytest.param([], id="default")] + [
    pytest.param([p], id=p.name) for p in ci_values_files()
]


@pytest.mark.parametrize("values", VALUES_CASES)
def test_every_container_command_is_a_console_script_whose_flags_parse(values, tmp_path):
    objects = render(values=values, monitoring_api=True)
    seen = set()
    for obj, container in _containers(objects):
        command = container["command"]
        assert command[0] in SCRIPTS, f"{command[0]} is not a console script in pyproject.toml"
        subcommand, settings = CLIS[command[0]]
        rest = command[1:]
        if subcommand:
            assert rest[:1] == [subcommand], command
            rest = rest[1:]
        env = {e["name"]: "pod-0" for e in container.get("env", []) if "valueFrom" in e}
        rewrites = _mounted_files(objects, obj, container, tmp_path / obj["metadata"]["name"])
        args = _local_args([_expand(a, env) for a in rest + container.get("args", [])], rewrites)
        parser = argparse.ArgumentParser(exit_on_error=False)
        add_config_arguments(parser, settings)
        try:
            config_from_args(settings, parser.parse_args(args))
        except (ConfigError, argparse.ArgumentError, SystemExit) as exc:
            pytest.fail(f"{obj['metadata']['name']}: {command} {args} does not parse: {exc}")
        seen.add(command[0])
    assert "autoglm-exporter" in seen


# --- helm test against the exporter the chart runs ------------------------------------------


def _test_pod_run(objects: list[dict], url: str) -> subprocess.CompletedProcess[str]:
    """Run the `helm test` pod's script here, with the exporter's Service URL pointed at ``url``."""
    (container,) = pod_spec(one(objects, "Pod"))["containers"]
    assert container["command"] == ["python", "-c"]
    env = {e["name"]: e["value"] for e in container["env"]}
    scheme = env["EXPORTER_URL"].split("://")[0]
    env["EXPORTER_URL"] = f"{scheme}://{url}"
    return subprocess.run(
        [sys.executable, "-c", *container["args"]],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def _start_charts_exporter(objects: list[dict], folder: Path) -> ExporterProcess:
    daemonset = one(objects, "DaemonSet")
    (container,) = pod_spec(daemonset)["containers"]
    assert container["command"] == ["autoglm-exporter"]
    assert SCRIPTS["autoglm-exporter"] == "exporter.cli:main"  # what ExporterProcess runs
    rewrites = _mounted_files(objects, daemonset, container, folder)
    return ExporterProcess(_local_args(container["args"], rewrites))


def test_helm_test_pod_passes_against_the_charts_exporter(tmp_path):
    objects = render(values=[CHART / "ci" / "exporter-nonroot-values.yaml"])
    exporter = _start_charts_exporter(objects, tmp_path)
    try:
        wait_until(
            lambda: requests.get(exporter.url + "/readyz", timeout=2).status_code == 200,
            timeout=20,
            what="exporter ready",
        )
        result = _test_pod_run(objects, exporter.address)
        served = requests.get(exporter.url + "/metrics", timeout=10).text
    finally:
        exporter.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    assert "exporter health series present: True" in result.stdout
    # The values' counters file reached the exporter: its fields only.
    assert "DCGM_FI_DEV_FB_USED{" in served
    assert "DCGM_FI_DEV_POWER_USAGE" not in served
    # and the check fails when nothing answers
    failed = _test_pod_run(objects, exporter.address)
    assert failed.returncode != 0


def test_helm_test_pod_passes_against_an_exporter_behind_tls_and_basic_auth(tmp_path):
    ca = ScratchCA(tmp_path)
    server = ca.server()
    password_hash = bcrypt.hashpw(b"scrape-secret", bcrypt.gensalt(4)).decode()
    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "exporter": {
                    "source": "simulated",
                    "podResources": {"enabled": False},
                    "webConfig": {
                        "enabled": True,
                        "tls": True,
                        "config": {
                            "tls_server_config": {
                                "cert_file": str(server.cert),
                                "key_file": str(server.key),
                            },
                            "basic_auth_users": {"prometheus": password_hash},
                        },
                    },
                }
            }
        )
    )
    objects = render(values=[values])
    exporter = _start_charts_exporter(objects, tmp_path / "mounts")
    try:
        https = f"https://{exporter.address}"
        wait_until(
            lambda: (
                requests.get(https + "/readyz", verify=str(ca.cert_file), timeout=2).status_code
                == 200
            ),
            timeout=20,
            what="exporter ready over TLS",
        )
        assert (
            requests.get(https + "/metrics", verify=str(ca.cert_file), timeout=5).status_code == 401
        )
        result = _test_pod_run(objects, exporter.address)
    finally:
        exporter.stop()
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"GET {https}/healthz -> 200" in result.stdout


# --- the job against the batcher, both behind TLS and basic auth -----------------------------

FEATURES = 16  # the demo model's input width
# The console scripts' entry points (pyproject.toml), run by this interpreter.
BATCHER_MAIN = "import sys; from batcher.cli import main; sys.exit(main())"
JOB_MAIN = "import sys; from jobs.cli import main; sys.exit(main())"


def _secure_batcher_and_job(tmp_path: Path, ca: ScratchCA, password_hash: str) -> Path:
    """Values of a batcher behind TLS and basic auth and of a job sending to it, with a web
    config of its own on its metrics; certificates on local paths (the pods' would be in
    tlsSecret), the CA in the batcher's tlsSecret as cert-manager writes it."""
    batcher_cert = ca.issue("batcher", dns=["localhost"], ips=["127.0.0.1"], client=False)
    job_cert = ca.issue("job", dns=["localhost"], ips=["127.0.0.1"], client=False)

    def web_config(cert, users: dict[str, str]) -> dict:
        tls = {"cert_file": str(cert.cert), "key_file": str(cert.key)}
        return {
            "enabled": True,
            "tlsSecret": f"{cert.cert.stem}-tls",
            "config": {"tls_server_config": tls, "basic_auth_users": users},
        }

    values = tmp_path / "values.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "batcher": {
                    "enabled": True,
                    "webConfig": web_config(batcher_cert, {"job": password_hash}),
                },
                "job": {
                    "enabled": True,
                    "input": {"configMap": "requests"},
                    "output": {"persistentVolumeClaim": "answers"},
                    "endpointAuth": {"username": "job", "passwordSecret": "job-auth"},
                    "webConfig": web_config(job_cert, {"prometheus": password_hash}),
                },
            }
        )
    )
    return values


def test_the_charts_job_gets_its_answers_from_the_charts_batcher_behind_tls_and_basic_auth(
    tmp_path,
):
    """What the chart renders works together: the batcher serves its web config, asks
    credentials on every path but the health ones its probes ask, and the job finds the
    https endpoint, the password and the batcher's CA where the chart mounts them."""
    ca = ScratchCA(tmp_path)
    password_hash = bcrypt.hashpw(b"job-secret", bcrypt.gensalt(4)).decode()
    objects = render(values=[_secure_batcher_and_job(tmp_path, ca, password_hash)])
    ca_pem = ca.cert_file.read_text()
    rows = [[round(0.01 * (i + j), 3) for j in range(FEATURES)] for i in range(12)]
    lines = [
        json.dumps(
            {
                "id": f"r{i}",
                "inputs": [
                    {"name": "input", "shape": [1, FEATURES], "datatype": "FP32", "data": row}
                ],
            }
        )
        for i, row in enumerate(rows)
    ]
    yours = {
        # what cert-manager and the user put in the Secrets and the ConfigMap the chart names
        "batcher-tls": {"ca.crt": ca_pem, "tls.crt": "unused", "tls.key": "never projected"},
        "job-tls": {"ca.crt": ca_pem},
        "job-auth": {"password": "job-secret\n"},
        "requests": {"requests.jsonl": "\n".join(lines) + "\n"},
    }

    deployment = one(objects, "Deployment", "-batcher")
    (batcher,) = pod_spec(deployment)["containers"]
    assert batcher["command"] == ["autoglm-batcher"]
    assert SCRIPTS["autoglm-batcher"] == "batcher.cli:main"
    port = free_port()
    rewrites = _mounted_files(objects, deployment, batcher, tmp_path / "batcher", yours)
    args = [
        f"--listen=127.0.0.1:{port}" if a.startswith("--listen=") else a
        for a in _local_args(batcher["args"], rewrites)
    ]
    url = f"https://localhost:{port}"
    server = LiveProcess(
        [sys.executable, "-c", BATCHER_MAIN, *args],
        ready_url=url + "/v2/health/ready",
        log_path=tmp_path / "batcher.log",
        request_options={"verify": str(ca.cert_file), "auth": ("job", "job-secret")},
    )
    server.start(ready_timeout=90)
    try:
        # The kubelet has no credentials: what the probes ask answers without them, and
        # nothing else does.
        for probe in ("startupProbe", "livenessProbe", "readinessProbe"):
            asked = batcher[probe]["httpGet"]
            assert asked["scheme"] == "HTTPS", probe
            anonymous = requests.get(url + asked["path"], verify=str(ca.cert_file), timeout=5)
            assert anonymous.status_code == 200, probe
        assert requests.get(url + "/v2", verify=str(ca.cert_file), timeout=5).status_code == 401

        job = one(objects, "Job")
        (runner,) = pod_spec(job)["containers"]
        assert runner["command"] == ["autoglm-job", "run"]
        assert SCRIPTS["autoglm-job"] == "jobs.cli:main"
        service = one(objects, "Service", "-batcher")["metadata"]["name"]
        endpoint = f"--endpoint=https://{service}.{NAMESPACE}.svc:8000"
        assert endpoint in runner["args"]
        rewrites = _mounted_files(objects, job, runner, tmp_path / "job", yours)
        metrics_port = free_port()
        args = []
        for arg in _local_args(runner["args"], rewrites):
            if arg == endpoint:
                arg = f"--endpoint={url}"
            elif arg.startswith("--metrics-listen="):
                arg = f"--metrics-listen=127.0.0.1:{metrics_port}"
            args.append(arg)
        run = subprocess.run(
            [sys.executable, "-c", JOB_MAIN, "run", *args],
            env={**os.environ, "JOB_COMPLETION_INDEX": "0"},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        server.stop()
    assert run.returncode == 0, run.stdout + run.stderr
    answers = (Path(rewrites["/output"]) / "answers.jsonl").read_text().splitlines()
    assert len(answers) == len(lines)
    assert all(json.loads(a)["outputs"] for a in answers)
    ca_file = Path(rewrites["/etc/autoglm/endpoint"]) / "ca.crt"
    assert ca_file.read_text() == ca_pem  # only ca.crt of the batcher's TLS Secret
    assert sorted(p.name for p in ca_file.parent.iterdir()) == ["ca.crt", "password"]


# --- the autoscaler with exactly the chart's RBAC -------------------------------------------

WATCHED = "ml"
UTIL = 'avg by (pod) (DCGM_FI_DEV_GPU_UTIL{namespace="ml"})'
PATH = re.compile(
    r"^/(?:api/(?P<core>v1)|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
    r"/namespaces/(?P<ns>[^/]+)/(?P<resource>[^/]+)(?:/(?P<name>[^/]+)(?:/(?P<sub>[^/]+))?)?$"
)
VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}


def _attributes(method: str, path: str, query: dict[str, list[str]]) -> tuple[str, ...]:
    """(namespace, apiGroup, resource[/subresource], verb, name) of a request, as RBAC sees it."""
    m = PATH.match(path)
    assert m, f"request outside a namespace: {method} {path}"
    resource = m["resource"] + (f"/{m['sub']}" if m["sub"] else "")
    if method == "GET":
        verb = "get" if m["name"] else ("watch" if query.get("watch") else "list")
    else:
        verb = VERBS[method]
    return (m["ns"], m["group"] or "", resource, verb, m["name"] or "")


def _grants(objects: list[dict], service_account: str) -> set[tuple[str, ...]]:
    """(namespace, apiGroup, resource, verb, resourceName or "") the ServiceAccount is granted."""
    roles = {
        (r["metadata"]["namespace"], r["metadata"]["name"]): r
        for r in objects
        if r["kind"] == "Role"
    }
    assert not [o for o in objects if o["kind"] in ("ClusterRole", "ClusterRoleBinding")]
    grants = set()
    for binding in (o for o in objects if o["kind"] == "RoleBinding"):
        subjects = binding["subjects"]
        if {
            "kind": "ServiceAccount",
            "name": service_account,
            "namespace": NAMESPACE,
        } not in subjects:
            continue
        ns = binding["metadata"]["namespace"]
        for rule in roles[(ns, binding["roleRef"]["name"])]["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        for name in rule.get("resourceNames") or [""]:
                            grants.add((ns, group, resource, verb, name))
    return grants


def _allowed(request: tuple[str, ...], grants: set[tuple[str, ...]]) -> tuple[str, ...] | None:
    ns, group, resource, verb, name = request
    for grant in ((ns, group, resource, verb, ""), (ns, group, resource, verb, name)):
        if grant in grants and (grant[4] == "" or name):
            return grant
    return None


def _gpu_autoscaler(name: str, kind: str) -> dict[str, Any]:
    return {
        "apiVersion": "autoscaling.autoglm.io/v1alpha1",
        "kind": "GPUAutoscaler",
        "metadata": {"name": name, "namespace": WATCHED},
        "spec": {
            "scaleTargetRef": {"apiVersion": "apps/v1", "kind": kind, "name": name},
            "minReplicas": 1,
            "maxReplicas": 10,
            "metrics": [
                {
                    "name": "gpu_util",
                    "type": "Pods",
                    "query": UTIL,
                    "target": {"type": "Utilization", "averageUtilization": 70},
                }
            ],
        },
    }


def _run_charts_autoscaler(objects, kube: FakeKubeServer, prom: FakePrometheus, tmp_path, done):
    """Start the chart's autoscaler container command here until ``done()``, then SIGTERM it."""
    deployment = one(objects, "Deployment", "-autoscaler")
    (container,) = pod_spec(deployment)["containers"]
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
                "users": [{"name": "sa", "user": {"token": "service-account-token"}}],
                "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "sa"}}],
                "current-context": "fake",
            }
        )
    )
    env = {"POD_NAME": "autoscaler-0"}
    args = [_expand(a, env) for a in container["command"][1:] + container["args"]]
    args = [a for a in args if not a.startswith(("--prometheus-url=", "--listen="))]
    args += [
        f"--prometheus-url={prom.url}",
        f"--listen=127.0.0.1:{free_port()}",
        f"--kubeconfig={kubeconfig}",
        "--log-format=text",
    ]
    module, function = SCRIPTS[container["command"][0]].split(":")
    code = f"import sys; from {module} import {function}; sys.exit({function}(sys.argv[1:]))"
    process = subprocess.Popen(
        [sys.executable, "-c", code, *args],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        wait_until(lambda: done() or process.poll() is not None, timeout=60, what="autoscaler")
        assert process.poll() is None, process.stdout.read().decode()
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            output = process.communicate(timeout=20)[0].decode()
        except subprocess.TimeoutExpired:
            process.kill()
            output = process.communicate()[0].decode()
    assert process.returncode == 0, output


def _scenario(kube: FakeKubeServer, prom: FakePrometheus) -> None:
    fake = kube.fake
    for name, resource, kind in (
        ("llm", "deployments", "Deployment"),
        ("cache", "statefulsets", "StatefulSet"),
    ):
        labels = {"app": name}
        fake.add_workload(WATCHED, name, 2, labels, resource=resource)
        for i in range(2):
            fake.add_pod(WATCHED, f"{name}-{i}", labels)
        fake.add_custom("gpuautoscalers", _gpu_autoscaler(name, kind))
    # a budget large enough to change nothing, so that its reads and writes are exercised
    fake.add_custom(
        "gpubudgets",
        {
            "apiVersion": "autoscaling.autoglm.io/v1alpha1",
            "kind": "GPUBudget",
            "metadata": {"name": "team", "namespace": WATCHED},
            "spec": {"resources": {"nvidia.com/gpu": 100}, "selector": {"matchLabels": {}}},
        },
    )
    prom.set_pods(UTIL, {f"{n}-{i}": 140.0 for n in ("llm", "cache") for i in range(2)})


@pytest.mark.timeout(240)
def test_autoscaler_rbac_is_exactly_what_the_controller_uses(tmp_path):
    fast = ("--set-json", "autoscaler.interval=0.2")
    objects = render(sets=(f"autoscaler.watchNamespace={WATCHED}",), extra=fast)
    by_name = render(
        sets=(f"autoscaler.watchNamespace={WATCHED}", "autoscaler.extraArgs[0]=--name=llm"),
        extra=fast,
    )
    service_account = one(objects, "ServiceAccount")["metadata"]["name"]
    assert (
        one(objects, "Deployment", "-autoscaler")["spec"]["template"]["spec"]["serviceAccountName"]
        == service_account
    )
    grants = _grants(objects, service_account)

    kube, prom = FakeKubeServer().start(), FakePrometheus()
    try:
        _scenario(kube, prom)
        fake = kube.fake

        scaled_back = []

        def scaled_and_renewed() -> bool:
            lease_renewals = [
                r for r in fake.requests if r.method == "PUT" and "/leases/" in r.path
            ]
            scaled = (
                fake.replicas(WATCHED, "llm") == 4
                and fake.replicas(WATCHED, "cache", "statefulsets") == 4
                and len(fake.events(WATCHED)) >= 2
                and bool(lease_renewals)
            )
            if scaled and not scaled_back:
                # scaled back by someone: the same rescale again is counted on its first Event
                fake.set_replicas(WATCHED, "llm", 2)
                scaled_back.append(True)
                return False
            return scaled and any(e.get("count", 1) > 1 for e in fake.events(WATCHED))

        _run_charts_autoscaler(objects, kube, prom, tmp_path, scaled_and_renewed)
        fake.set_replicas(WATCHED, "llm", 2)  # someone scaled it back; the by-name run re-scales
        _run_charts_autoscaler(
            by_name, kube, prom, tmp_path, lambda: fake.replicas(WATCHED, "llm") == 4
        )
        requests_made = {_attributes(r.method, r.path, r.query) for r in fake.requests}
    finally:
        prom.stop()
        kube.stop()

    used = set()
    for request in sorted(requests_made):
        grant = _allowed(request, grants)
        assert grant, f"the chart's RBAC forbids {request}, which the autoscaler needs"
        used.add(grant)
    assert grants - used == set(), f"granted but never used: {sorted(grants - used)}"
    verbs = {(g[2], g[3]) for g in grants}
    assert ("deployments/scale", "update") in verbs and ("pods", "delete") not in verbs
