"""A route serving a Prometheus registry as exporters do: format negotiation, gzip, name filter."""

from __future__ import annotations

import gzip
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from autoglm.web.exchange import Handler, Request, Response


def negotiated_encoder(
    accept: str | None,
) -> tuple[Callable[..., bytes], str]:
    """The encoder and content type an ``Accept`` header asks for; the Prometheus text format
    when prometheus_client cannot read the header (``version=abc`` raises inside it), as a
    server may ignore an Accept it cannot satisfy: a malformed header is no reason for a 500."""
    try:
        return choose_encoder(accept or "")
    except (TypeError, ValueError):
        return choose_encoder("")  # what a scrape without an Accept header gets


def registry_route(registry: CollectorRegistry) -> Handler:
    """A handler exposing ``registry``: Prometheus text, or OpenMetrics when the Accept header
    asks for it; gzip when the client accepts it; ``?name[]=`` restricts to some metrics."""

    def serve_registry(request: Request) -> Response:
        encoder, content_type = negotiated_encoder(request.headers.get("Accept"))
        names = request.query.get("name[]")
        source = registry.restricted_registry(names) if names else registry
        body = encoder(source)
        headers = {}
        if gzip_accepted(request.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        return Response(body=body, content_type=content_type, headers=headers)

    return serve_registry
