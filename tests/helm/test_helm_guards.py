"""Values that would silently break a release fail the render or are explained: the Prometheus
naming beside the chart's DCGM rules, commonLabels that repeat the chart's labels, upgrades of
the immutable Job. And the chart carries a README that ``helm show readme`` prints."""

from __future__ import annotations

import re

import pytest
import yaml

from tests.helm.chart import (
    CHART,
    ROOT,
    helm,
    of_kind,
    render,
    render_failure,
    render_notes,
    render_text,
)

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]

PROMETHEUS_NAMING = "exporter.naming=prometheus"
WITHOUT_DCGM_READERS = (
    "monitoring.prometheusRule.enabled=false",
    "dashboards.enabled=false",
    "predictor.config.targets[0].name=gpu_util",
    "predictor.config.targets[0].query=sum(autoglm_gpu_utilization_ratio)",
)


def test_prometheus_naming_fails_while_the_dcgm_rules_dashboards_and_query_are_on():
    stderr = render_failure(
        "--set", PROMETHEUS_NAMING, "--api-versions", "monitoring.coreos.com/v1"
    )
    (line,) = [ln for ln in stderr.splitlines() if "exporter.naming=prometheus" in ln]
    assert "monitoring.prometheusRule.enabled=false" in line
    assert "dashboards.enabled=false" in line
    assert 'predictor target "gpu_util"' in line
    assert "exporter.naming=dcgm" in line


@pytest.mark.parametrize("left_on", range(3))
def test_prometheus_naming_names_each_reader_left_on(left_on):
    sets = [PROMETHEUS_NAMING, *WITHOUT_DCGM_READERS]
    if left_on == 2:  # a query of the user's on DCGM names
        sets.append("predictor.config.targets[0].query=sum(DCGM_FI_DEV_GPU_UTIL)")
    else:
        del sets[1 + left_on]
    args = [a for s in sets for a in ("--set", s)]
    stderr = render_failure(*args)
    wanted = ("monitoring.prometheusRule", "dashboards.enabled", "predictor target")[left_on]
    assert wanted in stderr


def test_prometheus_naming_renders_when_nothing_reads_dcgm_names():
    objects = render(sets=(PROMETHEUS_NAMING, *WITHOUT_DCGM_READERS), monitoring_api=True)
    (daemonset,) = of_kind(objects, "DaemonSet")
    assert "--naming=prometheus" in daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    assert not of_kind(objects, "PrometheusRule")
    # A release without the exporter (e.g. the exporter in a namespace of its own) is not held
    # to its naming.
    render(sets=(PROMETHEUS_NAMING, "exporter.enabled=false"))


class _UniqueKeyLoader(yaml.SafeLoader):
    def construct_mapping(self, node, deep=False):
        keys = [self.construct_object(k, deep=deep) for k, _ in node.value]
        duplicate = {k for k in keys if keys.count(k) > 1}
        assert not duplicate, f"duplicate keys {duplicate} at {node.start_mark}"
        return super().construct_mapping(node, deep=deep)


def test_common_labels_that_repeat_the_charts_are_merged_and_the_chart_wins():
    text = render_text(
        sets=(
            "commonLabels.app\\.kubernetes\\.io/part-of=platform",
            "commonLabels.app\\.kubernetes\\.io/instance=other",
            "commonLabels.team=ml",
            "job.enabled=true",
            "batcher.enabled=true",
            "job.input.configMap=requests",
            "job.output.persistentVolumeClaim=answers",
        ),
        monitoring_api=True,
    )
    objects = [d for d in yaml.load_all(text, Loader=_UniqueKeyLoader) if d]
    assert objects
    for obj in objects:
        labels = obj["metadata"].get("labels", {})
        if "app.kubernetes.io/part-of" not in labels:
            continue  # CRDs and the test's own objects
        assert labels["app.kubernetes.io/part-of"] == "open-autoglm", obj["metadata"]["name"]
        assert labels["app.kubernetes.io/instance"] == "gpu", obj["metadata"]["name"]
        assert labels["team"] == "ml", obj["metadata"]["name"]
        assert isinstance(labels["app.kubernetes.io/version"], str)


def test_notes_say_how_to_upgrade_the_immutable_job():
    sets = (
        "job.enabled=true",
        "batcher.enabled=true",
        "job.input.configMap=requests",
        "job.output.persistentVolumeClaim=answers",
    )
    notes = render_notes(sets=sets)
    assert "kubectl -n autoglm delete job gpu-open-autoglm-job-batch --cascade=foreground" in notes
    assert "image.tag" in notes
    assert "delete job" not in render_notes()


def test_upgrading_docs_explain_the_immutable_job():
    upgrading = (ROOT / "docs" / "chart.md").read_text().split("## Upgrading", 1)[1]
    assert "job.enabled" in upgrading and "immutable" in upgrading


README = CHART / "README.md"


def _slug(heading: str) -> str:
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def test_helm_show_readme_prints_the_charts_readme():
    shown = helm("show", "readme", str(CHART)).stdout
    assert shown.strip() == README.read_text().strip()
    assert "kube-prometheus-stack" in shown and "helm install" in shown


def test_every_link_of_the_readme_exists_in_the_repository():
    links = re.findall(r"\]\(([^)\s]+)\)", README.read_text())
    assert links
    for link in links:
        assert not re.match(r"^[a-z]+://", link), f"{link}: use a path in the repository"
        path, _, anchor = link.partition("#")
        target = (README.parent / path).resolve()
        assert target.is_relative_to(ROOT) and target.exists(), link
        if anchor:
            headings = re.findall(r"^#+ (.+)$", target.read_text(), flags=re.M)
            assert anchor in {_slug(h) for h in headings}, link
