"""Reading one series from Prometheus' HTTP API (``/api/v1/query_range``) with ``requests``.

Auth and TLS follow what Prometheus servers behind a proxy need: a bearer token read from a file
on every request (so a rotated token is picked up), extra headers, a CA bundle or no
verification. Long ranges are split so no request asks for more than Prometheus' 11,000 points
per series. Any failure raises :class:`PrometheusError` with the reason; callers keep their last
good forecast and count the error.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import requests

MAX_POINTS_PER_QUERY = 11000


class PrometheusError(RuntimeError):
    """A query failed: unreachable server, HTTP error, bad PromQL, or an ambiguous result."""


@dataclass
class PrometheusSource:
    """Range queries against one Prometheus server."""

    url: str
    headers: Mapping[str, str] = field(default_factory=dict)
    bearer_token_file: str = ""
    ca_file: str = ""
    insecure_skip_verify: bool = False
    timeout: float = 10.0
    session: requests.Session = field(default_factory=requests.Session, repr=False)

    def _request_headers(self) -> dict[str, str]:
        headers = dict(self.headers)
        if self.bearer_token_file:
            try:
                with open(self.bearer_token_file, encoding="utf-8") as fh:
                    headers["Authorization"] = f"Bearer {fh.read().strip()}"
            except OSError as exc:
                raise PrometheusError(
                    f"cannot read bearer token file {self.bearer_token_file!r}: {exc.strerror}"
                ) from exc
        return headers

    def _verify(self) -> bool | str:
        if self.insecure_skip_verify:
            return False
        return self.ca_file or True

    def query_range(
        self, query: str, start: float, end: float, step: float
    ) -> tuple[np.ndarray, np.ndarray]:
        """Timestamps and values of ``query`` on ``start..end`` every ``step`` seconds.

        The query must yield at most one series (wrap it in ``sum(...)`` otherwise); none
        gives empty arrays. Missing evaluations are simply absent from the result.
        """
        if end < start:
            return np.array([]), np.array([])
        chunk = step * (MAX_POINTS_PER_QUERY - 1)
        times: list[np.ndarray] = []
        values: list[np.ndarray] = []
        chunk_start = start
        while chunk_start <= end:
            chunk_end = min(end, chunk_start + chunk)
            t, v = self._query_chunk(query, chunk_start, chunk_end, step)
            times.append(t)
            values.append(v)
            chunk_start = chunk_end + step
        return np.concatenate(times), np.concatenate(values)

    def _query_chunk(
        self, query: str, start: float, end: float, step: float
    ) -> tuple[np.ndarray, np.ndarray]:
        endpoint = self.url.rstrip("/") + "/api/v1/query_range"
        params = {"query": query, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step}"}
        try:
            response = self.session.get(
                endpoint,
                params=params,
                headers=self._request_headers(),
                timeout=self.timeout,
                verify=self._verify(),
            )
        except requests.RequestException as exc:
            raise PrometheusError(f"Prometheus at {self.url} unreachable: {exc}") from exc
        try:
            body = response.json()
        except ValueError:
            raise PrometheusError(
                f"Prometheus answered HTTP {response.status_code} without JSON"
            ) from None
        if response.status_code != 200 or body.get("status") != "success":
            raise PrometheusError(
                f"query failed (HTTP {response.status_code}): "
                f"{body.get('errorType', '')} {body.get('error', '')}".strip()
            )
        result = body.get("data", {}).get("result", [])
        if len(result) > 1:
            raise PrometheusError(
                f"query returned {len(result)} series; aggregate it to one, e.g. sum(...)"
            )
        if not result:
            return np.array([]), np.array([])
        pairs = result[0].get("values", [])
        t = np.array([float(p[0]) for p in pairs])
        v = np.array([_sample(p[1]) for p in pairs])
        return t, v


def _sample(text: str) -> float:
    value = float(text)
    return value if math.isfinite(value) else math.nan
