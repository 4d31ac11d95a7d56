"""Values a user sets combine with the chart's instead of silently dropping them: security
contexts merge, a nodeSelector replaces the GPU default, relabelings append, scrape timeouts
never exceed their interval, TLS reaches probes and ServiceMonitors, and the common pod settings
(labels, annotations, spread, extra volumes) reach every workload. NOTES.txt says what was
really rendered."""

from __future__ import annotations

import json
import re
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from tests.helm.chart import (
    CHART,
    KUBE_VERSIONS,
    NAMESPACE,
    RELEASE,
    of_kind,
    one,
    pod_spec,
    render,
    render_failure,
    render_notes,
)
from tests.helm.test_helm_lint_and_schemas import validate_operator_object

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]

CI = CHART / "ci"
GPU_LABEL = {"nvidia.com/gpu.present": "true"}
# Every workload the chart can render: the job and the batcher are off by default.
ALL_ON = (
    "batcher.enabled=true",
    "job.enabled=true",
    "job.input.configMap=requests",
    "job.output.persistentVolumeClaim=answers",
)
COMPONENTS = ("exporter", "predictor", "autoscaler", "batcher", "job")


def _values_file(tmp_path: Path, values: dict) -> Path:
    path = tmp_path / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    return path


def _workload(objects: list[dict], component: str) -> dict:
    (found,) = [
        o
        for o in objects
        if o["kind"] in ("Deployment", "DaemonSet", "Job")
        and o["metadata"]["labels"]["app.kubernetes.io/component"] == component
    ]
    return found


def _validate(obj: dict) -> None:
    for version in KUBE_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


# --- 1. security contexts merge over the chart-wide ones ---------------------------------------


def test_a_component_security_context_keeps_the_chart_wide_settings():
    """Setting one key for a component used to replace the whole chart-wide context, dropping
    drop: [ALL], allowPrivilegeEscalation: false, runAsNonRoot and seccomp."""
    sets = list(ALL_ON)
    for component in COMPONENTS:
        sets.append(f"{component}.securityContext.readOnlyRootFilesystem=false")
        sets.append(f"{component}.podSecurityContext.runAsGroup=1000")
    objects = render(sets=sets)
    for component in COMPONENTS:
        spec = pod_spec(_workload(objects, component))
        (container,) = spec["containers"]
        sc = container["securityContext"]
        assert sc["readOnlyRootFilesystem"] is False, component  # the component's key
        assert sc["capabilities"] == {"drop": ["ALL"]}, component  # the chart-wide rest
        assert sc["allowPrivilegeEscalation"] is False, component
        assert sc["privileged"] is False, component
        assert sc["seccompProfile"] == {"type": "RuntimeDefault"}, component
        pod = spec["securityContext"]
        assert pod["runAsGroup"] == 1000, component
        assert pod["seccompProfile"] == {"type": "RuntimeDefault"}, component
        if component != "exporter":
            assert pod["runAsNonRoot"] is True and pod["runAsUser"] == 65532, component


def test_the_exporter_root_settings_still_win_over_the_chart_wide_non_root():
    pod = pod_spec(one(render(), "DaemonSet"))["securityContext"]
    assert (pod["runAsUser"], pod["runAsGroup"], pod["runAsNonRoot"]) == (0, 0, False)


# --- 2. the exporter's nodeSelector ------------------------------------------------------------


def test_a_users_exporter_node_selector_replaces_the_gpu_default(tmp_path):
    """From a values file, Helm merges maps: the default label used to stay beside the user's."""
    selector = {"cloud.google.com/gke-accelerator": "nvidia-l4"}
    values = _values_file(tmp_path, {"exporter": {"nodeSelector": selector}})
    assert pod_spec(one(render(values=[values]), "DaemonSet"))["nodeSelector"] == selector
    notes = render_notes(values=[values])
    assert 'on nodes matching {"cloud.google.com/gke-accelerator":"nvidia-l4"}:' in notes


def test_the_exporter_runs_on_gpu_nodes_by_default_and_on_every_node_when_asked():
    assert pod_spec(one(render(), "DaemonSet"))["nodeSelector"] == GPU_LABEL
    assert 'on nodes matching {"nvidia.com/gpu.present":"true"}' in render_notes()
    everywhere = ("exporter.gpuNodesOnly=false",)
    assert "nodeSelector" not in pod_spec(one(render(sets=everywhere), "DaemonSet"))
    assert ") on every node:" in render_notes(sets=everywhere)
    nonroot = [CI / "exporter-nonroot-values.yaml"]  # it says "on every node"
    assert "nodeSelector" not in pod_spec(one(render(values=nonroot), "DaemonSet"))


# --- 3. Pod Security Admission -----------------------------------------------------------------

RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}


def _restricted_violations(spec: dict) -> list[str]:
    """What the Pod Security Standards' "restricted" level refuses in a pod spec (the checks
    this chart's pods could fail; hostPath is also the one "baseline" refuses)."""
    found = []
    for volume in spec.get("volumes", []):
        kinds = set(volume) - {"name"}
        if kinds - RESTRICTED_VOLUMES:
            found.append(f"volume {volume['name']}: {sorted(kinds)}")
    pod = spec.get("securityContext", {})
    for container in spec["containers"]:
        sc = container.get("securityContext", {})
        if not sc.get("runAsNonRoot", pod.get("runAsNonRoot")):
            found.append("runAsNonRoot")
        if sc.get("runAsUser", pod.get("runAsUser")) == 0:
            found.append("runAsUser 0")
        if sc.get("allowPrivilegeEscalation") is not False:
            found.append("allowPrivilegeEscalation")
        if "ALL" not in sc.get("capabilities", {}).get("drop", []):
            found.append("capabilities")
        seccomp = sc.get("seccompProfile", pod.get("seccompProfile", {}))
        if seccomp.get("type") not in ("RuntimeDefault", "Localhost"):
            found.append("seccompProfile")
    return found


def test_only_the_exporter_with_pod_attribution_needs_a_privileged_namespace():
    objects = render(sets=ALL_ON)
    for obj in of_kind(objects, "Deployment") + of_kind(objects, "Job"):
        assert _restricted_violations(pod_spec(obj)) == [], obj["metadata"]["name"]
    assert _restricted_violations(pod_spec(one(objects, "DaemonSet"))) == [
        "volume pod-resources: ['hostPath']",
        "runAsNonRoot",
        "runAsUser 0",
    ]
    nonroot = render(values=[CI / "exporter-nonroot-values.yaml"])
    assert _restricted_violations(pod_spec(one(nonroot, "DaemonSet"))) == []


def test_notes_say_how_to_admit_the_exporter_under_pod_security_admission():
    notes = render_notes()
    assert "baseline" in notes and "restricted" in notes
    assert (
        f"kubectl label namespace {NAMESPACE} pod-security.kubernetes.io/enforce=privileged"
        in notes
    )
    assert "ci/exporter-nonroot-values.yaml" in notes
    assert "Pod Security" not in render_notes(values=[CI / "exporter-nonroot-values.yaml"])


# --- 4. scrape timeouts never exceed the interval ----------------------------------------------

UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _ms(duration: str) -> int:
    return sum(int(n) * UNITS_MS[u] for n, u in re.findall(r"([0-9]+)(ms|s|m|h|d)", duration))


def _scrape_endpoints(objects: list[dict]) -> dict[str, dict]:
    out = {}
    for monitor in of_kind(objects, "ServiceMonitor") + of_kind(objects, "PodMonitor"):
        validate_operator_object(monitor)
        endpoints = monitor["spec"].get("endpoints") or monitor["spec"]["podMetricsEndpoints"]
        (out[monitor["metadata"]["labels"]["app.kubernetes.io/component"]],) = endpoints
    return out


@pytest.mark.parametrize(
    ("sets", "expected"),
    [
        # the chart-wide interval below the chart-wide 10s timeout
        (("monitoring.interval=5s",), {c: ("5s", "5s") for c in COMPONENTS}),
        (
            ("monitoring.interval=1m30s", "monitoring.scrapeTimeout=2m"),
            {"exporter": ("1m30s", "1m30s")},
        ),
        # one component's interval below the chart-wide timeout, or its own timeout too long
        (
            ("exporter.serviceMonitor.interval=2s",),
            {"exporter": ("2s", "2s"), "predictor": ("30s", "10s")},
        ),
        (("predictor.serviceMonitor.scrapeTimeout=45s",), {"predictor": ("30s", "30s")}),
        (("batcher.serviceMonitor.interval=500ms",), {"batcher": ("500ms", "500ms")}),
        (("autoscaler.serviceMonitor.interval=15s",), {"autoscaler": ("15s", "10s")}),
        (("job.podMonitor.interval=3s",), {"job": ("3s", "3s")}),
        (("job.podMonitor.scrapeTimeout=1m",), {"job": ("30s", "30s")}),
        (("job.podMonitor.scrapeTimeout=4s",), {"job": ("30s", "4s")}),
    ],
)
def test_a_scrape_timeout_longer_than_its_interval_is_cut_to_the_interval(sets, expected):
    endpoints = _scrape_endpoints(render(sets=(*ALL_ON, *sets), monitoring_api=True))
    assert set(endpoints) == set(COMPONENTS)
    for component, endpoint in endpoints.items():
        assert _ms(endpoint["scrapeTimeout"]) <= _ms(endpoint["interval"]), component
    for component, (interval, timeout) in expected.items():
        endpoint = endpoints[component]
        assert (endpoint["interval"], endpoint["scrapeTimeout"]) == (interval, timeout)


def test_a_shorter_scrape_timeout_is_kept():
    objects = render(values=[CI / "kube-prometheus-stack-values.yaml"])
    endpoints = _scrape_endpoints(objects)
    assert (endpoints["exporter"]["interval"], endpoints["exporter"]["scrapeTimeout"]) == (
        "5s",
        "4s",
    )
    assert (endpoints["predictor"]["interval"], endpoints["predictor"]["scrapeTimeout"]) == (
        "15s",
        "10s",
    )


# --- 5. pod labels, annotations, spread, extra volumes -----------------------------------------

CA_VOLUME = {"name": "prometheus-ca", "configMap": {"name": "prometheus-ca"}}
CA_MOUNT = {"name": "prometheus-ca", "mountPath": "/etc/autoglm/prometheus-ca", "readOnly": True}
SPREAD = {
    "maxSkew": 1,
    "topologyKey": "topology.kubernetes.io/zone",
    "whenUnsatisfiable": "ScheduleAnyway",
}


def _common_pod_settings(tmp_path: Path) -> Path:
    values: dict = {"batcher": {"enabled": True}}
    values["job"] = {
        "enabled": True,
        "input": {"configMap": "requests"},
        "output": {"persistentVolumeClaim": "answers"},
    }
    for component in COMPONENTS:
        settings = values.setdefault(component, {})
        settings["podLabels"] = {"team": "ml", "app.kubernetes.io/component": "hijacked"}
        settings["podAnnotations"] = {"example.com/owner": "ml-platform"}
        settings["extraVolumes"] = [CA_VOLUME]
        settings["extraVolumeMounts"] = [CA_MOUNT]
        if component != "exporter":  # spreading a DaemonSet's pods would block some nodes
            settings["topologySpreadConstraints"] = [SPREAD]
    for component in ("predictor", "autoscaler"):
        values[component]["extraArgs"] = ["--prometheus-ca-file=/etc/autoglm/prometheus-ca/ca.crt"]
    return _values_file(tmp_path, values)


def test_pod_labels_annotations_spread_and_extra_volumes_reach_every_workload(tmp_path):
    objects = render(values=[_common_pod_settings(tmp_path)])
    for component in COMPONENTS:
        workload = _workload(objects, component)
        _validate(workload)
        template = workload["spec"]["template"]
        labels = template["metadata"]["labels"]
        assert labels["team"] == "ml", component
        # the chart's labels win: podLabels cannot unselect the pods
        assert labels["app.kubernetes.io/component"] == component
        assert workload["spec"].get("selector", {}).get("matchLabels", {}).items() <= labels.items()
        assert template["metadata"]["annotations"]["example.com/owner"] == "ml-platform"
        spec = template["spec"]
        assert CA_VOLUME in spec["volumes"], component
        (container,) = spec["containers"]
        assert CA_MOUNT in container["volumeMounts"], component
        if component == "exporter":
            assert "topologySpreadConstraints" not in spec
            continue
        (spread,) = spec["topologySpreadConstraints"]
        selector = {
            "app.kubernetes.io/name": "open-autoglm",
            "app.kubernetes.io/instance": RELEASE,
            "app.kubernetes.io/component": component,
        }
        assert spread == {**SPREAD, "labelSelector": {"matchLabels": selector}}
    # the chart's own annotations stay beside the user's
    predictor = _workload(objects, "predictor")["spec"]["template"]["metadata"]["annotations"]
    assert "checksum/config" in predictor


def test_a_spread_constraint_keeps_its_own_label_selector():
    own = {"matchLabels": {"app": "llm"}}
    spec = pod_spec(
        one(
            render(
                extra=(
                    "--set-json",
                    "predictor.topologySpreadConstraints="
                    + json.dumps([{**SPREAD, "labelSelector": own}]),
                )
            ),
            "Deployment",
            "-predictor",
        )
    )
    assert spec["topologySpreadConstraints"][0]["labelSelector"] == own


@pytest.mark.parametrize(
    ("flag", "message"),
    [
        ("predictor.podLabels.team=1", "at '/predictor/podLabels/team': got number, want string"),
        ("autoscaler.extraVolumeMounts[0].name=ca", "missing property 'mountPath'"),
        ("batcher.extraVolumes[0].name=ca", "at '/batcher/extraVolumes/0'"),
        ("job.topologySpreadConstraints[0].maxSkew=1", "missing properties 'topologyKey'"),
        (
            "exporter.topologySpreadConstraints[0].maxSkew=1",
            "'topologySpreadConstraints' not allowed",
        ),
        ("exporter.updateStrategy.type=Recreate", "at '/exporter/updateStrategy/type'"),
    ],
)
def test_schema_types_the_common_pod_settings(flag, message):
    stderr = render_failure("--set", flag)
    assert message in stderr


# --- 6. TLS from the web config reaches probes, ServiceMonitors and helm test ------------------

TLS_FILES = {"cert_file": "/etc/autoglm/tls/tls.crt", "key_file": "/etc/autoglm/tls/tls.key"}


def _tls_values(tmp_path: Path) -> Path:
    web_config = {
        "enabled": True,
        "tlsSecret": "autoglm-tls",
        "config": {"tls_server_config": TLS_FILES},
    }
    return _values_file(
        tmp_path, {c: {"webConfig": web_config} for c in ("exporter", "predictor", "autoscaler")}
    )


def test_a_tls_server_config_turns_probes_service_monitors_and_helm_test_to_https(tmp_path):
    """webConfig.tls used to be needed as well; without it the pods crash-looped on HTTP probes."""
    objects = render(values=[_tls_values(tmp_path)], monitoring_api=True)
    for component in ("exporter", "autoscaler"):  # the predictor's probes are TCP
        (container,) = pod_spec(_workload(objects, component))["containers"]
        for probe in ("livenessProbe", "readinessProbe"):
            assert container[probe]["httpGet"]["scheme"] == "HTTPS", (component, probe)
    for component in ("exporter", "predictor", "autoscaler"):
        monitor = one(objects, "ServiceMonitor", f"-{component}")
        validate_operator_object(monitor)
        (endpoint,) = monitor["spec"]["endpoints"]
        assert endpoint["scheme"] == "https", component
        service = one(objects, "Service", f"-{component}")["metadata"]["name"]
        assert endpoint["tlsConfig"] == {
            "serverName": f"{service}.{NAMESPACE}.svc",
            "ca": {"secret": {"name": "autoglm-tls", "key": "ca.crt"}},
        }
    env = {e["name"]: e["value"] for e in pod_spec(one(objects, "Pod"))["containers"][0]["env"]}
    assert env["EXPORTER_URL"].startswith("https://")
    assert "curl -sk https://" in render_notes(values=[_tls_values(tmp_path)])


def test_a_users_tls_config_replaces_the_charts():
    objects = render(values=[CI / "secure-values.yaml"])
    (endpoint,) = one(objects, "ServiceMonitor", "-exporter")["spec"]["endpoints"]
    assert endpoint["tlsConfig"] == {
        "ca": {"secret": {"name": "exporter-tls", "key": "ca.crt"}},
        "serverName": "exporter.gpu.svc",
    }


def test_an_existing_secret_serves_tls_only_when_tls_says_so():
    """The chart cannot read a Secret of the user's: webConfig.tls tells it."""
    base = ("exporter.webConfig.enabled=true", "exporter.webConfig.existingSecret=web")
    for tls, scheme in (("false", "HTTP"), ("true", "HTTPS")):
        daemonset = one(render(sets=(*base, f"exporter.webConfig.tls={tls}")), "DaemonSet")
        (container,) = pod_spec(daemonset)["containers"]
        assert container["livenessProbe"]["httpGet"]["scheme"] == scheme


BCRYPT = "$2y$10$Y8bxkraO9eohc855OubO1e5vdVNt4JiSACI21myLen.eap9FzqVTS"


def _batcher_web_config_values(tmp_path: Path, **web_config: object) -> Path:
    return _values_file(
        tmp_path,
        {
            "batcher": {
                "enabled": True,
                "webConfig": {
                    "enabled": True,
                    "tlsSecret": "batcher-tls",
                    "config": {
                        "tls_server_config": TLS_FILES,
                        "basic_auth_users": {"prometheus": BCRYPT},
                    },
                    **web_config,
                },
            }
        },
    )


def test_the_batchers_web_config_is_mounted_and_passed(tmp_path):
    objects = render(values=[_batcher_web_config_values(tmp_path)], monitoring_api=True)
    deployment = _workload(objects, "batcher")
    spec = pod_spec(deployment)
    (container,) = spec["containers"]
    assert "--web-config-file=/etc/autoglm/web/web-config.yml" in container["args"]
    secret = one(objects, "Secret", "-batcher-web-config")
    web_config = yaml.safe_load(secret["stringData"]["web-config.yml"])
    assert web_config == {
        "tls_server_config": TLS_FILES,
        "basic_auth_users": {"prometheus": BCRYPT},
    }
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert (
        volumes[mounts["/etc/autoglm/web"]["name"]]["secret"]["secretName"]
        == (secret["metadata"]["name"])
    )
    assert volumes[mounts["/etc/autoglm/tls"]["name"]]["secret"]["secretName"] == "batcher-tls"
    for path in ("/etc/autoglm/web", "/etc/autoglm/tls"):  # a renewed certificate reaches them
        assert mounts[path]["readOnly"] and "subPath" not in mounts[path], path
    # A change of the inline web config rolls the pods, as for the other components.
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    other = render(
        values=[_batcher_web_config_values(tmp_path, config={"tls_server_config": TLS_FILES})]
    )
    assert (
        annotations["checksum/web-config"]
        != (
            _workload(other, "batcher")["spec"]["template"]["metadata"]["annotations"][
                "checksum/web-config"
            ]
        )
    )


def test_the_batchers_probes_need_no_credentials_once_it_asks_for_them(tmp_path):
    """The batcher leaves its KServe v2 health endpoints open (the kubelet has no
    credentials), so the probes ask them behind a web config too, over HTTPS once it sets TLS."""
    probes = ("startupProbe", "livenessProbe", "readinessProbe")
    basic_auth_only = {"basic_auth_users": {"p": BCRYPT}}
    for config, scheme in (({}, "HTTPS"), ({"config": basic_auth_only}, "HTTP")):
        folder = tmp_path / scheme  # a file of its own: renders are cached by their arguments
        folder.mkdir()
        values = [_batcher_web_config_values(folder, **config)]
        (container,) = pod_spec(_workload(render(values=values), "batcher"))["containers"]
        for probe in probes:
            assert container[probe]["httpGet"]["scheme"] == scheme, probe
            assert container[probe]["httpGet"]["path"].startswith("/v2/health/"), probe
    existing = render(
        sets=(
            "batcher.enabled=true",
            "batcher.webConfig.enabled=true",
            "batcher.webConfig.existingSecret=web",
            "batcher.webConfig.tls=true",
        )
    )
    (container,) = pod_spec(_workload(existing, "batcher"))["containers"]
    assert all(container[probe]["httpGet"]["scheme"] == "HTTPS" for probe in probes)
    (container,) = pod_spec(_workload(render(sets=("batcher.enabled=true",)), "batcher"))[
        "containers"
    ]
    paths = {probe: container[probe]["httpGet"]["path"] for probe in probes}
    assert paths == {
        "startupProbe": "/v2/health/ready",
        "livenessProbe": "/v2/health/live",
        "readinessProbe": "/v2/health/ready",
    }


def test_the_batchers_service_monitor_scrapes_over_https_with_the_users_basic_auth(tmp_path):
    auth = {"username": {"name": "scrape", "key": "u"}, "password": {"name": "scrape", "key": "p"}}
    objects = render(
        values=[_batcher_web_config_values(tmp_path)],
        monitoring_api=True,
        extra=("--set-json", f"batcher.serviceMonitor.endpoint={json.dumps({'basicAuth': auth})}"),
    )
    monitor = one(objects, "ServiceMonitor", "-batcher")
    validate_operator_object(monitor)
    (endpoint,) = monitor["spec"]["endpoints"]
    service = one(objects, "Service", "-batcher")
    assert endpoint["port"] == service["spec"]["ports"][0]["name"]
    assert endpoint["scheme"] == "https" and endpoint["basicAuth"] == auth
    assert endpoint["tlsConfig"] == {
        "serverName": f"{service['metadata']['name']}.{NAMESPACE}.svc",
        "ca": {"secret": {"name": "batcher-tls", "key": "ca.crt"}},
    }
    plain = one(
        render(sets=("batcher.enabled=true",), monitoring_api=True), "ServiceMonitor", "-batcher"
    )
    (endpoint,) = plain["spec"]["endpoints"]
    assert endpoint["scheme"] == "http" and "tlsConfig" not in endpoint


def test_notes_say_whether_the_batcher_asks_credentials(tmp_path):
    notes = render_notes(values=[_batcher_web_config_values(tmp_path)])
    assert f"https://{RELEASE}-open-autoglm-batcher.{NAMESPACE}.svc:8000" in notes
    assert "every path but /v2/health/live and /v2/health/ready" in notes
    open_notes = render_notes(sets=("batcher.enabled=true",))
    assert "without TLS or auth" in open_notes and "batcher.webConfig" in open_notes
    assert "Batcher:" not in render_notes()


# --- 7. relabelings of the user's are appended to the chart's ----------------------------------


def test_extra_relabelings_are_appended_to_the_charts_own():
    extra = {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "hostname"}
    sets = ("batcher.enabled=true",)
    json_sets: list[str] = []
    for component in ("exporter", "predictor", "autoscaler", "batcher"):
        json_sets += [
            "--set-json",
            f"{component}.serviceMonitor.extraRelabelings={json.dumps([extra])}",
        ]
    objects = render(sets=sets, monitoring_api=True, extra=tuple(json_sets))
    for monitor in of_kind(objects, "ServiceMonitor"):
        validate_operator_object(monitor)
        component = monitor["metadata"]["labels"]["app.kubernetes.io/component"]
        (endpoint,) = monitor["spec"]["endpoints"]
        relabelings = endpoint["relabelings"]
        assert relabelings[0] == {"targetLabel": "job", "replacement": f"autoglm-{component}"}
        assert relabelings[-1] == extra, component
        if component == "exporter":
            assert {"action": "labeldrop", "regex": "pod|namespace|container"} in relabelings
            assert len(relabelings) == 4


# --- 8. the exporter's update strategy ---------------------------------------------------------


def test_on_delete_renders_no_rolling_update():
    """The API server refuses rollingUpdate beside type OnDelete."""
    daemonset = one(render(sets=("exporter.updateStrategy.type=OnDelete",)), "DaemonSet")
    assert daemonset["spec"]["updateStrategy"] == {"type": "OnDelete"}
    default = one(render(), "DaemonSet")
    assert default["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": 1},
    }


# --- 9. NOTES.txt and the values' pointers -----------------------------------------------------


def test_notes_curl_names_the_basic_auth_user():
    notes = render_notes(values=[CI / "secure-values.yaml"])
    assert "curl -sk https://127.0.0.1:9400/metrics -u prometheus:PASSWORD" in notes
    hint = render_notes(
        sets=("exporter.webConfig.enabled=true", "exporter.webConfig.existingSecret=web")
    )
    assert "Secret web sets basic_auth_users, add -u USER:PASSWORD" in hint
    assert "-u " not in render_notes()


def test_values_yaml_points_only_to_docs_that_exist():
    text = (CHART / "values.yaml").read_text()
    assert "README.md" not in text
    pages = set(re.findall(r"docs/[\w-]+\.md", text))
    assert {"docs/security.md", "docs/predictor.md"} <= pages
    for page in pages:
        assert (CHART.parents[1] / page).is_file(), page
