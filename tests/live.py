"""Real Prometheus-family servers for tests, on 127.0.0.1 with a free port and a temp directory.

``Prometheus(workdir, scrape_configs, rule_files)`` writes its config, starts
``/usr/bin/prometheus`` and waits until it is ready; ``query``/``wait_for`` speak its HTTP API.
With ``web_config`` (TLS, basic auth) it serves behind it, and ``request_options`` (``verify``,
``cert``, ``auth`` of ``requests``) are what the readiness check and the queries send.
``LiveProcess`` holds what every such server needs (start, readiness with a bound, log capture,
a stop that never leaves a process behind), so an ``Alertmanager`` can be added beside it.

A fresh Prometheus scrapes its targets for the first time a few seconds after it starts; callers
poll with ``wait_for`` instead of sleeping.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import requests
import yaml

from autoglm.ports import free_port  # re-exported: the live tests take it from here

PROMETHEUS_BINARY = "/usr/bin/prometheus"


class LiveProcess:
    """A server process with a readiness URL; ``stop`` terminates, then kills, and reaps it."""

    def __init__(
        self,
        argv: Sequence[str],
        ready_url: str,
        log_path: Path,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.ready_url = ready_url
        self.log_path = log_path
        self.request_options = dict(request_options or {})
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, ready_timeout: float = 30.0) -> None:
        if shutil.which(self.argv[0]) is None:
            raise RuntimeError(f"{self.argv[0]} is not installed; run scripts/test to install it")
        with self.log_path.open("wb") as log:
            self.process = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
            )
        deadline = time.monotonic() + ready_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.argv[0]} exited early:\n{self.logs()}")
            with contextlib.suppress(requests.RequestException):
                ready = requests.get(self.ready_url, timeout=1, **self.request_options)
                if ready.status_code == 200:
                    return
            time.sleep(0.1)
        self.stop()
        raise RuntimeError(f"{self.argv[0]} not ready within {ready_timeout:g}s:\n{self.logs()}")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""


def scrape_job(
    name: str, targets: Sequence[str], interval: str = "1s", **extra: Any
) -> dict[str, Any]:
    """A static scrape config; ``extra`` keys (scheme, basic_auth, tls_config...) pass through."""
    return {
        "job_name": name,
        "scrape_interval": interval,
        "scrape_timeout": interval,
        "static_configs": [{"targets": list(targets)}],
        **extra,
    }


class Prometheus:
    """A real Prometheus server scraping ``scrape_configs`` and evaluating ``rule_files``."""

    def __init__(
        self,
        workdir: Path,
        scrape_configs: Sequence[dict[str, Any]],
        rule_files: Sequence[Path] = (),
        evaluation_interval: str = "1s",
        extra_config: dict[str, Any] | None = None,
        web_config: dict[str, Any] | None = None,
        request_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.workdir = workdir
        self.port = free_port()
        scheme = "https" if web_config and "tls_server_config" in web_config else "http"
        self.url = f"{scheme}://127.0.0.1:{self.port}"
        self.request_options = dict(request_options or {})
        workdir.mkdir(parents=True, exist_ok=True)
        config: dict[str, Any] = {
            "global": {"scrape_interval": "1s", "evaluation_interval": evaluation_interval},
            "scrape_configs": list(scrape_configs),
            **(extra_config or {}),
        }
        if rule_files:
            config["rule_files"] = [str(Path(p).resolve()) for p in rule_files]
        self.config_path = workdir / "prometheus.yml"
        self.config_path.write_text(yaml.safe_dump(config))
        argv = [
            PROMETHEUS_BINARY,
            f"--config.file={self.config_path}",
            f"--storage.tsdb.path={workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{self.port}",
            "--web.enable-lifecycle",
            "--log.level=warn",
        ]
        if web_config:
            web_config_path = workdir / "web.yml"
            web_config_path.write_text(yaml.safe_dump(web_config))
            argv.append(f"--web.config.file={web_config_path}")
        self._process = LiveProcess(
            argv,
            ready_url=f"{self.url}/-/ready",
            log_path=workdir / "prometheus.log",
            request_options=self.request_options,
        )

    def start(self) -> Prometheus:
        self._process.start()
        return self

    def stop(self) -> None:
        self._process.stop()

    def __enter__(self) -> Prometheus:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def logs(self) -> str:
        return self._process.logs()

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; the ``result`` list of the API answer (raises on an API error)."""
        reply = requests.get(
            f"{self.url}/api/v1/query",
            params={"query": promql},
            timeout=10,
            **self.request_options,
        )
        body = reply.json()
        if body.get("status") != "success":
            raise AssertionError(f"query {promql!r} failed: {body}")
        return body["data"]["result"]

    def wait_for(
        self,
        promql: str,
        done: Callable[[list[dict[str, Any]]], bool],
        timeout: float = 30.0,
    ) -> list[dict[str, Any]]:
        """Poll ``promql`` until ``done(result)``; fail with the last result after ``timeout``."""
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if done(result):
                return result
            time.sleep(0.5)
        raise AssertionError(
            f"{promql!r} did not reach the expected result in {timeout:g}s; last: {result}\n"
            f"targets: {self.targets()}\nlogs:\n{self.logs()}"
        )

    def targets(self) -> list[dict[str, Any]]:
        reply = requests.get(
            f"{self.url}/api/v1/targets", timeout=10, **self.request_options
        ).json()
        return [
            {k: t.get(k) for k in ("scrapeUrl", "health", "lastError")}
            for t in reply["data"]["activeTargets"]
        ]
