"""A test's own HTTP server on 127.0.0.1, served from a daemon thread until it is stopped.

The fakes that stand in for a service (the Kubernetes API of ``tests/autoscaler/fake_kube.py``,
the Alertmanager webhook of ``tests/live_alertmanager.py``) each need the same few lines: bind
a free port (port 0, so parallel workers never collide), serve on a thread that cannot keep the
test process alive, and on stop shut the loop down, close the socket and join the thread. They
live here once so that a fix (a join that hangs, a socket left open) reaches every fake.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class ThreadedHTTPServer:
    """``handler`` served on 127.0.0.1 on a free port, from :meth:`start` until :meth:`stop`.

    The port is bound on construction, so :attr:`port` and :meth:`url` are known before the
    server starts (a fake's address can go into a config written first). Each request is
    handled on a daemon thread: a client that never finishes its request does not block stop."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    def url(self, path: str = "") -> str:
        """``http://127.0.0.1:PORT`` followed by ``path`` (which starts with ``/`` if given)."""
        return f"http://127.0.0.1:{self.port}{path}"

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, close the socket and wait (a few seconds at most) for the thread.

        A server never started is only closed: ``shutdown`` would wait for a loop that never
        ran."""
        started = self._thread.is_alive()
        if started:
            self._server.shutdown()
        self._server.server_close()
        if started:
            self._thread.join(timeout=5)
