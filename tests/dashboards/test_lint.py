"""Lint of the committed dashboard JSON: what a Grafana import and a reviewer would trip over.

Syntax of every PromQL query is checked by the real promtool (each query becomes the expression
of a recording rule in a temporary rules file, and ``promtool check rules`` parses them all);
the metric names each query reads must be produced by the project: the exporter (as it really
renders a snapshot) or a recording rule of ``alerts/rules.yaml``.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import yaml
from prometheus_client import CollectorRegistry

from autoglm.webconfig import WebConfig
from autoscaler.controller.budget import BudgetMetrics
from autoscaler.metrics import AutoscalerMetrics
from batcher.front_worker import FrontServer
from batcher.metrics import BatcherMetrics
from batcher.worker_pool import WorkerPool, WorkerSettings
from dashboards import gpu_node
from dashboards.catalogue import DASHBOARDS
from dashboards.queries import (
    BUILTINS,
    example_values,
    make_concrete,
    metric_names,
    panels,
    queries,
    variables_used,
)
from exporter.collector import Collector
from exporter.podresources import PodRef
from exporter.render import render
from exporter.sources import SimulatedSource, load_profile, parse_fault
from jobs.metrics import JobMetrics
from predictor.config import TargetConfig
from predictor.metrics import PredictorMetrics
from predictor.service import PredictorService

ROOT = Path(__file__).resolve().parents[2]
JSON_DIR = ROOT / "dashboards" / "json"
RULES = ROOT / "alerts" / "rules.yaml"
GRID_COLUMNS = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
PROMETHEUS_MADE = {"ALERTS"}  # written by Prometheus for the alerting rules in alerts/rules.yaml
UNITLESS_PANELS = {"row", "state-timeline", "table"}  # units sit on fields or do not apply


def _load_all() -> dict[str, dict[str, Any]]:
    return {e.filename: json.loads((JSON_DIR / e.filename).read_text()) for e in DASHBOARDS}


DASHBOARD_JSON = _load_all()
FILES = sorted(DASHBOARD_JSON)


class _PodResources:
    healthy = True
    last_success = 1.0


@pytest.fixture(scope="module")
def exporter_metrics() -> set[str]:
    """Metric names the exporter really renders: a simulated GPU with an Xid, pods attributed."""
    source = SimulatedSource(2, "NVIDIA H100 80GB HBM3", 1, load_profile("constant:0.5"))
    source.inject(parse_fault("xid:gpu=0:code=79"))  # Xid series exist after the first Xid
    source.inject(parse_fault("field-error:gpu=1:field=DCGM_FI_DEV_POWER_USAGE"))  # error series
    collector = Collector(source, publish=lambda _: None)
    try:
        snapshot = collector.collect_once()
    finally:
        collector.stop()
        source.close()
    uuid = source.devices()[0].uuid
    exposition = render(
        snapshot,
        "dcgm",
        "lint-node",
        attribution={uuid: [PodRef("llm", "llama-7d9f8c6b5-x2x4q", "server")]},
        pod_resources=_PodResources(),
    )
    text = exposition.body("text", time.time(), compressed=False).decode()
    types = [line.split()[2:4] for line in text.splitlines() if line.startswith("# TYPE ")]
    suffixes = {"histogram": ("_bucket", "_sum", "_count")}
    return {name + suffix for name, kind in types for suffix in suffixes.get(kind, ("",))}


def _series_names(registry: CollectorRegistry) -> set[str]:
    """The series names a registry exposes, labelled children or not (a family without
    children still says what its samples will be called)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}
    names = set()
    for family in registry.collect():
        names |= {family.name + s for s in suffixes.get(family.type, ("",))}
        names |= {sample.name for sample in family.samples}
    return names


@pytest.fixture(scope="module")
def component_metrics() -> set[str]:
    """Series of the batcher (memory statistics as on CUDA; the front workers' and their
    supervisor's, as ``--workers`` adds them), predictor, autoscaler and job runner, from their
    real metrics classes; the predictor's forecast families from a fitted service."""
    batcher = BatcherMetrics(CollectorRegistry(), "demo", slo_seconds=0.25, max_batch_size=8)
    cuda_stats = [
        "allocated_bytes",
        "reserved_bytes",
        "reserved_unallocated_bytes",
        "inactive_split_bytes",
        "alloc_retries",
        "ooms",
    ]
    batcher.watch_memory(lambda: dict.fromkeys(cuda_stats, 1.0))
    workers = CollectorRegistry()
    WorkerPool(cast(WorkerSettings, SimpleNamespace(count=1)), workers)  # reads only the count
    FrontServer(
        0,
        Path(),
        WebConfig(),
        max_body_bytes=1024,
        body_timeout_seconds=1.0,
        drain_timeout_seconds=1.0,
        registry=workers,
    )
    predictor = PredictorMetrics()
    target = TargetConfig(name="requests", step=60, horizons=(1, 5), seasons=(), models=("naive",))
    service = PredictorService([target], metrics=predictor, clock=lambda: 6000.0)
    for minute in range(60):
        service.observe("requests", minute * 60.0, 100.0 + minute % 7)
    assert service.refit("requests")
    return (
        _series_names(batcher.registry)
        | _series_names(workers)
        | _series_names(predictor.registry)
        | _series_names(AutoscalerMetrics().registry)
        | _series_names(BudgetMetrics(CollectorRegistry()).registry)
        | _series_names(_job_registry())
    )


def _job_registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    JobMetrics(registry, "nightly")
    return registry


@pytest.fixture(scope="module")
def recorded_metrics() -> set[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return {r["record"] for g in groups for r in g["rules"] if "record" in r}


@pytest.mark.parametrize("filename", FILES)
def test_json_loads_and_is_importable(filename: str) -> None:
    dashboard = DASHBOARD_JSON[filename]
    assert dashboard["title"] and dashboard["uid"]
    assert "id" not in dashboard or dashboard["id"] is None, "an id would clash on import"
    assert len(dashboard["uid"]) <= 40, "Grafana rejects uids longer than 40 characters"


def test_uids_are_unique() -> None:
    uids = [d["uid"] for d in DASHBOARD_JSON.values()]
    assert len(uids) == len(set(uids))


@pytest.mark.parametrize("filename", FILES)
def test_panel_ids_are_unique_and_grid_positions_valid(filename: str) -> None:
    all_panels = panels(DASHBOARD_JSON[filename])
    ids = [p["id"] for p in all_panels]
    assert len(ids) == len(set(ids)), f"duplicate panel ids in {filename}"
    cells: dict[tuple[int, int], str] = {}
    for panel in all_panels:
        grid = panel["gridPos"]
        assert grid["w"] >= 1 and grid["h"] >= 1 and grid["x"] >= 0 and grid["y"] >= 0
        assert grid["x"] + grid["w"] <= GRID_COLUMNS, f"{panel['title']} overflows 24 columns"
        for x in range(grid["x"], grid["x"] + grid["w"]):
            for y in range(grid["y"], grid["y"] + grid["h"]):
                other = cells.setdefault((x, y), panel["title"])
                assert other == panel["title"], f"{panel['title']} overlaps {other}"


@pytest.mark.parametrize("filename", FILES)
def test_every_variable_used_is_defined(filename: str) -> None:
    dashboard = DASHBOARD_JSON[filename]
    defined = {v["name"] for v in dashboard["templating"]["list"]} | set(BUILTINS)
    used = variables_used(json.dumps(dashboard))
    assert used <= defined, f"undefined variables: {sorted(used - defined)}"


@pytest.mark.parametrize("filename", FILES)
def test_everything_reads_the_datasource_variable(filename: str) -> None:
    dashboard = DASHBOARD_JSON[filename]
    (source,) = [v for v in dashboard["templating"]["list"] if v["type"] == "datasource"]
    assert source["name"] == "datasource" and source["query"] == "prometheus"
    for panel in panels(dashboard):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], f"{panel['title']} has no query"
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
    for annotation in dashboard["annotations"].get("list", []):
        assert annotation["datasource"] == DATASOURCE, annotation["name"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            assert variable["datasource"] == DATASOURCE, variable["name"]


@pytest.mark.parametrize("filename", FILES)
def test_panels_have_descriptions_and_units(filename: str) -> None:
    for panel in panels(DASHBOARD_JSON[filename]):
        if panel["type"] == "row":
            continue
        assert panel.get("description"), f"{panel['title']}: say what question it answers"
        if panel["type"] not in UNITLESS_PANELS:
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{panel['title']}: no unit"
        for target in panel["targets"]:
            if panel["type"] == "timeseries" and len(panel["targets"]) > 1:
                assert target.get("legendFormat"), f"{panel['title']}: series need legends"


@pytest.mark.live
def test_every_query_parses_in_promtool(tmp_path: Path) -> None:
    concrete = [
        make_concrete(q.expr, example_values(d))
        for d in DASHBOARD_JSON.values()
        for q in queries(d)
    ]
    rules = [
        {"record": f"dashboard_lint:query_{i}:parse", "expr": expr}
        for i, expr in enumerate(concrete)
    ]
    path = tmp_path / "dashboard-queries.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "lint", "rules": rules}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout


@pytest.mark.live
def test_the_parse_check_catches_a_broken_query(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    broken = make_concrete('sum(rate(DCGM_FI_DEV_GPU_UTIL{gpu=~"$gpu"}[$__rate_interval])')
    rule = {"record": "dashboard_lint:broken:parse", "expr": broken}
    path.write_text(yaml.safe_dump({"groups": [{"name": "lint", "rules": [rule]}]}))
    result = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    assert result.returncode != 0


def test_every_metric_is_produced_by_the_project(
    exporter_metrics: set[str], component_metrics: set[str], recorded_metrics: set[str]
) -> None:
    known = exporter_metrics | component_metrics | recorded_metrics | PROMETHEUS_MADE
    for dashboard in DASHBOARD_JSON.values():
        for query in queries(dashboard):
            unknown = metric_names(make_concrete(query.expr, example_values(dashboard))) - known
            assert not unknown, f"{query.dashboard} / {query.where}: {sorted(unknown)}"


def test_node_dashboard_shows_every_exporter_metric(exporter_metrics: set[str]) -> None:
    node = DASHBOARD_JSON[next(e.filename for e in DASHBOARDS if e.build is gpu_node.dashboard)]
    shown = {name for q in queries(node) for name in metric_names(make_concrete(q.expr))}
    assert exporter_metrics - shown == set()


def test_metric_scanner_finds_names_not_functions_or_labels() -> None:
    expr = (
        'sum by (Hostname) (max without (pod) (rate(a_total{x=~"b|c"}[5m]))) / on () '
        "group_left (l) (b:rec:sum offset 1m) or vector(0) and time() - c"
    )
    assert metric_names(expr) == {"a_total", "b:rec:sum", "c"}


def test_single_value_variables_carry_an_example_that_makes_queries_parse() -> None:
    """``offset ${horizon}s`` only parses with a number in it: the lint must supply one."""
    predictor = next(d for d in DASHBOARD_JSON.values() if d["uid"] == "autoglm-predictor")
    values = example_values(predictor)
    assert values["horizon"].isdigit()
    shifted = [q.expr for q in queries(predictor) if "offset ${horizon}s" in q.expr]
    assert shifted, "the observed-vs-forecast panel shifts forecasts by their horizon"
    assert all(f"offset {values['horizon']}s" in make_concrete(e, values) for e in shifted)
