"""Render the chart with the real helm binary and pick objects out of the result.

The binary is the one ``scripts/install-helm`` puts in ``.tools/bin/helm`` (Helm 3.19). Renders
are cached per argument list: the chart does not change during a test session, and ``helm
template`` costs a few hundred milliseconds on these machines.
"""

from __future__ import annotations

import atexit
import functools
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "open-autoglm"
HELM = ROOT / ".tools" / "bin" / "helm"
MONITORING_API = "monitoring.coreos.com/v1"
RELEASE = "gpu"
NAMESPACE = "autoglm"
# Lowest Kubernetes of Chart.yaml's kubeVersion, and the newest kubernetes-validate knows.
KUBE_VERSIONS = ("1.27.0", "1.37.0")


@functools.cache
def prometheus_operator() -> ModuleType:
    """cloudcoil's Prometheus Operator models (``monitoring.coreos.com/v1``), imported on first
    use: the import builds thousands of pydantic models (seconds of CPU), which only the tests
    that validate a PodMonitor, ServiceMonitor or PrometheusRule need, not the collection every
    pytest worker makes."""
    from cloudcoil.models.prometheus_operator import v1

    return v1


def ci_values_files() -> list[Path]:
    return sorted((CHART / "ci").glob("*-values.yaml"))


def helm(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    """Run helm; the symlink notices it prints on stderr (files/, crds/) are expected."""
    if not HELM.exists():
        raise RuntimeError(f"{HELM} is missing: run `bash scripts/install-helm`")
    result = subprocess.run(
        [str(HELM), *args], capture_output=True, text=True, timeout=120, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"helm {' '.join(args)} failed:\n{result.stderr}")
    return result


@functools.lru_cache(maxsize=64)
def _template(release: str, args: tuple[str, ...]) -> str:
    return helm("template", release, str(CHART), "--namespace", NAMESPACE, *args).stdout


def render_text(
    values: Iterable[Path | str] = (),
    sets: Iterable[str] = (),
    monitoring_api: bool = False,
    extra: Iterable[str] = (),
    release: str = RELEASE,
) -> str:
    args: list[str] = []
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    if monitoring_api:
        args += ["--api-versions", MONITORING_API]
    return _template(release, (*args, *extra))


def render(
    values: Iterable[Path | str] = (),
    sets: Iterable[str] = (),
    monitoring_api: bool = False,
    extra: Iterable[str] = (),
    release: str = RELEASE,
) -> list[dict[str, Any]]:
    """Every object helm renders, as parsed YAML (empty documents dropped). libyaml's loader:
    PyYAML's pure-Python one spent most of the chart tests' CPU on the rendered CRDs."""
    text = render_text(values, sets, monitoring_api, extra, release)
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # a PyYAML built without libyaml
    return [doc for doc in yaml.load_all(text, Loader=loader) if doc]


def render_failure(*args: str) -> str:
    """stderr of a ``helm template`` that must fail."""
    result = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, *args, check=False)
    assert result.returncode != 0, "helm template was expected to fail but rendered"
    return result.stderr


def of_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name_suffix: str = "") -> dict[str, Any]:
    found = [o for o in of_kind(objects, kind) if o["metadata"]["name"].endswith(name_suffix)]
    assert len(found) == 1, f"expected one {kind} named *{name_suffix}, got {len(found)}"
    return found[0]


def pod_spec(obj: dict[str, Any]) -> dict[str, Any]:
    """The pod spec of a workload or of a bare Pod."""
    return obj["spec"] if obj["kind"] == "Pod" else obj["spec"]["template"]["spec"]


def workloads(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] in ("Deployment", "DaemonSet", "StatefulSet", "Pod")]


@functools.cache
def _chart_with_notes_as_manifest() -> Path:
    """A copy of the chart whose NOTES.txt is rendered into a ConfigMap: ``helm template``
    never prints NOTES.txt and ``helm install --dry-run`` needs a cluster. Symlinks (files/,
    crds/) are copied as the files they point to."""
    folder = tempfile.mkdtemp(prefix="autoglm-notes-")
    atexit.register(shutil.rmtree, folder, True)
    copy = Path(folder) / "chart"
    shutil.copytree(CHART, copy, symlinks=False)
    notes = copy / "templates" / "NOTES.txt"
    text = notes.read_text()
    notes.unlink()
    (copy / "templates" / "_notes_for_tests.tpl").write_text(
        '{{- define "tests.notes" -}}\n' + text + "\n{{- end }}\n"
    )
    (copy / "templates" / "notes-for-tests.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: notes\ndata:\n"
        '  NOTES.txt: |\n    {{- include "tests.notes" . | nindent 4 }}\n'
    )
    return copy


def render_notes(values: Iterable[Path | str] = (), sets: Iterable[str] = ()) -> str:
    """The text of NOTES.txt, as ``helm install`` would print it."""
    args: list[str] = []
    for v in values:
        args += ["-f", str(v)]
    for s in sets:
        args += ["--set", s]
    chart = _chart_with_notes_as_manifest()
    text = helm(
        "template",
        RELEASE,
        str(chart),
        "--namespace",
        NAMESPACE,
        "--show-only",
        "templates/notes-for-tests.yaml",
        *args,
    ).stdout
    return yaml.safe_load(text)["data"]["NOTES.txt"]
