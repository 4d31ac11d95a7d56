"""Every dashboard the project ships; a component adds its dashboard with a module and a line."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from grafana_foundation_sdk.builders import dashboard as db

from dashboards import autoscaler, batcher, best_effort, budgets, gpu_fleet, gpu_node, predictor


@dataclass(frozen=True)
class CatalogueEntry:
    filename: str  # under dashboards/json/
    build: Callable[[], db.Dashboard]


DASHBOARDS: tuple[CatalogueEntry, ...] = (
    CatalogueEntry("gpu-fleet-overview.json", gpu_fleet.dashboard),
    CatalogueEntry("gpu-node.json", gpu_node.dashboard),
    CatalogueEntry("batcher.json", batcher.dashboard),
    CatalogueEntry("predictor.json", predictor.dashboard),
    CatalogueEntry("autoscaler.json", autoscaler.dashboard),
    CatalogueEntry("best-effort.json", best_effort.dashboard),
    CatalogueEntry("budgets.json", budgets.dashboard),
)
