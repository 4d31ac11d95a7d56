"""A route serving a Prometheus registry as exporters do: format negotiation, gzip, name filter."""

from __future__ import annotations

import gzip

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder, gzip_accepted

from autoglm.web.exchange import Handler, Request, Response


def registry_route(registry: CollectorRegistry) -> Handler:
    """A handler exposing ``registry``: Prometheus text, or OpenMetrics when the Accept header
    asks for it; gzip when the client accepts it; ``?name[]=`` restricts to some metrics."""

    def serve_registry(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("Accept", ""))
        names = request.query.get("name[]")
        source = registry.restricted_registry(names) if names else registry
        body = encoder(source)
        headers = {}
        if gzip_accepted(request.headers.get("Accept-Encoding", "")):
            body = gzip.compress(body, compresslevel=6)
            headers["Content-Encoding"] = "gzip"
        return Response(body=body, content_type=content_type, headers=headers)

    return serve_registry
