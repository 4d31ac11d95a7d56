"""Prometheus annotation queries: events (Xid errors, clock throttling) marked on every graph.

The SDK's ``AnnotationQuery`` model lacks the Prometheus-specific fields Grafana reads
(``titleFormat``, ``tagKeys``, ``step``), so this module extends the model with them rather than
patching JSON after the fact.
"""

from __future__ import annotations

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models.dashboard import AnnotationQuery

from dashboards.variables import DATASOURCE


class PrometheusAnnotationQuery(AnnotationQuery):
    """An annotation whose events are the samples of a PromQL expression."""

    def __init__(
        self, name: str, expr: str, color: str, title_format: str, tag_keys: str, step: str
    ) -> None:
        super().__init__(name=name, datasource=DATASOURCE, enable=True, icon_color=color, expr=expr)
        self.title_format = title_format
        self.tag_keys = tag_keys
        self.step = step

    def to_json(self) -> dict[str, object]:
        payload = super().to_json()
        payload.update(
            {
                "titleFormat": self.title_format,
                "tagKeys": self.tag_keys,
                "step": self.step,
                "useValueForTime": False,
            }
        )
        return payload


class PrometheusAnnotation(cogbuilder.Builder[AnnotationQuery]):
    """Builder for :class:`PrometheusAnnotationQuery`, accepted by ``Dashboard.annotation``."""

    def __init__(
        self,
        name: str,
        expr: str,
        *,
        color: str,
        title_format: str,
        tag_keys: str,
        step: str = "30s",
    ) -> None:
        self._query = PrometheusAnnotationQuery(name, expr, color, title_format, tag_keys, step)

    def build(self) -> AnnotationQuery:
        return self._query
