"""The batcher's measured service model, read from Prometheus for SLO sizing.

The batcher fits its batch cost ``t(b) = c + a*b`` online and exports both terms with its
largest batch (``autoglm_batcher_cost_fixed_seconds``, ``..._cost_per_item_seconds``,
``..._max_batch_size_items``, one series per batcher), and the spread of one request's service
time (``autoglm_batcher_service_time_scv``). The spec's queries reduce them to one model for the
fleet; if a query still returns several series, the slowest cost terms, the widest spread and
the smallest batch are kept, because a model that is too fast would size the fleet too small.
A batcher from before the spread was exported answers no spread series: the model is then taken
as deterministic (spread 0), as it was before, rather than not sized at all.

With best-effort work on the fleet, an online request may also wait for one best-effort slice
(``autoglm_batcher_best_effort_quantum_seconds``) and SLO sizing reserves it out of the SLO. The
default query answers only while best-effort work ran recently; no series means no best-effort
work and nothing is reserved. Of several batchers the longest slice is kept.

No model yet is an expected state, not a failure: a fresh batcher exports zero costs until it
has timed batches of two sizes. That, and any unreadable answer, raises
:class:`ServiceModelUnavailable`, and the decision falls back to the HPA rule.
"""

from __future__ import annotations

import math
from typing import Protocol

from autoglm.prometheus_api import PrometheusClient, PrometheusError
from autoscaler.core.slo_sizing import ServiceModel
from autoscaler.spec import SloSpec


class ServiceModelUnavailable(Exception):
    """No usable service model; ``kind`` is the error counter's label."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message


class ServiceModelSource(Protocol):
    def read(self, slo: SloSpec) -> ServiceModel:
        """The fleet's service model now, or :class:`ServiceModelUnavailable`."""
        ...

    def best_effort_quantum(self, slo: SloSpec) -> float | None:
        """The longest best-effort slice in seconds, None when no best-effort work runs, or
        :class:`ServiceModelUnavailable`."""
        ...


class PrometheusServiceModels:
    """Reads the model's terms and the best-effort slice with instant queries against one
    Prometheus."""

    def __init__(self, client: PrometheusClient) -> None:
        self.client = client

    def read(self, slo: SloSpec) -> ServiceModel:
        fixed = max(self._values(slo.fixed_seconds_query))
        per_item = max(self._values(slo.per_item_seconds_query))
        max_batch = min(self._values(slo.max_batch_query))
        spread = max(self._values(slo.service_scv_query, required=False), default=0.0)
        if fixed + per_item <= 0:
            raise ServiceModelUnavailable(
                "service_model_unfitted",
                "the batchers have not fitted their batch cost yet (both terms are 0)",
            )
        if max_batch < 1:
            raise ServiceModelUnavailable(
                "service_model_invalid", f"the largest batch is {max_batch:g}, below 1"
            )
        try:
            return ServiceModel(fixed, per_item, math.floor(max_batch), spread)
        except ValueError as exc:
            raise ServiceModelUnavailable("service_model_invalid", str(exc)) from exc

    def best_effort_quantum(self, slo: SloSpec) -> float | None:
        return max(self._values(slo.best_effort_quantum_query, required=False), default=None)

    def _values(self, query: str, *, required: bool = True) -> list[float]:
        """The query's sample values; none is an error only for a ``required`` term."""
        try:
            result = self.client.query(query)
        except PrometheusError as exc:
            raise ServiceModelUnavailable(
                f"prometheus_{exc.kind}", f"prometheus {exc.kind}: {exc}"
            ) from exc
        if not result.samples and not required:
            return []
        if not result.samples:
            raise ServiceModelUnavailable(
                "service_model_empty",
                f"no batcher exports it yet: {query!r} returned no samples",
            )
        if not result.finite():
            raise ServiceModelUnavailable(
                "service_model_nan", f"{query!r} returned NaN or infinity"
            )
        return [s.value for s in result.samples]
