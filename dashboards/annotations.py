"""Prometheus annotation queries: events (Xid errors, clock throttling) marked on every graph.

The SDK's ``AnnotationQuery`` model lacks the Prometheus-specific fields Grafana reads
(``titleFormat``, ``tagKeys``, ``step``), so this module extends the model with them rather than
patching JSON after the fact.
"""

from __future__ import annotations

from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.models.dashboard import AnnotationQuery

from dashboards.expressions import new_or_increased, per_gpu
from dashboards.variables import DATASOURCE, DEVICE_SELECTOR

XID_SERIES = f"autoglm_gpu_xid_errors_total{{{DEVICE_SELECTOR}}}"
REASONS = "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"


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


def xid_annotation() -> PrometheusAnnotation:
    """A marker for every Xid the driver reported on the selected GPUs, titled with its code."""
    return PrometheusAnnotation(
        "Xid errors",
        new_or_increased(XID_SERIES, "2m"),
        color="red",
        title_format="Xid {{xid}}",
        tag_keys="Hostname,gpu,xid",
    )


def throttle_annotation() -> PrometheusAnnotation:
    """Regions where the selected GPUs' clocks were held down by power or heat.

    NVML clocks event reason bits: 0x4 SW power cap, 0x8 HW slowdown, 0x20 SW thermal,
    0x40 HW thermal, 0x80 HW power brake; ``floor(x / 2^k) % 2^n`` picks n bits from bit k.
    """
    reasons = per_gpu(REASONS)
    return PrometheusAnnotation(
        "Clock throttling",
        f"(floor({reasons} / 4) % 4 > 0) or (floor({reasons} / 32) % 8 > 0)",
        color="orange",
        title_format="Clocks throttled (power or thermal)",
        tag_keys="Hostname,gpu",
    )
