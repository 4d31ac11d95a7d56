"""Raw-socket clients that send a request's headers and then hold back its body, for the tests of
the body timeout (``autoglm.web.body_timeout``) on every server that reads bodies."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass

# How long a test waits for the server's answer and the end of the connection: far past the
# short body timeouts the tests configure, and short of the 10 s aiohttp would linger on a
# connection whose body it reads on through, so a connection held open fails the test.
ANSWER_WAIT_S = 5.0


@dataclass(frozen=True)
class Answer:
    """What came back on the connection until the server closed it."""

    status: int
    headers: dict[str, str]
    body: bytes


def head(method: str, path: str, length: int, headers: dict[str, str] | None = None) -> bytes:
    """A request's head announcing a body of ``length`` bytes."""
    lines = [f"{method} {path} HTTP/1.1", "Host: test", f"Content-Length: {length}"]
    lines += [f"{name}: {value}" for name, value in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def answer_until_closed(sock: socket.socket) -> Answer:
    """Read the answer and everything after it until the server closes the connection;
    ``TimeoutError`` when it is still open after :data:`ANSWER_WAIT_S`."""
    sock.settimeout(ANSWER_WAIT_S)
    received = bytearray()
    while chunk := sock.recv(65536):
        received += chunk
    status_line, _, rest = bytes(received).partition(b"\r\n")
    header_block, _, body = rest.partition(b"\r\n\r\n")
    headers = {}
    for line in header_block.decode().split("\r\n"):
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return Answer(int(status_line.split()[1]), headers, body)


def stall(port: int, request_head: bytes, first_bytes: bytes) -> Answer:
    """Send ``request_head`` and ``first_bytes`` of its body, send nothing more, and return what
    the server answers before it closes the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WAIT_S) as sock:
        sock.sendall(request_head + first_bytes)
        return answer_until_closed(sock)


def trickle(port: int, request_head: bytes, every_s: float) -> Answer:
    """Send ``request_head``, then a byte of body every ``every_s`` (a slowloris: never a long
    pause, never much data) until the server answers; what it answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WAIT_S) as sock:
        sock.sendall(request_head)
        answered = threading.Event()

        def drip() -> None:
            while not answered.wait(every_s):
                try:
                    sock.sendall(b" ")
                except OSError:  # closed by the server: its answer is on the way
                    return

        dripping = threading.Thread(target=drip, daemon=True)
        dripping.start()
        try:
            return answer_until_closed(sock)
        finally:
            answered.set()
            dripping.join()


def send_slowly(port: int, request_head: bytes, body: bytes, pieces: int, pause_s: float) -> Answer:
    """Send ``request_head`` (which says ``Connection: close``, so that the server closes after
    its answer), then ``body`` in ``pieces`` with ``pause_s`` between them (a slow link that keeps
    making progress); the answer."""
    size = -(-len(body) // pieces)
    with socket.create_connection(("127.0.0.1", port), timeout=ANSWER_WAIT_S) as sock:
        sock.sendall(request_head)
        for start in range(0, len(body), size):
            time.sleep(pause_s)
            sock.sendall(body[start : start + size])
        return answer_until_closed(sock)
