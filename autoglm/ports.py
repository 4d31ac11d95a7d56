"""Picking a TCP port that is free now, for processes this package starts on one machine."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out on ``host``; another process could take it before use."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
