"""Reading an inference request's body within ``--max-body-bytes``, with the words a client needs.

Shared by the engine's HTTP face (:mod:`batcher.server`) and the front workers
(:mod:`batcher.front_worker`), so an oversized or undecodable request is refused alike whichever
process reads it (:mod:`autoglm.web.body` says why an undecodable one also closes its connection).
"""

from __future__ import annotations

from aiohttp import web

from autoglm.web.body import UnreadableBody, read_whole
from batcher.oip import ProtocolError


async def read_body(request: web.Request, max_body_bytes: int) -> bytes:
    """The whole body; :class:`ProtocolError` (a 400) when it is over ``max_body_bytes``, or
    does not decode as its ``Content-Encoding`` says or stops arriving (then raised from the
    :class:`~autoglm.web.body.UnreadableBody`, whose status, 400 or 408, is the answer's:
    :func:`~autoglm.web.body.refusal_status`)."""
    length = request.content_length
    if length is not None and length > max_body_bytes:
        raise ProtocolError(
            f"request body is {length} bytes; the limit is {max_body_bytes} "
            "(--max-body-bytes); send fewer items per request"
        )
    try:
        return await read_whole(request)
    except UnreadableBody as exc:
        raise ProtocolError(str(exc)) from exc
    except web.HTTPRequestEntityTooLarge:
        raise ProtocolError(
            f"request body exceeds {max_body_bytes} bytes (--max-body-bytes); "
            "send fewer items per request"
        ) from None
