"""Shared panel builders: one call per panel kind, with the project's defaults applied.

Defaults encode the conventions reviewers check: every panel and target uses the ``${datasource}``
variable, has a unit and a description (the question it answers), and time series show a table
legend with mean/max/last so values are readable without hovering. Reference IDs are assigned
here (A, B, C...) and panel IDs by ``output`` when the dashboard is serialised.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from grafana_foundation_sdk.builders import (
    bargauge,
    common,
    prometheus,
    stat,
    statetimeline,
    table,
    timeseries,
)
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog import variants
from grafana_foundation_sdk.cog.builder import Builder
from grafana_foundation_sdk.models.common import (
    BigValueColorMode,
    BigValueGraphMode,
    GraphDrawStyle,
    LegendDisplayMode,
    LegendPlacement,
    SortOrder,
    StackingMode,
    TooltipDisplayMode,
    VizOrientation,
)
from grafana_foundation_sdk.models.dashboard import (
    DataTransformerConfig,
    DynamicConfigValue,
    FieldColorModeId,
    Threshold,
    ThresholdsMode,
    ValueMapping,
)
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from dashboards.variables import DATASOURCE

Step = tuple[float | None, str]
"""A threshold step: from this value up (``None`` = from minus infinity), use this colour."""

GOOD: tuple[Step, ...] = ((None, "green"),)


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel."""

    expr: str
    legend: str = ""
    instant: bool = False


def thresholds(steps: Sequence[Step]) -> db.ThresholdsConfig:
    return (
        db.ThresholdsConfig()
        .mode(ThresholdsMode.ABSOLUTE)
        .steps([Threshold(value=value, color=color) for value, color in steps])
    )


def _targets(
    queries: Sequence[Query], table_format: bool = False
) -> list[Builder[variants.Dataquery]]:
    built: list[Builder[variants.Dataquery]] = []
    for index, query in enumerate(queries):
        target = (
            prometheus.Dataquery()
            .datasource(DATASOURCE)
            .ref_id(chr(ord("A") + index))
            .expr(query.expr)
        )
        if query.legend:
            target = target.legend_format(query.legend)
        target = target.instant() if query.instant or table_format else target.range()
        if table_format:
            target = target.format(PromQueryFormat.TABLE)
        built.append(target)
    return built


def _legend() -> common.VizLegendOptions:
    return (
        common.VizLegendOptions()
        .display_mode(LegendDisplayMode.TABLE)
        .placement(LegendPlacement.BOTTOM)
        .show_legend(True)
        .calcs(["mean", "max", "lastNotNull"])
    )


def _tooltip() -> common.VizTooltipOptions:
    return common.VizTooltipOptions().mode(TooltipDisplayMode.MULTI).sort(SortOrder.DESCENDING)


def timeseries_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    *,
    width: int = 12,
    height: int = 8,
    min_value: float | None = None,
    max_value: float | None = None,
    steps: Sequence[Step] = GOOD,
    stacked: bool = False,
    bars: bool = False,
    dashed: Sequence[str] = (),
) -> timeseries.Panel:
    """A time series; series whose legend is in ``dashed`` (targets, limits) draw dashed."""
    panel = (
        timeseries.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .span(width)
        .height(height)
        .thresholds(thresholds(steps))
        .legend(_legend())
        .tooltip(_tooltip())
        .fill_opacity(10)
        .line_width(1)
    )
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    if stacked:
        panel = panel.stacking(common.StackingConfig().mode(StackingMode.NORMAL)).fill_opacity(40)
    if bars:
        panel = panel.draw_style(GraphDrawStyle.BARS).fill_opacity(80)
    for name in dashed:
        panel = panel.override_by_name(
            name,
            [
                DynamicConfigValue(
                    id_val="custom.lineStyle", value={"fill": "dash", "dash": [10, 10]}
                ),
                DynamicConfigValue(id_val="custom.fillOpacity", value=0),
                DynamicConfigValue(id_val="custom.lineWidth", value=2),
            ],
        )
    return panel


def stat_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    *,
    width: int = 4,
    height: int = 4,
    steps: Sequence[Step] = GOOD,
    decimals: int | None = None,
) -> stat.Panel:
    """A single value (the last one) coloured by its thresholds, with a sparkline."""
    panel = (
        stat.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .span(width)
        .height(height)
        .thresholds(thresholds(steps))
        .color_mode(BigValueColorMode.VALUE)
        .graph_mode(BigValueGraphMode.AREA)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if decimals is not None:
        panel = panel.decimals(decimals)
    return panel


def bar_gauge_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    *,
    width: int = 12,
    height: int = 8,
    steps: Sequence[Step] = GOOD,
    min_value: float | None = None,
    max_value: float | None = None,
) -> bargauge.Panel:
    """Horizontal bars, one per series, for ranking (workloads, GPUs) at the last value."""
    panel = (
        bargauge.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .unit(unit)
        .span(width)
        .height(height)
        .thresholds(thresholds(steps))
        .orientation(VizOrientation.HORIZONTAL)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    if min_value is not None:
        panel = panel.min(min_value)
    if max_value is not None:
        panel = panel.max(max_value)
    return panel


def state_timeline_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    *,
    width: int = 24,
    height: int = 8,
    steps: Sequence[Step] = GOOD,
    mappings: Sequence[ValueMapping] = (),
) -> statetimeline.Panel:
    """Discrete states over time (clock event reasons, flags), coloured by thresholds."""
    panel = (
        statetimeline.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets(queries))
        .span(width)
        .height(height)
        .thresholds(thresholds(steps))
        .color_scheme(db.FieldColor().mode(FieldColorModeId.THRESHOLDS))
        .legend(common.VizLegendOptions().show_legend(True).display_mode(LegendDisplayMode.LIST))
        .merge_values(True)
    )
    if mappings:
        panel = panel.mappings(list(mappings))
    return panel


@dataclass(frozen=True)
class Column:
    """A value column of a table: one instant query, shown under ``title`` in ``unit``."""

    title: str
    expr: str
    unit: str
    steps: Sequence[Step] = GOOD


def table_panel(
    title: str,
    description: str,
    key_labels: Sequence[str],
    columns: Sequence[Column],
    *,
    sort_by: str,
    sort_desc: bool = False,
    width: int = 24,
    height: int = 8,
) -> table.Panel:
    """One row per label set in ``key_labels``, one coloured column per instant query.

    Each column's query must aggregate ``by`` exactly ``key_labels`` so that Grafana's merge
    transformation lines the rows up; the organize transformation hides the time column and
    names the value columns.
    """
    renames = {f"Value #{chr(ord('A') + i)}": c.title for i, c in enumerate(columns)}
    order = {label: i for i, label in enumerate(key_labels)}
    order.update({f"Value #{chr(ord('A') + i)}": len(key_labels) + i for i in range(len(columns))})
    panel = (
        table.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .targets(_targets([Query(c.expr) for c in columns], table_format=True))
        .span(width)
        .height(height)
        .with_transformation(DataTransformerConfig(id_val="merge", options={}))
        .with_transformation(
            DataTransformerConfig(
                id_val="organize",
                options={
                    "excludeByName": {"Time": True},
                    "indexByName": order,
                    "renameByName": renames,
                },
            )
        )
        .sort_by([common.TableSortByFieldState().display_name(sort_by).desc(sort_desc)])
    )
    for column in columns:
        panel = panel.override_by_name(
            column.title,
            [
                DynamicConfigValue(id_val="unit", value=column.unit),
                DynamicConfigValue(
                    id_val="thresholds",
                    value={
                        "mode": "absolute",
                        "steps": [{"value": v, "color": c} for v, c in column.steps],
                    },
                ),
                DynamicConfigValue(
                    id_val="custom.cellOptions", value={"type": "color-background", "mode": "basic"}
                ),
            ],
        )
    return panel


def row(title: str) -> db.Row:
    return db.Row(title)
