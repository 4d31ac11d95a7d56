"""Dashboard variables shared by every dashboard, and the label selectors that use them.

Every dashboard is importable by hand into any Grafana: the data source is a variable of type
prometheus and every panel, target, variable and annotation points at ``${datasource}``.
Multi-value variables use ``.*`` for "All" so that GPUs without pod attribution (no
``namespace`` label) still match when nothing is selected.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models.dashboard import (
    DataSourceRef,
    VariableModel,
    VariableOption,
    VariableRefresh,
    VariableSort,
)

DATASOURCE = DataSourceRef(type_val="prometheus", uid="${datasource}")

GPU_METRIC = "DCGM_FI_DEV_GPU_UTIL"  # every GPU the exporter sees reports utilization
WORKLOAD_METRIC = "namespace_workload_pod:DCGM_FI_DEV_GPU_UTIL:relabel"

ALL = ".*"

GPU_SELECTOR = 'namespace=~"$namespace", Hostname=~"$node", gpu=~"$gpu"'
"""Selects the GPUs picked by the namespace, node and gpu variables on any exporter series."""

DEVICE_SELECTOR = 'Hostname=~"$node", gpu=~"$gpu"'
"""For series the exporter keeps per device without pod labels (the Xid history)."""

WORKLOAD_SELECTOR = 'namespace=~"$namespace", workload=~"$workload"'


def datasource() -> db.DatasourceVariable:
    return db.DatasourceVariable("datasource").label("Data source").type("prometheus")


def _label_values(
    name: str, label: str, metric: str, text: str, sort: VariableSort
) -> db.QueryVariable:
    query = f"label_values({metric}, {label})"
    return (
        db.QueryVariable(name)
        .label(text)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(sort)
        .multi(True)
        .include_all(True)
        .all_value(ALL)
    )


def namespace() -> db.QueryVariable:
    return _label_values(
        "namespace", "namespace", GPU_METRIC, "Namespace", VariableSort.ALPHABETICAL_ASC
    )


def node() -> db.QueryVariable:
    metric = f'{GPU_METRIC}{{namespace=~"$namespace"}}'
    return _label_values("node", "Hostname", metric, "Node", VariableSort.ALPHABETICAL_ASC)


def gpu() -> db.QueryVariable:
    metric = f'{GPU_METRIC}{{namespace=~"$namespace", Hostname=~"$node"}}'
    return _label_values("gpu", "gpu", metric, "GPU", VariableSort.NUMERICAL_ASC)


def workload_variable() -> db.QueryVariable:
    metric = f'{WORKLOAD_METRIC}{{namespace=~"$namespace"}}'
    return _label_values("workload", "workload", metric, "Workload", VariableSort.ALPHABETICAL_ASC)


def standard(*, workload: bool = True) -> list[Builder[VariableModel]]:
    """The variables of a GPU dashboard, in the order they appear; ``workload`` only where
    panels read the workload recording rules."""
    chosen: list[Builder[VariableModel]] = [datasource(), namespace(), node(), gpu()]
    return [*chosen, workload_variable()] if workload else chosen


def label_variable(
    name: str,
    label: str,
    metric: str,
    text: str,
    sort: VariableSort = VariableSort.ALPHABETICAL_ASC,
) -> db.QueryVariable:
    """A multi-value variable over the values of ``label`` on ``metric`` ("All" is ``.*``).

    For the component dashboards (batcher, predictor, autoscaler), whose series carry their
    own labels rather than the GPU ones.
    """
    return _label_values(name, label, metric, text, sort)


def single_value_variable(
    name: str,
    label: str,
    metric: str,
    text: str,
    example: str,
    sort: VariableSort = VariableSort.ALPHABETICAL_ASC,
) -> db.QueryVariable:
    """One value of ``label`` on ``metric``, for places a regex cannot go (``offset ${x}s``).

    ``example`` is the value selected before Grafana has asked Prometheus, and the value the
    lint uses to make queries concrete; Grafana replaces it by a real one on load when absent.
    """
    return (
        db.QueryVariable(name)
        .label(text)
        .datasource(DATASOURCE)
        .query(f"label_values({metric}, {label})")
        .refresh(VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(sort)
        .multi(False)
        .include_all(False)
        .current(VariableOption(selected=True, text=example, value=example))
    )
