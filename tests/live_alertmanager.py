"""A real Alertmanager for tests, and the webhook receiver it delivers to.

``Alertmanager`` runs Debian's ``prometheus-alertmanager`` on 127.0.0.1 with clustering off
(``--cluster.listen-address=``), a temp storage directory and a route that sends every alert,
one notification per alert, to a URL. ``WebhookReceiver`` is a small HTTP server in the test
process that records what Alertmanager posts, so a test can wait for an alert with a bound.
Both build on ``tests.live`` (free ports, process start with readiness, log capture, stop).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

import yaml

from tests.http_thread import ThreadedHTTPServer
from tests.live import LiveProcess, free_port

ALERTMANAGER_BINARY = "/usr/bin/prometheus-alertmanager"

Alert = dict[str, Any]  # one alert of a webhook payload: status, labels, annotations, ...


class WebhookReceiver:
    """Records the alerts of every Alertmanager webhook POST it receives."""

    def __init__(self) -> None:
        self.alerts: list[Alert] = []
        self._changed = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                payload = json.loads(self.rfile.read(length) or b"{}")
                with receiver._changed:
                    receiver.alerts.extend(payload.get("alerts", []))
                    receiver._changed.notify_all()
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: object) -> None:  # keep test output clean
                pass

        self._http = ThreadedHTTPServer(Handler)
        self.url = self._http.url("/alerts")

    def start(self) -> WebhookReceiver:
        self._http.start()
        return self

    def stop(self) -> None:
        self._http.stop()

    def wait_for(self, match: Callable[[Alert], bool], timeout: float, what: str) -> list[Alert]:
        """Block until alerts matching ``match`` arrived; fail after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                found = [a for a in self.alerts if match(a)]
                if found:
                    return found
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = sorted({a["labels"].get("alertname", "?") for a in self.alerts})
                    raise AssertionError(
                        f"no {what} at the webhook within {timeout:g}s; received: {seen}"
                    )
                self._changed.wait(remaining)


class Alertmanager:
    """A real Alertmanager that routes every alert to ``webhook_url``, one per notification."""

    def __init__(self, workdir: Path, webhook_url: str) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.url = f"http://{self.address}"
        config = {
            "route": {
                "receiver": "test-webhook",
                "group_by": ["..."],  # every alert is its own group: one notification each
                "group_wait": "1s",
                "group_interval": "1s",
                "repeat_interval": "1h",
            },
            "receivers": [
                {
                    "name": "test-webhook",
                    "webhook_configs": [{"url": webhook_url, "send_resolved": False}],
                }
            ],
        }
        config_path = workdir / "alertmanager.yml"
        config_path.write_text(yaml.safe_dump(config))
        self._process = LiveProcess(
            [
                ALERTMANAGER_BINARY,
                f"--config.file={config_path}",
                f"--storage.path={workdir / 'data'}",
                f"--web.listen-address={self.address}",
                "--cluster.listen-address=",
                "--log.level=warn",
            ],
            ready_url=f"{self.url}/-/ready",
            log_path=workdir / "alertmanager.log",
        )

    def start(self) -> Alertmanager:
        self._process.start()
        return self

    def stop(self) -> None:
        self._process.stop()

    def logs(self) -> str:
        return self._process.logs()

    def prometheus_config(self) -> dict[str, Any]:
        """The ``alerting`` section that points a Prometheus at this Alertmanager."""
        return {"alerting": {"alertmanagers": [{"static_configs": [{"targets": [self.address]}]}]}}
