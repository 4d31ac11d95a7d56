"""Turns a metric's PromQL query into the decision core's input.

A Pods metric's query must return one series per pod, keyed by a label (``pod`` by default, as
kube-state-metrics, cAdvisor and dcgm-exporter label them); the values are matched to the pods of
the target, and a pod without a series has no sample (the HPA's missing-pod rules then apply). An
Object metric's query must return one value; an External metric's query may return several series,
which are summed, as the HPA sums an external metric's matching series.

Anything that is not a trustworthy number becomes ``MetricInput.error``: Prometheus unreachable,
an HTTP or query error, an empty answer, NaN or infinity, a Pods answer without the pod label, a
negative value for a pod (no per-pod load or share of a request is below zero; taken at face value,
one would shrink the fleet). The core never scales down while any metric has an error, so a broken
query can never shrink a fleet.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Protocol

from autoglm.prometheus_api import PrometheusClient, PrometheusError, QueryResult
from autoscaler.core import MetricInput
from autoscaler.core.replica_calculator import PodSample
from autoscaler.spec import MetricSpec

log = logging.getLogger(__name__)

ErrorCounter = Callable[[str], None]


def _no_count(kind: str) -> None:
    pass


class _Unusable(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class MetricsSource(Protocol):
    """Where metric values come from (Prometheus in a cluster; a scraper in the local stack)."""

    def read(
        self, metric: MetricSpec, pods: Sequence[PodSample] | None, count_error: ErrorCounter
    ) -> MetricInput:
        """The metric's current reading; errors go in the result (and to ``count_error(kind)``)."""
        ...


class PrometheusMetricsSource:
    """Reads metrics with instant queries against one Prometheus."""

    def __init__(self, client: PrometheusClient, pod_label: str = "pod") -> None:
        self.client = client
        self.pod_label = pod_label
        self._warned_negative: set[str] = set()  # metrics whose negative reading was logged

    def read(
        self,
        metric: MetricSpec,
        pods: Sequence[PodSample] | None,
        count_error: ErrorCounter = _no_count,
    ) -> MetricInput:
        try:
            return self._read(metric, pods)
        except _Unusable as exc:
            count_error(exc.kind)
            kept = tuple(pods) if pods is not None else None
            return MetricInput(spec=metric, pods=kept, error=exc.message)

    def _read(self, metric: MetricSpec, pods: Sequence[PodSample] | None) -> MetricInput:
        try:
            result = self.client.query(metric.query)
        except PrometheusError as exc:
            raise _Unusable(f"prometheus_{exc.kind}", f"prometheus {exc.kind}: {exc}") from exc
        if not result.samples:
            raise _Unusable(
                "metric_empty",
                f"query returned no samples: {metric.query!r}; check the metric exists "
                "and its labels match",
            )
        if not result.finite():
            raise _Unusable("metric_nan", f"query returned NaN or infinity: {metric.query!r}")
        if metric.source == "Pods":
            return self._pods_input(metric, pods, result)
        return self._scalar_input(metric, result)

    def _pods_input(
        self, metric: MetricSpec, pods: Sequence[PodSample] | None, result: QueryResult
    ) -> MetricInput:
        if pods is None:
            raise _Unusable("pods_unavailable", "the target's pods could not be listed")
        values: dict[str, float] = {}
        for sample in result.samples:
            pod = sample.labels.get(self.pod_label)
            if pod is None:
                raise _Unusable(
                    "metric_shape",
                    f"a Pods metric's query must return one series per pod labelled "
                    f"{self.pod_label!r}; aggregate it, e.g. avg by ({self.pod_label}) (...)",
                )
            if pod in values:
                raise _Unusable(
                    "metric_shape",
                    f"query returned several series for {self.pod_label}={pod!r}; "
                    f"aggregate it, e.g. avg by ({self.pod_label}) (...)",
                )
            values[pod] = sample.value
        negative = sorted(p for p, v in values.items() if v < 0)
        if negative:
            message = (
                f"query returned a negative value for {self.pod_label}={negative[0]!r} "
                f"({values[negative[0]]:g}); a Pods metric must be >= 0: check {metric.query!r}"
            )
            if metric.name not in self._warned_negative:  # once per metric, not every reconcile
                self._warned_negative.add(metric.name)
                log.warning("negative Pods metric held", extra={"metric": metric.name})
            raise _Unusable("metric_negative", message)
        filled = tuple(replace(p, value=values.get(p.name)) for p in pods)
        return MetricInput(spec=metric, pods=filled)

    def _scalar_input(self, metric: MetricSpec, result: QueryResult) -> MetricInput:
        if metric.source == "Object" and len(result.samples) > 1:
            raise _Unusable(
                "metric_shape",
                f"an Object metric's query must return one series, got {len(result.samples)}; "
                "aggregate it (sum, max) or narrow the selector",
            )
        value = math.fsum(s.value for s in result.samples)
        return MetricInput(spec=metric, value=value)
