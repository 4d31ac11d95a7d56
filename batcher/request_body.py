"""Reading a request's body within ``--max-body-bytes``, with the words a client needs.

Shared by the engine's HTTP face (:mod:`batcher.server`), the front workers
(:mod:`batcher.front_worker`) and the repository API (:mod:`batcher.repository_http`), so a body
is refused alike whichever process or route reads it.

A body that does not decode as its ``Content-Encoding`` says (``gzip`` over plain JSON) is
:class:`UnreadableBody`: aiohttp closes such a connection after the answer, since it cannot tell
where the next request on it would start, so the answer says so (``Connection: close``) and a
keep-alive client does not send its next request into a closed socket.
"""

from __future__ import annotations

from aiohttp import web

from batcher.oip import ProtocolError


class UnreadableBody(ProtocolError):
    """A body that could not be read to its end (a 400 that closes the connection)."""


async def read_whole(request: web.Request) -> bytes:
    """``request.read()``; :class:`UnreadableBody` when the body does not decode."""
    try:
        return await request.read()
    except web.RequestPayloadError as exc:
        cause = getattr(exc.__cause__, "message", None) or " ".join(str(exc).split())
        raise UnreadableBody(
            f"request body could not be read ({cause}); send it uncompressed, or compressed as "
            "its Content-Encoding header says"
        ) from None


async def read_body(request: web.Request, max_body_bytes: int) -> bytes:
    """The whole body; :class:`ProtocolError` (a 400) when it is over ``max_body_bytes`` or
    does not decode as its ``Content-Encoding`` says."""
    length = request.content_length
    if length is not None and length > max_body_bytes:
        raise ProtocolError(
            f"request body is {length} bytes; the limit is {max_body_bytes} "
            "(--max-body-bytes); send fewer items per request"
        )
    try:
        return await read_whole(request)
    except web.HTTPRequestEntityTooLarge:
        raise ProtocolError(
            f"request body exceeds {max_body_bytes} bytes (--max-body-bytes); "
            "send fewer items per request"
        ) from None


def closing_if_unreadable(response: web.Response, error: Exception) -> web.Response:
    """``response`` to a refused request, closing its connection when the body was unreadable."""
    if isinstance(error, UnreadableBody) or isinstance(error.__cause__, UnreadableBody):
        response.force_close()
    return response
