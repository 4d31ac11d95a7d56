"""The batcher endpoint as a job sees it: one HTTP session with the job's TLS and credentials.

:meth:`Endpoint.infer` sends one request and sorts the answer into what the runner acts on
(:class:`Attempt`): answered, refused for lack of capacity (429, or 503 while a batcher drains),
a bad request (other 4xx: the line goes to the errors file), credentials refused, a server
error, a timeout or a connection failure. :meth:`Endpoint.check` asks once before any line
whether the credentials, the TLS settings and the default model are right.
"""

from __future__ import annotations

import base64
import json
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import aiohttp

from autoglm.config import ConfigError
from jobs.concurrency import parse_retry_after
from jobs.config import JobConfig
from jobs.input import WorkItem

log = logging.getLogger(__name__)

_REFUSED = (429, 503)
_DENIED = (401, 403)


@dataclass(frozen=True)
class Attempt:
    """What one send got back: kind is ok, refused, invalid, denied, connection, timeout or
    server_error; ``seconds`` from sending to the answer."""

    kind: str
    status: int = 0
    answer: dict[str, Any] | None = None
    message: str = ""
    retry_after: float | None = None
    seconds: float = 0.0


class Endpoint:
    """Use as ``async with Endpoint(config) as endpoint``; the session closes on exit."""

    def __init__(self, config: JobConfig, clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.base = config.endpoint.rstrip("/")
        self.clock = clock
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Endpoint:
        config = self.config
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=config.request_timeout_seconds),
            connector=aiohttp.TCPConnector(limit=config.max_concurrency, ssl=_ssl_context(config)),
            headers=_auth_headers(config),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            raise RuntimeError("use the Endpoint in an async with block")
        return self._session

    async def infer(self, item: WorkItem) -> Attempt:
        """Send one line's request once."""
        url = f"{self.base}/v2/models/{quote(item.model, safe='')}/infer"
        started = self.clock()
        try:
            async with self.session.post(url, json=item.body) as response:
                status = response.status
                body = await response.read()
                retry_after = parse_retry_after(response.headers.get("Retry-After"))
        except TimeoutError:
            return Attempt(
                "timeout", message=f"no answer within {self.config.request_timeout_seconds} s"
            )
        except aiohttp.ClientError as exc:
            return Attempt("connection", message=str(exc) or type(exc).__name__)
        if status == 200:
            try:
                answer = json.loads(body)
            except (UnicodeDecodeError, json.JSONDecodeError):
                answer = None
            if not isinstance(answer, dict):
                return Attempt(
                    "invalid",
                    status,
                    message="the answer is not a JSON object (binary outputs are not supported "
                    "by the job runner)",
                )
            answer.pop("id", None)
            return Attempt("ok", status, answer=answer, seconds=self.clock() - started)
        message = _error_text(body)
        if status in _REFUSED:
            return Attempt("refused", status, message=message, retry_after=retry_after)
        if status in _DENIED:
            return Attempt("denied", status, message=message)
        if status >= 500:
            return Attempt("server_error", status, message=message)
        return Attempt("invalid", status, message=message)

    async def check(self) -> None:
        """Credentials, TLS and the default model are settings: wrong ones end the job at once,
        before any line. An endpoint that is not up yet is not: the run waits for it."""
        base = self.base
        try:
            async with self.session.get(f"{base}/v2") as response:
                if response.status in _DENIED:
                    raise ConfigError(
                        f"--endpoint {base} refused the credentials (HTTP {response.status}); "
                        "check --username and --password-file"
                    )
            if self.config.model:
                model = quote(self.config.model, safe="")
                async with self.session.get(f"{base}/v2/models/{model}/ready") as response:
                    if response.status == 404:
                        raise ConfigError(
                            f"--model {self.config.model!r} is not served at {base}; "
                            "check the name against GET /v2/models/NAME"
                        )
        except (aiohttp.ClientSSLError, ssl.SSLError) as exc:
            raise ConfigError(
                f"TLS with --endpoint {base} failed: {exc}; check --ca-file, --cert-file and "
                "--key-file"
            ) from None
        except (aiohttp.ClientError, TimeoutError) as exc:
            log.warning(
                "endpoint not reachable yet; the job keeps trying within its patience",
                extra={"endpoint": base, "error": str(exc) or type(exc).__name__},
            )


def _ssl_context(config: JobConfig) -> ssl.SSLContext | bool:
    if not config.endpoint.startswith("https://"):
        return False
    context = ssl.create_default_context(cafile=config.ca_file or None)
    if config.cert_file:
        context.load_cert_chain(config.cert_file, config.key_file or None)
    return context


def _auth_headers(config: JobConfig) -> dict[str, str]:
    if not config.username:
        return {}
    password = Path(config.password_file).read_text().strip("\r\n")
    token = base64.b64encode(f"{config.username}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def _error_text(body: bytes) -> str:
    try:
        document = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return body[:200].decode(errors="replace")
    if isinstance(document, dict) and isinstance(document.get("error"), str):
        return document["error"]
    return body[:200].decode(errors="replace")
