"""The one client of Prometheus' HTTP query API: instant and range queries, with auth and TLS.

Auth and TLS cover what a Prometheus behind a proxy or an operator asks for: a bearer token given
as text or as a file, basic auth with the password as text or as a file, extra headers (e.g. a
tenant's ``X-Scope-OrgID``), a CA bundle, a client certificate and key (mTLS), or no verification.
Token and password files are read on every request, so a rotated Kubernetes service-account token
is picked up without a restart.

Every failure raises :class:`PrometheusError` whose ``kind`` names it -- ``unreachable``
(connection, TLS or timeout), ``http`` (an error status without a query error), ``query`` (bad
PromQL or a result of the wrong type), ``response`` (an unparsable answer), ``credentials`` (a
token or password file that cannot be read) -- so callers count errors by kind and never mistake a
broken query for a zero.

Range queries are split so that no request asks for more than Prometheus' limit of 11,000 points
per series; the series of the pieces are joined by their labels.

:class:`PrometheusAccessConfig` holds the same options as configuration fields
(``--prometheus-bearer-token-file`` ...) for components whose config classes extend it.
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import numpy as np
import requests

from autoglm.config import ConfigError

MAX_POINTS_PER_QUERY = 11000
"""Prometheus refuses range queries that would return more points than this per series."""


def shown_url(url: str) -> str:
    """``url`` as it may appear in a log line, an error or an Event: a password written into it
    (``http://user:secret@host``) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{parts.username}:***@{host}"))


class PrometheusError(Exception):
    """A query could not be answered; ``kind`` is unreachable, http, query, response or
    credentials."""

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


@dataclass(frozen=True)
class RangeSeries:
    """One series of a range query: timestamps (unix seconds) and values, ascending in time.

    Steps at which the expression had no value are absent, not NaN.
    """

    labels: Mapping[str, str]
    timestamps: np.ndarray
    values: np.ndarray


@dataclass
class PrometheusClient:
    """Queries against the Prometheus at ``url`` (e.g. ``http://prometheus:9090``)."""

    url: str
    bearer_token: str = ""
    bearer_token_file: str = ""
    username: str = ""
    password: str = ""
    password_file: str = ""
    headers: Mapping[str, str] = field(default_factory=dict)
    ca_file: str = ""
    cert_file: str = ""
    key_file: str = ""
    insecure_skip_verify: bool = False
    timeout: float = 10.0
    max_points_per_query: int = MAX_POINTS_PER_QUERY

    def __post_init__(self) -> None:
        if (self.bearer_token or self.bearer_token_file) and self.username:
            raise ValueError("use either a bearer token or basic auth for Prometheus, not both")
        if self.bearer_token and self.bearer_token_file:
            raise ValueError("give the bearer token as text or as a file, not both")
        if self.password and self.password_file:
            raise ValueError("give the basic auth password as text or as a file, not both")
        if self.key_file and not self.cert_file:
            raise ValueError("a client key needs its client certificate (cert_file)")
        if self.max_points_per_query < 2:
            raise ValueError("max_points_per_query must be >= 2")
        self._session = requests.Session()
        # Passed with every request: a Session's own ``verify`` loses to REQUESTS_CA_BUNDLE.
        self._verify: bool | str = False if self.insecure_skip_verify else (self.ca_file or True)
        self._cert: tuple[str, str] | str | None = None
        if self.cert_file:
            self._cert = (self.cert_file, self.key_file) if self.key_file else self.cert_file

    def close(self) -> None:
        self._session.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_credentials(self) -> None:
        """Read the token and password files now, so a wrong path shows at startup."""
        self._auth_headers()

    def query(self, promql: str, at: float | None = None) -> QueryResult:
        """Evaluate ``promql`` at ``at`` (unix seconds; now when None)."""
        form = {"query": promql}
        if at is not None:
            form["time"] = f"{at:.3f}"
        return _parse_instant(self._post("/api/v1/query", form))

    def query_range(
        self, promql: str, start: float, end: float, step: float
    ) -> tuple[RangeSeries, ...]:
        """Evaluate ``promql`` on ``start..end`` (unix seconds) every ``step`` seconds.

        Split into requests of at most ``max_points_per_query`` points; a series that appears in
        several pieces comes back once, joined. An empty range gives no series.
        """
        if step <= 0:
            raise ValueError("step must be > 0 seconds")
        joined: dict[tuple[tuple[str, str], ...], list[tuple[float, float]]] = {}
        labels_of: dict[tuple[tuple[str, str], ...], dict[str, str]] = {}
        chunk = step * (self.max_points_per_query - 1)
        chunk_start = start
        while chunk_start <= end:
            chunk_end = min(end, chunk_start + chunk)
            form = {
                "query": promql,
                "start": f"{chunk_start:.3f}",
                "end": f"{chunk_end:.3f}",
                "step": f"{step:g}",
            }
            for labels, pairs in _parse_matrix(self._post("/api/v1/query_range", form)):
                key = tuple(sorted(labels.items()))
                labels_of.setdefault(key, labels)
                joined.setdefault(key, []).extend(pairs)
            chunk_start = chunk_end + step
        return tuple(
            RangeSeries(
                labels_of[key],
                np.array([t for t, _ in pairs], dtype=float),
                np.array([v for _, v in pairs], dtype=float),
            )
            for key, pairs in joined.items()
        )

    def _post(self, path: str, form: dict[str, str]) -> dict[str, Any]:
        endpoint = self.url.rstrip("/") + path
        shown = shown_url(endpoint)
        headers = {**self.headers, **self._auth_headers()}
        try:
            resp = self._session.post(
                endpoint,
                data=form,
                headers=headers,
                timeout=self.timeout,
                verify=self._verify,
                cert=self._cert,
            )
        except (requests.RequestException, OSError) as exc:
            # OSError (ssl.SSLError among them): requests loads the CA bundle and the client
            # certificate at each request, and one removed or unreadable since startup raises
            # a plain OSError there, not a RequestException.
            raise PrometheusError("unreachable", f"{shown}: {exc}") from exc
        try:
            body = resp.json()
        except ValueError:
            body = None
        if not isinstance(body, dict):
            kind = "http" if resp.status_code >= 400 else "response"
            raise PrometheusError(kind, f"{shown}: HTTP {resp.status_code}, body is not JSON")
        if body.get("status") != "success":
            kind = "query" if resp.status_code in (400, 422) else "http"
            raise PrometheusError(
                kind,
                f"HTTP {resp.status_code}, {body.get('errorType', 'error')}: "
                f"{body.get('error', 'no error message')}",
            )
        return body

    def _auth_headers(self) -> dict[str, str]:
        token = self.bearer_token
        if self.bearer_token_file:
            token = _read_secret(self.bearer_token_file, "bearer token")
        if token:
            return {"Authorization": f"Bearer {token}"}
        if self.username:
            password = self.password
            if self.password_file:
                password = _read_secret(self.password_file, "password")
            pair = base64.b64encode(f"{self.username}:{password}".encode()).decode("ascii")
            return {"Authorization": f"Basic {pair}"}
        return {}


def _read_secret(path: str, what: str) -> str:
    try:
        with open(path, encoding="utf-8") as fh:
            return fh.read().strip()
    except OSError as exc:
        raise PrometheusError(
            "credentials", f"cannot read {what} file {path!r}: {exc.strerror}"
        ) from exc


def _parse_instant(body: dict[str, Any]) -> QueryResult:
    data = body.get("data")
    if not isinstance(data, dict):
        raise PrometheusError("response", "answer has no data object")
    kind = data.get("resultType")
    result: Any = data.get("result")
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


def _parse_matrix(body: dict[str, Any]) -> list[tuple[dict[str, str], list[tuple[float, float]]]]:
    data = body.get("data")
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        raise PrometheusError("response", "range query answer has no matrix result")
    try:
        return [
            (dict(r["metric"]), [(float(t), float(v)) for t, v in r["values"]])
            for r in data["result"]
        ]
    except (KeyError, TypeError, ValueError) as exc:
        raise PrometheusError("response", f"malformed matrix result: {exc}") from exc


@dataclass(frozen=True)
class PrometheusAccessConfig:
    """Auth and TLS settings for reaching Prometheus, shared by the components' config classes.

    A component's config dataclass extends this one (with its own ``prometheus_timeout``, in the
    component's style of durations), calls ``super().__post_init__()`` and builds its client with
    :meth:`prometheus_client`, so every component takes the same ``--prometheus-*`` flags.
    """

    prometheus_url: str = field(
        default="http://localhost:9090", metadata={"help": "Prometheus base URL to query"}
    )
    prometheus_bearer_token_file: str = field(
        default="",
        metadata={"help": "file with a bearer token for Prometheus, read at every query"},
    )
    prometheus_username: str = field(
        default="", metadata={"help": "basic auth user for Prometheus"}
    )
    prometheus_password_file: str = field(
        default="", metadata={"help": "file with the basic auth password, read at every query"}
    )
    prometheus_headers: dict = field(
        default_factory=dict,
        metadata={"help": "extra HTTP headers for Prometheus (config file only)", "cli": False},
    )
    prometheus_ca_file: str = field(
        default="", metadata={"help": "CA bundle to verify Prometheus' TLS certificate"}
    )
    prometheus_cert_file: str = field(
        default="", metadata={"help": "client certificate for Prometheus (mTLS)"}
    )
    prometheus_key_file: str = field(
        default="", metadata={"help": "key of the client certificate (mTLS)"}
    )
    prometheus_insecure_skip_verify: bool = field(
        default=False, metadata={"help": "do not verify Prometheus' TLS certificate"}
    )

    def __post_init__(self) -> None:
        if not self.prometheus_url.startswith(("http://", "https://")):
            raise ConfigError(
                f"prometheus_url {shown_url(self.prometheus_url)!r} must start with http:// or "
                "https://"
            )
        if urlsplit(self.prometheus_url).password is not None:
            raise ConfigError(
                f"prometheus_url {shown_url(self.prometheus_url)!r} carries a password, which "
                "would show in logs, status and events: give it as prometheus_username and "
                "prometheus_password_file (--prometheus-username, --prometheus-password-file)"
            )
        if self.prometheus_username and not self.prometheus_password_file:
            raise ConfigError("prometheus_username needs prometheus_password_file")
        if self.prometheus_password_file and not self.prometheus_username:
            raise ConfigError("prometheus_password_file needs prometheus_username")
        if self.prometheus_username and self.prometheus_bearer_token_file:
            raise ConfigError(
                "use either prometheus_bearer_token_file or prometheus_username, not both"
            )
        if self.prometheus_key_file and not self.prometheus_cert_file:
            raise ConfigError("prometheus_key_file needs prometheus_cert_file")
        for name, what in (
            ("prometheus_ca_file", "a CA bundle (PEM)"),
            ("prometheus_cert_file", "a client certificate (PEM)"),
            ("prometheus_key_file", "the client certificate's key (PEM)"),
        ):
            _check_readable_file(getattr(self, name), name, what)
        if not all(
            isinstance(k, str) and isinstance(v, str) for k, v in self.prometheus_headers.items()
        ):
            raise ConfigError("prometheus_headers must map header names to string values")

    def prometheus_client(self, timeout: float) -> PrometheusClient:
        """A client with these settings; ConfigError when a token or password file is unreadable."""
        client = PrometheusClient(
            self.prometheus_url,
            bearer_token_file=self.prometheus_bearer_token_file,
            username=self.prometheus_username,
            password_file=self.prometheus_password_file,
            headers=dict(self.prometheus_headers),
            ca_file=self.prometheus_ca_file,
            cert_file=self.prometheus_cert_file,
            key_file=self.prometheus_key_file,
            insecure_skip_verify=self.prometheus_insecure_skip_verify,
            timeout=timeout,
        )
        try:
            client.check_credentials()
        except PrometheusError as exc:
            client.close()
            raise ConfigError(f"{exc}; fix the path or the file's permissions") from exc
        return client


def _check_readable_file(path: str, name: str, what: str) -> None:
    """:class:`ConfigError` naming the flag when ``path`` (if set) is not a file this process can
    read: requests opens it only at the first query, where the fault would recur every query."""
    if not path:
        return
    flag = "--" + name.replace("_", "-")
    problem = ""
    try:
        if os.path.isdir(path):
            problem = "is a directory"
        else:
            with open(path, "rb"):
                pass
    except OSError as exc:
        problem = exc.strerror or str(exc)
    except ValueError as exc:  # a NUL byte in the path
        problem = str(exc)
    if problem:
        raise ConfigError(
            f"{flag} ({name}) {path!r}: {problem}; give the path of {what} this process can read"
        )
