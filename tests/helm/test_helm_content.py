"""What the chart renders: the same rules and dashboards as the repository, secure pods, the
recommended labels, selection labels Prometheus and Grafana look for, and clear refusals."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.helm.chart import (
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    ROOT,
    of_kind,
    one,
    pod_spec,
    render,
    render_failure,
    render_text,
    workloads,
)

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]

RULES = ROOT / "alerts" / "rules.yaml"
DASHBOARDS = ROOT / "dashboards" / "json"
CI = CHART / "ci"
RECOMMENDED = (
    "app.kubernetes.io/name",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/component",
    "app.kubernetes.io/part-of",
    "app.kubernetes.io/managed-by",
    "helm.sh/chart",
)


def _document(text: str, kind: str) -> str:
    """The text of the one rendered document of ``kind``."""
    (doc,) = [d for d in text.split("\n---\n") if re.search(rf"^kind: {kind}$", d, re.M)]
    return doc


def _spec_text(document: str) -> str:
    """The text under ``spec:`` with the two spaces of indentation taken off every line."""
    body = document.split("\nspec:\n", 1)[1]
    lines = body.split("\n")
    assert all(line == "" or line.startswith("  ") for line in lines)
    return "\n".join(line[2:] for line in lines)


# --- the PrometheusRule is alerts/rules.yaml ---------------------------------------------------


def test_prometheus_rule_holds_alerts_rules_yaml_unchanged():
    text = render_text(monitoring_api=True)
    source = RULES.read_text()
    spec_text = _spec_text(_document(text, "PrometheusRule"))
    assert spec_text.rstrip("\n") == source.rstrip("\n")  # the text, comments included
    rule = one(render(monitoring_api=True), "PrometheusRule")
    assert rule["spec"] == yaml.safe_load(source)  # and the same data


def test_rules_in_the_prometheus_rule_pass_promtool(tmp_path):
    rule = one(render(monitoring_api=True), "PrometheusRule")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump(rule["spec"]))
    result = subprocess.run(
        ["promtool", "check", "rules", str(rules_file)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    groups = rule["spec"]["groups"]
    total = sum(len(g["rules"]) for g in groups)
    assert f"SUCCESS: {total} rules found" in result.stdout


def test_prometheus_rule_templates_reach_prometheus_untouched():
    rule = one(render(monitoring_api=True), "PrometheusRule")
    annotations = [
        r["annotations"]["summary"]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    ]
    assert any("{{ $labels." in a for a in annotations)


def test_exporter_job_matches_the_exporter_down_alert_whatever_the_release_name():
    """AutoglmExporterDown finds the exporter by job; the operator's job is the Service name
    unless a relabeling sets it."""
    rules = yaml.safe_load(RULES.read_text())
    (expr,) = [
        r["expr"]
        for g in rules["groups"]
        for r in g["rules"]
        if r.get("alert") == "AutoglmExporterDown"
    ]
    pattern = re.search(r'job=~"([^"]+)"', expr).group(1)
    for release in (RELEASE, "autoglm", "open-autoglm-prod", "exporter"):
        objects = render(monitoring_api=True, release=release)
        job = one(objects, "Service", "-exporter")["metadata"]["name"]
        (endpoint,) = one(objects, "ServiceMonitor", "-exporter")["spec"]["endpoints"]
        for relabeling in endpoint.get("relabelings", []):
            if relabeling.get("targetLabel") == "job":
                job = relabeling["replacement"]
        assert re.fullmatch(pattern, job), (release, job)


# --- dashboards are dashboards/json -------------------------------------------------------------


def test_dashboard_config_maps_equal_the_committed_json():
    files = sorted(DASHBOARDS.glob("*.json"))
    assert files
    maps = [
        m for m in of_kind(render(), "ConfigMap") if "grafana_dashboard" in m["metadata"]["labels"]
    ]
    by_file = {}
    for config_map in maps:
        assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert config_map["metadata"]["annotations"]["grafana_folder"] == "GPU"
        ((name, content),) = config_map["data"].items()
        by_file[name] = content
    assert sorted(by_file) == [f.name for f in files]
    for f in files:
        assert by_file[f.name] == f.read_text().rstrip("\n")
        assert json.loads(by_file[f.name]) == json.loads(f.read_text())


def test_dashboard_label_value_folder_and_namespace_are_configurable():
    maps = of_kind(
        render(
            sets=(
                "dashboards.label=grafana_dash",
                "dashboards.folderAnnotation=k8s-sidecar-target-directory",
                "dashboards.folder=/tmp/dashboards/gpu",
                "dashboards.namespace=monitoring",
            ),
            extra=("--set-string", "dashboards.labelValue=yes"),
        ),
        "ConfigMap",
    )
    dashboards = [m for m in maps if "grafana_dash" in m["metadata"]["labels"]]
    assert len(dashboards) == len(list(DASHBOARDS.glob("*.json")))
    for m in dashboards:
        assert m["metadata"]["labels"]["grafana_dash"] == "yes"
        assert m["metadata"]["namespace"] == "monitoring"
        assert m["metadata"]["annotations"] == {
            "k8s-sidecar-target-directory": "/tmp/dashboards/gpu"
        }


def test_dashboards_can_be_turned_off():
    maps = of_kind(render(sets=("dashboards.enabled=false",)), "ConfigMap")
    assert not [m for m in maps if "grafana_dashboard" in m["metadata"]["labels"]]


# --- Prometheus selection -----------------------------------------------------------------------


def test_operator_objects_carry_the_selection_labels():
    objects = render(values=[CI / "kube-prometheus-stack-values.yaml"])
    operator = of_kind(objects, "ServiceMonitor") + of_kind(objects, "PrometheusRule")
    assert {o["kind"] for o in operator} == {"ServiceMonitor", "PrometheusRule"}
    for obj in operator:
        assert obj["metadata"]["labels"]["release"] == "monitoring"
    default = render(monitoring_api=True)
    for obj in of_kind(default, "ServiceMonitor") + of_kind(default, "PrometheusRule"):
        assert obj["metadata"]["labels"]["release"] == "kube-prometheus-stack"


def test_service_monitors_select_their_services():
    objects = render(values=[CI / "batcher-values.yaml"])
    services = of_kind(objects, "Service")
    monitors = of_kind(objects, "ServiceMonitor")
    assert len(monitors) == 4  # exporter, predictor, autoscaler, batcher
    for monitor in monitors:
        selector = monitor["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if selector.items() <= s["metadata"]["labels"].items()]
        assert len(matched) == 1, monitor["metadata"]["name"]
        port_names = {p["name"] for p in matched[0]["spec"]["ports"]}
        assert {e["port"] for e in monitor["spec"]["endpoints"]} <= port_names
        assert monitor["spec"]["namespaceSelector"] == {"matchNames": [NAMESPACE]}


def test_exporter_service_monitor_keeps_the_gpu_pod_labels():
    monitor = one(render(monitoring_api=True), "ServiceMonitor", "-exporter")
    (endpoint,) = monitor["spec"]["endpoints"]
    drop = [r for r in endpoint["relabelings"] if r.get("action") == "labeldrop"]
    assert drop
    dropped = drop[0]["regex"]
    assert all(re.fullmatch(dropped, label) for label in ("pod", "namespace", "container"))
    assert not re.fullmatch(dropped, "instance")


def test_only_the_autoscaler_service_monitor_honors_its_namespace_label():
    """The autoscaler's series name the GPUAutoscaler's namespace; without honorLabels the
    operator would rename it exported_namespace and the rules and dashboards would miss it."""
    objects = render(monitoring_api=True)
    honoring = {
        monitor["metadata"]["name"].rsplit("-", 1)[-1]
        for monitor in of_kind(objects, "ServiceMonitor")
        if monitor["spec"]["endpoints"][0].get("honorLabels")
    }
    assert honoring == {"autoscaler"}


def test_exporter_tls_reaches_probes_service_monitor_and_test_pod():
    objects = render(values=[CI / "secure-values.yaml"])
    daemonset = one(objects, "DaemonSet")
    (container,) = pod_spec(daemonset)["containers"]
    assert container["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert "--web-config-file=/etc/autoglm/web/web-config.yml" in container["args"]
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/etc/autoglm/web"]["readOnly"] and mounts["/etc/autoglm/tls"]["readOnly"]
    monitor = one(objects, "ServiceMonitor", "-exporter")
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["scheme"] == "https"
    assert endpoint["basicAuth"]["username"] == {"name": "exporter-scrape", "key": "username"}
    assert endpoint["relabelings"]  # user's extra fields merge, the chart's stay
    secret = one(objects, "Secret", "-exporter-web-config")
    web_config = yaml.safe_load(secret["stringData"]["web-config.yml"])
    assert web_config["tls_server_config"]["cert_file"] == "/etc/autoglm/tls/tls.crt"
    test_pod = one(objects, "Pod")
    env = {e["name"]: e["value"] for e in pod_spec(test_pod)["containers"][0]["env"]}
    assert env["EXPORTER_URL"].startswith("https://")
    assert env["EXPORTER_AUTH"] == "web-config"


# --- secure pods --------------------------------------------------------------------------------


def _all_workloads() -> list[dict]:
    seen = []
    for values in [[], *([p] for p in sorted(CI.glob("*-values.yaml")))]:
        seen += workloads(render(values=values, monitoring_api=True))
    return seen


def test_every_container_is_locked_down():
    for obj in _all_workloads():
        spec = pod_spec(obj)
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC")
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, where
        for container in spec["containers"]:
            sc = container["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, where
            assert sc["readOnlyRootFilesystem"] is True, where
            assert sc["privileged"] is False, where
            assert sc["capabilities"] == {"drop": ["ALL"]}, where
            assert "add" not in sc["capabilities"], where
            resources = container["resources"]
            assert resources["requests"] and resources["limits"], where
            assert resources["limits"].get("memory"), where


def test_only_the_exporter_with_pod_attribution_runs_as_root():
    for obj in _all_workloads():
        spec = pod_spec(obj)
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        args = spec["containers"][0].get("args", [])
        if component == "exporter" and "--kubernetes" in args:
            assert spec["securityContext"]["runAsUser"] == 0
            continue
        assert spec["securityContext"]["runAsNonRoot"] is True, obj["metadata"]["name"]
        assert spec["securityContext"]["runAsUser"] != 0


def test_exporter_gets_gpus_and_the_kubelet_socket_and_nothing_more():
    daemonset = one(render(), "DaemonSet")
    spec = pod_spec(daemonset)
    (container,) = spec["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    assert "nvidia.com/gpu" not in json.dumps(container["resources"])  # GPUs stay for workloads
    assert spec["automountServiceAccountToken"] is False
    host_paths = [v for v in spec["volumes"] if "hostPath" in v]
    assert host_paths == [
        {
            "name": "pod-resources",
            "hostPath": {"path": "/var/lib/kubelet/pod-resources", "type": "Directory"},
        }
    ]
    (mount,) = [m for m in container["volumeMounts"] if m["name"] == "pod-resources"]
    assert mount["readOnly"] is True
    assert "--pod-resources-socket=/var/lib/kubelet/pod-resources/kubelet.sock" in container["args"]
    assert spec["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"


def test_exporter_placement_is_configurable():
    spec = pod_spec(
        one(
            render(
                sets=(
                    "exporter.nodeSelector.accelerator=h100",
                    "exporter.tolerations[0].key=dedicated",
                    "exporter.tolerations[0].operator=Equal",
                    "exporter.tolerations[0].value=gpu",
                    "exporter.runtimeClassName=nvidia",
                )
            ),
            "DaemonSet",
        )
    )
    # the user's nodeSelector replaces the GPU label of exporter.gpuNodesOnly
    assert spec["nodeSelector"] == {"accelerator": "h100"}
    assert spec["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "gpu"}]
    assert spec["runtimeClassName"] == "nvidia"


def test_only_the_autoscaler_talks_to_the_api_server():
    for obj in workloads(render(values=[CI / "batcher-values.yaml"], monitoring_api=True)):
        spec = pod_spec(obj)
        component = obj["metadata"]["labels"]["app.kubernetes.io/component"]
        assert spec["automountServiceAccountToken"] is (component == "autoscaler"), component


def test_network_policies_admit_prometheus_and_the_test_pod_only():
    objects = render(values=[CI / "secure-values.yaml"])
    policies = of_kind(objects, "NetworkPolicy")
    assert {p["metadata"]["labels"]["app.kubernetes.io/component"] for p in policies} == {
        "exporter",
        "predictor",
        "autoscaler",
    }
    test_pod_labels = one(objects, "Pod")["metadata"]["labels"]
    for policy in policies:
        (rule,) = policy["spec"]["ingress"]
        peers = rule["from"]
        assert peers[0]["namespaceSelector"]["matchLabels"] == {
            "kubernetes.io/metadata.name": "monitoring"
        }
        test_peer = peers[-1]["podSelector"]["matchLabels"]
        assert test_peer.items() <= test_pod_labels.items()
    assert not of_kind(render(), "NetworkPolicy")


def test_the_batcher_gets_a_network_policy_only_when_asked():
    """Its port serves inference clients the chart does not know: networkPolicy.enabled leaves
    it open, batcher.networkPolicy.enabled closes it to all but Prometheus, the job and the
    clients listed."""

    def guarded(*sets: str) -> list[str]:
        policies = of_kind(render(sets=("batcher.enabled=true", *sets)), "NetworkPolicy")
        return sorted(p["metadata"]["labels"]["app.kubernetes.io/component"] for p in policies)

    assert guarded() == []
    assert guarded("networkPolicy.enabled=true") == ["autoscaler", "exporter", "predictor"]
    assert guarded("batcher.networkPolicy.enabled=true") == ["batcher"]
    assert "batcher" in guarded("networkPolicy.enabled=true", "batcher.networkPolicy.enabled=true")
    assert guarded("batcher.enabled=false", "batcher.networkPolicy.enabled=true") == []


def test_the_batcher_network_policy_admits_prometheus_the_job_and_its_clients():
    objects = render(values=[CI / "batcher-job-secure-values.yaml"])
    policy = one(objects, "NetworkPolicy", "-batcher")
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(policy, version, strict=True)
    deployment = one(objects, "Deployment", "-batcher")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": 8000, "protocol": "TCP"}]
    prometheus, job, client = rule["from"]
    assert prometheus["namespaceSelector"]["matchLabels"] == {
        "kubernetes.io/metadata.name": "monitoring"
    }
    job_pod_labels = one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    assert job["podSelector"]["matchLabels"].items() <= job_pod_labels.items()
    assert "namespaceSelector" not in job  # the release's namespace only
    assert client == {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "ml"}}}


def test_the_batcher_network_policy_never_admits_everyone():
    """An ingress rule whose `from` is empty admits every source: with no Prometheus peers and
    no clients the job's peer is still there."""
    policy = one(
        render(
            sets=("batcher.enabled=true", "batcher.networkPolicy.enabled=true"),
            extra=("--set-json", "networkPolicy.from=[]"),
        ),
        "NetworkPolicy",
    )
    (rule,) = policy["spec"]["ingress"]
    assert [
        peer["podSelector"]["matchLabels"]["app.kubernetes.io/component"] for peer in rule["from"]
    ] == ["job"]


# --- labels, image, hooks -----------------------------------------------------------------------


def test_every_object_has_the_recommended_labels():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    for obj in render(values=[CI / "batcher-values.yaml"], monitoring_api=True):
        labels = obj["metadata"]["labels"]
        for key in RECOMMENDED:
            assert key in labels, f"{obj['kind']}/{obj['metadata']['name']} lacks {key}"
        assert labels["app.kubernetes.io/instance"] == RELEASE
        assert labels["app.kubernetes.io/version"] == chart["appVersion"]
        assert labels["helm.sh/chart"] == f"open-autoglm-{chart['version']}"


def test_image_defaults_to_app_version_and_can_be_pinned():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] and chart["appVersion"]
    images = {c["image"] for o in workloads(render()) for c in pod_spec(o)["containers"]}
    assert images == {f"ghcr.io/open-autoglm/open-autoglm:{chart['appVersion']}"}
    pinned = {
        c["image"]
        for o in workloads(render(values=[CI / "secure-values.yaml"]))
        for c in pod_spec(o)["containers"]
    }
    assert pinned == {"ghcr.io/open-autoglm/open-autoglm@sha256:" + "0" * 64}


def test_helm_test_hook_checks_the_exporter_service():
    objects = render()
    pod = one(objects, "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    service = one(objects, "Service", "-exporter")
    env = {e["name"]: e["value"] for e in pod_spec(pod)["containers"][0]["env"]}
    assert env["EXPORTER_URL"] == (
        f"http://{service['metadata']['name']}.{NAMESPACE}.svc:{service['spec']['ports'][0]['port']}"
    )


def test_kube_version_below_the_minimum_is_refused():
    stderr = render_failure("--kube-version", "1.25.0")
    assert "kubeVersion" in stderr and "1.25.0" in stderr


# --- bad values are refused with a message that names them --------------------------------------


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("exporter.port=metrics", "at '/exporter/port': got string, want integer"),
        ("monitoring.enabled=sometimes", "at '/monitoring/enabled': value must be one of"),
        ("exporter.nodeselector.gpu=true", "additional properties 'nodeselector' not allowed"),
        ("autoscaler.scaleTargets[0]=cronjobs", "at '/autoscaler/scaleTargets/0'"),
        ("exporter.source=dcgm", "at '/exporter/source': value must be one of"),
        ("image.digest=latest", "at '/image/digest'"),
        ("prometheus.url=prometheus:9090", "at '/prometheus/url'"),
        ("dashboards.labelValue=1", "at '/dashboards/labelValue': got number, want string"),
        ("exporter.resources=null", "at '/exporter': missing property 'resources'"),
    ],
)
def test_schema_rejects_bad_values_clearly(flag, message):
    stderr = render_failure("--set", flag)
    assert "values don't meet the specifications of the schema" in stderr
    assert message in stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (
            ("exporter.webConfig.enabled=true",),
            "exporter.webConfig.enabled is true but there is no web config",
        ),
        (
            ("batcher.enabled=true", "batcher.webConfig.enabled=true"),
            "batcher.webConfig.enabled is true but there is no web config",
        ),
        (
            (
                "batcher.enabled=true",
                "batcher.webConfig.enabled=true",
                "batcher.webConfig.existingSecret=web",
                "batcher.webConfig.config.http_server_config.http2=true",
            ),
            "batcher.webConfig: set either existingSecret or config, not both",
        ),
        (
            ("autoscaler.replicas=2", "autoscaler.leaderElection.enabled=false"),
            "enable leader election or run 1 replica",
        ),
        (("predictor.config.targets=null",), "predictor.config.targets is empty"),
        (
            ("autoscaler.serviceAccount.create=false",),
            "autoscaler.serviceAccount.name is required",
        ),
    ],
)
def test_inconsistent_values_fail_with_the_fix(flags, message):
    args: list[str] = []
    for flag in flags:
        args += ["--set", flag]
    assert message in render_failure(*args)


def test_values_schema_is_json_and_values_yaml_satisfies_it():
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
    assert Path(CHART / "values.schema.json").read_text().endswith("\n")


# --- disruption budgets ----------------------------------------------------------------------


def test_components_with_several_replicas_get_a_disruption_budget_selecting_their_pods():
    objects = render(
        sets=[
            "autoscaler.replicas=2",
            "batcher.enabled=true",
            "batcher.replicas=3",
            "batcher.podDisruptionBudget.maxUnavailable=50%",
        ]
    )
    budgets = {o["metadata"]["name"]: o for o in of_kind(objects, "PodDisruptionBudget")}
    assert sorted(budgets) == [
        f"{RELEASE}-open-autoglm-autoscaler",
        f"{RELEASE}-open-autoglm-batcher",
    ]
    for component, unavailable in (("autoscaler", 1), ("batcher", "50%")):
        budget = budgets[f"{RELEASE}-open-autoglm-{component}"]
        deployment = one(objects, "Deployment", f"-{component}")
        assert budget["spec"]["maxUnavailable"] == unavailable
        assert (
            budget["spec"]["selector"]["matchLabels"]
            == deployment["spec"]["selector"]["matchLabels"]
        )


def test_single_replicas_and_disabled_budgets_get_none():
    """A budget over one pod would block every node drain."""
    assert not of_kind(render(sets=["batcher.enabled=true"]), "PodDisruptionBudget")
    disabled = render(
        sets=["autoscaler.replicas=2", "autoscaler.podDisruptionBudget.enabled=false"]
    )
    assert not of_kind(disabled, "PodDisruptionBudget")


def test_disruption_budget_must_allow_at_least_one_pod_down():
    stderr = render_failure("--set", "autoscaler.podDisruptionBudget.maxUnavailable=0")
    assert "maxUnavailable" in stderr


# --- batcher front workers ---------------------------------------------------------------------


def _batcher_args(sets: list[str]) -> list[str]:
    deployment = one(render(sets=["batcher.enabled=true", *sets]), "Deployment", "-batcher")
    (container,) = pod_spec(deployment)["containers"]
    return container["args"]


def test_batcher_workers_value_becomes_the_workers_flag():
    """``batcher.workers`` is ``--workers``; the default 0 passes no flag, so a release that
    does not ask for front workers renders the one-process batcher exactly as before."""
    assert not any(arg.startswith("--workers") for arg in _batcher_args([]))
    assert "--workers=3" in _batcher_args(["batcher.workers=3"])


def test_batcher_model_process_value_becomes_the_flag():
    """``batcher.modelProcess`` is ``--model-process``; off by default, no flag at all."""
    assert "--model-process" not in _batcher_args([])
    assert "--model-process" in _batcher_args(["batcher.modelProcess=true"])


@pytest.mark.parametrize("workers", ["-1", "65", "1.5"])
def test_batcher_workers_outside_what_the_batcher_takes_is_refused(workers):
    stderr = render_failure("--set", "batcher.enabled=true", "--set", f"batcher.workers={workers}")
    assert "workers" in stderr
