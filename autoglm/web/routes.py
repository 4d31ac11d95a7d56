"""A table of exact-path routes for :class:`~autoglm.web.server.HTTPServer`.

A key ``"/path"`` serves ``GET`` (and ``HEAD``, with the body dropped); a key ``"POST /path"``
serves that method. Any other method on a known path gets 405 with an ``Allow`` header; an
unknown path gets 404.
"""

from __future__ import annotations

from collections.abc import Mapping
from http import HTTPStatus

from autoglm.web.exchange import Handler, Response

OTHER_PATH = "other"  # the metrics label of every unknown path


class RouteTable:
    """Handlers by path and method."""

    def __init__(self, routes: Mapping[str, Handler]) -> None:
        self._routes: dict[str, dict[str, Handler]] = {}
        for key, handler in routes.items():
            method, path = parse_route_key(key)
            self._routes.setdefault(path, {})[method] = handler
            if method == "GET":
                self._routes[path].setdefault("HEAD", handler)

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(self._routes)

    def label(self, path: str) -> str:
        """The path as a metrics label: itself when routed, else :data:`OTHER_PATH`."""
        return path if path in self._routes else OTHER_PATH

    def find(self, method: str, path: str) -> Handler | Response:
        """The handler for ``method path``, or the 404 or 405 response to send instead."""
        methods = self._routes.get(path)
        if methods is None:
            return Response.text("not found", HTTPStatus.NOT_FOUND)
        handler = methods.get(method)
        if handler is None:
            allow = ", ".join(sorted(methods))
            return Response.text(
                f"method {method} not allowed on {path}; allowed: {allow}",
                HTTPStatus.METHOD_NOT_ALLOWED,
            ).with_header("Allow", allow)
        return handler


def parse_route_key(key: str) -> tuple[str, str]:
    """``"/path"`` or ``"METHOD /path"`` as ``(method, path)``."""
    method, sep, path = key.partition(" ")
    if not sep:
        method, path = "GET", key
    if not path.startswith("/") or not method.isupper():
        raise ValueError(f"route {key!r} must be '/path' or 'METHOD /path'")
    return method, path
