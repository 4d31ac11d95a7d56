"""The metrics of a process serving several models: each engine's series, and each model's memory.

Every engine keeps its series (``autoglm_batcher_*{model=...}``) in a registry of its own, so a
model can be loaded and unloaded with its metrics (two engines could not register the same
family on one registry). The process's ``/metrics`` merges those registries family by family, so
a scrape sees one ``autoglm_batcher_queue_items`` family with a series per model, exactly as with
one model; an unloaded model's series end with it.

``autoglm_batcher_model_memory_bytes{model}`` is each loaded model's device memory as the
repository accounts it for load decisions: parameters and buffers, plus the learned footprint of
a full batch (absent until learned; on CPU nothing is measured).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from batcher.metrics import PREFIX


class HoldsMemory(Protocol):
    registry: CollectorRegistry

    def memory_bytes(self) -> float: ...


class RepositoryMetrics(Collector):
    """The loaded models' own registries, merged, and their memory; register once per process."""

    def __init__(self) -> None:
        self._models: dict[str, HoldsMemory] = {}

    def add(self, name: str, model: HoldsMemory) -> None:
        self._models[name] = model

    def remove(self, name: str) -> None:
        self._models.pop(name, None)

    def collect(self) -> Iterable[Metric]:
        models = dict(self._models)  # a load or unload may land between two scrapes' steps
        memory = GaugeMetricFamily(
            f"{PREFIX}_model_memory_bytes",
            "Device memory of each loaded model as the repository accounts it for loads: "
            "parameters and buffers plus the learned footprint of a full batch.",
            labels=["model"],
        )
        for name, model in sorted(models.items()):
            memory.add_metric([name], model.memory_bytes())
        yield memory
        yield from merge_families(m.registry.collect for m in models.values())


def merge_families(collects: Iterable[Callable[[], Iterable[Metric]]]) -> list[Metric]:
    """One family per name holding the samples of every registry's family of that name."""
    merged: dict[str, Metric] = {}
    for collect in collects:
        for family in collect():
            into = merged.get(family.name)
            if into is None:
                into = Metric(family.name, family.documentation, family.type, family.unit)
                merged[family.name] = into
            into.samples.extend(family.samples)
    return list(merged.values())
