"""A small client for Prometheus' HTTP query API (instant queries), with auth and TLS.

Only what the controller needs: ``/api/v1/query`` with the answer parsed into samples. Every
failure -- connection refused, timeout, HTTP error, ``"status": "error"``, an unparsable body --
becomes a :class:`PrometheusError` whose ``kind`` names it, so callers can count errors by kind
and never mistake a broken query for a zero.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import requests


class PrometheusError(Exception):
    """A query could not be answered; ``kind`` is one of unreachable, http, query, response."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Sample:
    labels: Mapping[str, str]
    value: float


@dataclass(frozen=True)
class QueryResult:
    """An instant query's answer: ``samples`` for a vector, one label-less sample for a scalar."""

    result_type: str
    samples: tuple[Sample, ...]

    def finite(self) -> bool:
        return all(math.isfinite(s.value) for s in self.samples)


@dataclass
class PrometheusClient:
    """Instant queries against ``url`` (e.g. ``http://prometheus:9090``)."""

    url: str
    bearer_token: str | None = None
    basic_auth: tuple[str, str] | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    insecure_skip_verify: bool = False
    timeout: float = 10.0
    headers: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._session = requests.Session()
        self._session.headers.update(self.headers)
        if self.bearer_token:
            self._session.headers["Authorization"] = f"Bearer {self.bearer_token}"
        if self.basic_auth:
            self._session.auth = self.basic_auth
        if self.insecure_skip_verify:
            self._session.verify = False
        elif self.ca_file:
            self._session.verify = self.ca_file
        if self.cert_file:
            self._session.cert = (
                (self.cert_file, self.key_file) if self.key_file else self.cert_file
            )

    def close(self) -> None:
        self._session.close()

    def query(self, promql: str, at: float | None = None) -> QueryResult:
        """Evaluate ``promql`` at ``at`` (unix seconds; now when None)."""
        form = {"query": promql}
        if at is not None:
            form["time"] = f"{at:.3f}"
        endpoint = self.url.rstrip("/") + "/api/v1/query"
        try:
            resp = self._session.post(endpoint, data=form, timeout=self.timeout)
        except requests.RequestException as exc:
            raise PrometheusError("unreachable", f"{endpoint}: {exc}") from exc
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            kind = "http" if resp.status_code >= 400 else "response"
            raise PrometheusError(kind, f"{endpoint}: HTTP {resp.status_code}, body is not JSON")
        if body.get("status") != "success":
            kind = "query" if resp.status_code in (400, 422) else "http"
            raise PrometheusError(
                kind,
                f"{body.get('errorType', 'error')}: {body.get('error', resp.status_code)}",
            )
        return _parse_data(body.get("data"))


def _parse_data(data: object) -> QueryResult:
    if not isinstance(data, dict):
        raise PrometheusError("response", "answer has no data object")
    kind, result = data.get("resultType"), data.get("result")
    try:
        if kind == "vector":
            samples = tuple(Sample(dict(r["metric"]), float(r["value"][1])) for r in result)
        elif kind == "scalar":
            samples = (Sample({}, float(result[1])),)
        else:
            raise PrometheusError(
                "query", f"query returned a {kind}; write an instant vector or scalar expression"
            )
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise PrometheusError("response", f"malformed {kind} result: {exc}") from exc
    return QueryResult(str(kind), samples)
