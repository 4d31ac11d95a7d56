"""A real Prometheus beside the local stack: the bus the autoscaler and predictor read, as in a
cluster, and what Grafana's dashboards query.

``prometheus`` (from PATH) is started on loopback with the project's rules
(``alerts/rules.yaml``) and one scrape job per component, named as in a cluster
(``autoglm-exporter``, ``autoglm-batcher``, ...), so the recording rules, alerts and dashboard
queries apply unchanged. Workers come and go, so their job reads a file-based service discovery
file that the stack rewrites on every change; Prometheus notices the change by itself.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import BinaryIO

import requests
import yaml

from autoglm.child_process import start_child
from autoglm.config import ConfigError

log = logging.getLogger(__name__)

# Every second, as the local stack's decisions come every few seconds; the rules (recording rules
# and alerts, for the dashboards) are not on the scaling path and are evaluated less often.
SCRAPE_INTERVAL = "1s"
EVALUATION_INTERVAL = "2s"
READY_TIMEOUT_SECONDS = 30.0
WORKERS_JOB = "autoglm-batcher"


def find_rules() -> Path:
    """The project's rules file, shipped as package data of ``alerts``."""
    from alerts import RULES_FILE

    if not RULES_FILE.is_file():
        raise ConfigError(
            f"--prometheus: the rules file {RULES_FILE} is missing from this installation; "
            "reinstall the package (pip install -e . from a checkout)"
        )
    return RULES_FILE


def binary_on_path() -> str | None:
    """Where ``prometheus`` is on PATH, if anywhere: the one place the stack looks for it (the
    command line's early port check asks too, to know whether Prometheus's port is wanted)."""
    return shutil.which("prometheus")


def find_binary() -> str:
    binary = binary_on_path()
    if binary is None:
        raise ConfigError(
            "--prometheus: no 'prometheus' binary on PATH; install it (Debian: apt-get install "
            "prometheus) or run without --prometheus (the stack does not need it)"
        )
    return binary


def build_config(static_jobs: Mapping[str, Sequence[str]], workers_file: Path, rules: Path) -> dict:
    """prometheus.yml as a mapping: a static job per component, file SD for the workers."""
    jobs = [
        {"job_name": job, "static_configs": [{"targets": list(targets)}]}
        for job, targets in static_jobs.items()
    ]
    jobs.append({"job_name": WORKERS_JOB, "file_sd_configs": [{"files": [str(workers_file)]}]})
    return {
        "global": {
            "scrape_interval": SCRAPE_INTERVAL,
            "evaluation_interval": EVALUATION_INTERVAL,
        },
        "rule_files": [str(rules)],
        "scrape_configs": jobs,
    }


def write_targets(path: Path, targets: Sequence[str]) -> None:
    """Rewrite a file SD file atomically (Prometheus must never read half a file)."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps([{"targets": list(targets), "labels": {}}]))
    os.replace(tmp, path)


class PrometheusServer:
    """One ``prometheus`` process on loopback with its config and data under ``directory``."""

    def __init__(
        self,
        directory: Path,
        port: int,
        static_jobs: Mapping[str, Sequence[str]],
    ) -> None:
        self.binary = find_binary()
        self.rules = find_rules()
        self.directory = directory
        self.port = port
        self.workers_file = directory / "workers.json"
        self.static_jobs = dict(static_jobs)
        self.process: subprocess.Popen | None = None
        self._log_file: BinaryIO | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        # A fresh database: an earlier run's series would be history the predictor fits on.
        shutil.rmtree(self.directory / "data", ignore_errors=True)
        self.directory.mkdir(parents=True, exist_ok=True)
        write_targets(self.workers_file, [])
        config = self.directory / "prometheus.yml"
        config.write_text(
            yaml.safe_dump(build_config(self.static_jobs, self.workers_file, self.rules))
        )
        self._log_file = open(self.directory / "prometheus.log", "wb")  # noqa: SIM115
        # A session of its own, so that a Ctrl-C in the terminal reaches only ``autoglm up``,
        # which stops it in order; and SIGTERM from the kernel if ``autoglm up`` dies without
        # stopping it (SIGKILL), from whichever thread starts it (start_child).
        self.process = start_child(
            [
                self.binary,
                f"--config.file={config}",
                f"--storage.tsdb.path={self.directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
                "--storage.tsdb.retention.time=1d",
            ],
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + READY_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                self.stop()
                raise ConfigError(
                    f"--prometheus: prometheus exited at start (code {self.process.returncode}); "
                    f"see {self.directory / 'prometheus.log'}"
                )
            with contextlib.suppress(requests.RequestException):
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    log.info("prometheus ready", extra={"url": self.url})
                    return
            time.sleep(0.2)
        self.stop()
        raise ConfigError(f"--prometheus: prometheus was not ready in {READY_TIMEOUT_SECONDS:g} s")

    def set_workers(self, endpoints: Sequence[str]) -> None:
        write_targets(self.workers_file, endpoints)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None


def grafana_hint(url: str) -> list[str]:
    """How to look at the run in Grafana, for the terminal."""
    return [
        f"Prometheus: {url} (rules from alerts/rules.yaml; jobs autoglm-exporter, "
        "autoglm-batcher, autoglm-predictor, autoglm-autoscaler, autoglm-loadgen, autoglm-job)",
        "Grafana: add a Prometheus data source with this URL, then import dashboards/json/*.json "
        "(Dashboards > New > Import) and pick that data source",
    ]
