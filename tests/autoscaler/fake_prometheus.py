"""A tiny HTTP server that answers Prometheus' instant-query API with configured vectors.

For controller tests that need to change a metric from one reconcile to the next; the metrics
source itself is also tested against a real Prometheus (test_controller_prometheus.py).
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlsplit


class FakePrometheus:
    """``answers[query]``: a list of (labels, value) pairs; other queries get an empty vector."""

    def __init__(self) -> None:
        self.answers: dict[str, list[tuple[dict[str, str], float | str]]] = {}
        self.queries: list[str] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format, *args):
                pass

            def do_POST(self):
                length = int(self.headers.get("Content-Length") or 0)
                form = parse_qs(self.rfile.read(length).decode())
                self._answer(form.get("query", [""])[0])

            def do_GET(self):
                self._answer(parse_qs(urlsplit(self.path).query).get("query", [""])[0])

            def _answer(self, query: str) -> None:
                fake.queries.append(query)
                result = [
                    {"metric": labels, "value": [1700000000.0, str(value)]}
                    for labels, value in fake.answers.get(query, [])
                ]
                body = json.dumps(
                    {"status": "success", "data": {"resultType": "vector", "result": result}}
                ).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def set_pods(self, query: str, values: dict[str, float | str]) -> None:
        self.answers[query] = [({"pod": pod}, v) for pod, v in values.items()]

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
