"""Accepting connections for an aiohttp server: a connection limit, and TLS from the web config.

aiohttp's own sites hand TLS to asyncio, which drops a failed handshake silently and offers no
place to refuse a client certificate before the first request. The listener accepts plain TCP
and upgrades each connection itself (``loop.start_tls``), so it can count failed handshakes,
close a connection whose verified client certificate names no SAN in ``client_allowed_sans``
(as exporter-toolkit does, before any HTTP), and only then hand the connection to aiohttp. The
handshake runs on the event loop without blocking it, bounded by
:data:`TLS_HANDSHAKE_TIMEOUT_S`, so a slow client never stalls other connections.

With ``max_connections`` set, a connection beyond that many open ones (handshakes included) is
closed on arrival and counted: each holds memory, and a flood should not take the server down.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter

from autoglm.webconfig import WebConfig

log = logging.getLogger(__name__)

TLS_HANDSHAKE_TIMEOUT_S = 10.0
BACKLOG = 128


class ConnectionMetrics:
    """Connections the server closed for what their client did or did not do (before any
    request, or mid-body), for the listener's owner to export."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.tls_handshake_errors = Counter(
            "autoglm_http_tls_handshake_errors",
            "TLS connections closed before a request: failed handshake, refused client "
            "certificate or SAN not allowed (not a client closing without a word, as a TCP "
            "probe does).",
            registry=registry,
        )
        self.connections_refused = Counter(
            "autoglm_http_connections_refused",
            "Connections closed on arrival because the server already had its maximum open.",
            registry=registry,
        )
        self.body_timeouts = Counter(
            "autoglm_http_request_body_timeouts",
            "Requests answered 408 and their connection closed because the body stopped "
            "arriving (a pause past the body timeout, or slower than 16 KiB/s after it).",
            registry=registry,
        )


class Listener:
    """Serves connections accepted on a bound socket with ``protocols`` (aiohttp's ``Server``).

    ``open_connections`` says how many connections the server holds now (aiohttp's
    ``len(server.connections)``); the listener adds those still in their TLS handshake.
    """

    def __init__(
        self,
        protocols: Callable[[], asyncio.Protocol],
        open_connections: Callable[[], int],
        web_config: WebConfig,
        metrics: ConnectionMetrics,
        max_connections: int | None = None,
        handshake_timeout: float | None = None,
    ) -> None:
        self._protocols = protocols
        self._open_connections = open_connections
        self._web_config = web_config
        self._metrics = metrics
        self._max_connections = max_connections
        self._handshake_timeout = handshake_timeout or TLS_HANDSHAKE_TIMEOUT_S
        self._handshakes: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None

    async def start(self, sock: socket.socket) -> None:
        """Listen on ``sock`` (bound, see :mod:`autoglm.web.binding`) and accept from now on."""
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(self._accept, sock=sock, backlog=BACKLOG)

    @property
    def port(self) -> int:
        """The port listened on (0 before :meth:`start`)."""
        if self._server is None or not self._server.sockets:
            return 0
        return int(self._server.sockets[0].getsockname()[1])

    async def close(self) -> None:
        """Stop accepting and abandon handshakes in progress; established connections are the
        aiohttp runner's to close (``runner.cleanup()``)."""
        if self._server is not None:
            self._server.close()
        for task in list(self._handshakes):
            task.cancel()
        if self._handshakes:
            await asyncio.gather(*self._handshakes, return_exceptions=True)
        self._server = None

    def _accept(self) -> asyncio.Protocol:
        limit = self._max_connections
        if limit is not None and self._open_connections() + len(self._handshakes) >= limit:
            self._metrics.connections_refused.inc()
            return _Refused()
        if self._web_config.ssl_context() is None:
            return self._protocols()
        return _TLSUpgrade(self._start_handshake)

    def _start_handshake(self, connection: _TLSUpgrade, transport: asyncio.Transport) -> None:
        task = asyncio.get_running_loop().create_task(self._handshake(connection, transport))
        self._handshakes.add(task)
        task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, connection: _TLSUpgrade, raw: asyncio.Transport) -> None:
        context = self._web_config.ssl_context()
        assert context is not None
        loop = asyncio.get_running_loop()
        peer = raw.get_extra_info("peername")
        try:
            tls = await loop.start_tls(
                raw,
                connection,
                context,
                server_side=True,
                ssl_handshake_timeout=self._handshake_timeout,
            )
        except asyncio.CancelledError:
            raw.abort()
            raise
        except ConnectionResetError:
            # Closed by the client before the handshake ended, with no TLS alert: a TCP probe's
            # connect-and-close (a kubelet tcpSocket probe, a load balancer's health check).
            # Nothing failed on this side; a client that rejects the certificate sends an alert.
            log.debug("connection closed during the TLS handshake", extra={"client": _host(peer)})
            raw.abort()
            return
        except Exception as exc:  # any other failure (alert, timeout) ends the connection
            self._metrics.tls_handshake_errors.inc()
            log.debug("TLS handshake failed", extra={"client": _host(peer), "error": str(exc)})
            raw.abort()
            return
        if tls is None:
            return  # closed during the handshake
        if not self._web_config.client_certificate_allowed(tls.get_extra_info("peercert")):
            self._metrics.tls_handshake_errors.inc()
            log.debug(
                "client certificate SAN not in client_allowed_sans", extra={"client": _host(peer)}
            )
            tls.abort()
            return
        connection.hand_over(tls, self._protocols())


def _host(peer: object) -> object:
    return peer[0] if isinstance(peer, tuple) else peer


class _Refused(asyncio.Protocol):
    """Closes the connection as soon as it is made."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.close()


class _TLSUpgrade(asyncio.Protocol):
    """One connection until its TLS handshake is done and checked.

    First the raw TCP connection's protocol: it pauses reading so the ClientHello waits for
    ``start_tls``. Then the TLS layer's application protocol: it keeps whatever the client sends
    right after the handshake until :meth:`hand_over` gives the connection to aiohttp. (An end
    of file from the client closes a TLS connection at once, whatever the protocol answers.)
    """

    def __init__(self, start_handshake: Callable[[_TLSUpgrade, asyncio.Transport], None]) -> None:
        self._start_handshake = start_handshake
        self._early: list[bytes] = []
        self._lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        transport.pause_reading()
        self._start_handshake(self, transport)

    def data_received(self, data: bytes) -> None:
        self._early.append(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = True

    def hand_over(self, tls: asyncio.Transport, protocol: asyncio.Protocol) -> None:
        if self._lost:
            return
        tls.set_protocol(protocol)
        protocol.connection_made(tls)
        for data in self._early:
            protocol.data_received(data)
        self._early.clear()
