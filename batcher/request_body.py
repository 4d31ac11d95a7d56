"""Reading an inference request's body within ``--max-body-bytes``, with the words a client needs.

Shared by the engine's HTTP face (:mod:`batcher.server`) and the front workers
(:mod:`batcher.front_worker`), so an oversized request is refused alike whichever process reads it.
"""

from __future__ import annotations

from aiohttp import web

from batcher.oip import ProtocolError


async def read_body(request: web.Request, max_body_bytes: int) -> bytes:
    """The whole body; :class:`ProtocolError` (a 400) when it is over ``max_body_bytes``."""
    length = request.content_length
    if length is not None and length > max_body_bytes:
        raise ProtocolError(
            f"request body is {length} bytes; the limit is {max_body_bytes} "
            "(--max-body-bytes); send fewer items per request"
        )
    try:
        return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise ProtocolError(
            f"request body exceeds {max_body_bytes} bytes (--max-body-bytes); "
            "send fewer items per request"
        ) from None
