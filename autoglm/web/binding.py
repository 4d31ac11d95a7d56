"""A listening address (``--listen HOST:PORT``) bound to a socket, with errors that say what to do.

Binding happens before the event loop serves, so a taken port or an unknown host is a
:class:`~autoglm.config.ConfigError` at start-up rather than a log line from a background task.
"""

from __future__ import annotations

import socket

from autoglm.config import ConfigError


def bind_socket(host: str, port: int, reuse_port: bool = False) -> socket.socket:
    """A TCP socket bound to ``host:port`` (port 0 picks a free one), not yet listening.

    ``::`` takes IPv4 connections too, as ``0.0.0.0`` would, so ``--listen [::]:PORT`` serves
    both families. With ``reuse_port`` (``SO_REUSEPORT``) other sockets of this user may bind the
    same port with it too, and the kernel spreads new connections over those listening: how
    several processes serve one port (the batcher's ``--workers``).
    """
    where = f"{host}:{port}"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError(
            f"cannot listen on {where}: unknown host {host!r} ({exc.strerror}); "
            "use an IP address of this machine, e.g. 127.0.0.1:PORT or :PORT for all"
        ) from exc
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
    except OSError as exc:
        sock.close()
        raise ConfigError(
            f"cannot listen on {where}: {exc.strerror or exc}; "
            "stop whatever holds the port or choose another --listen HOST:PORT"
        ) from exc
    return sock


def local_url(host: str, port: int, tls: bool) -> str:
    """Base URL for a client on this machine: a wildcard address becomes loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"
