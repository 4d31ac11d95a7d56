"""What a synchronous route handler sees of a request and gives back.

Components other than the batcher serve a few fixed paths (``/metrics``, health checks, small
JSON APIs) from code that runs on threads; their handlers take a :class:`Request` and return a
:class:`Response` and know nothing of the event loop that carries them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Request:
    """What a route handler sees of one request."""

    method: str
    path: str
    query: dict[str, list[str]]
    headers: Mapping[str, str]  # case-insensitive
    body: bytes


@dataclass
class Response:
    """What a route handler returns."""

    status: int = 200
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def json(cls, data: Any, status: int = 200) -> Response:
        """A JSON body, for the small API endpoints components expose."""
        return cls(status=status, body=json.dumps(data).encode(), content_type="application/json")

    @classmethod
    def text(cls, text: str, status: int = 200) -> Response:
        """A plain-text body ending in a newline, for health checks and error messages."""
        return cls(status=status, body=(text.rstrip("\n") + "\n").encode())

    def with_header(self, name: str, value: str) -> Response:
        """Add a response header; returns ``self`` so it chains."""
        self.headers[name] = value
        return self


Handler = Callable[[Request], Response]
