"""Reading a request's whole body, and closing the connection of one that could not be read.

A body that does not decode as its ``Content-Encoding`` says (``gzip`` over plain text) makes
aiohttp raise from ``request.read()``, which a handler would turn into a 500, and aiohttp closes
that connection after the answer, since it cannot tell where the next request on it would start.
So such a body is the client's mistake, a 400 naming it, and the answer says ``Connection:
close`` so that a keep-alive client does not send its next request into a closed socket. A body
that stops arriving is refused alike, with 408 (:mod:`autoglm.web.body_timeout` says when). Every
component's server reads bodies through here, under the
:class:`~autoglm.web.body_timeout.BodyTimeout` its application keeps at ``BODY_TIMEOUT``.
"""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import TypeVar

from aiohttp import web

from autoglm.web.body_timeout import BODY_TIMEOUT, BodyTimedOut

R = TypeVar("R", bound=web.StreamResponse)


class UnreadableBody(ValueError):
    """The body could not be read to its end; the message says why and what to send instead,
    ``status`` what to answer (400, or 408 for a body that stopped arriving)."""

    def __init__(self, message: str, status: int = HTTPStatus.BAD_REQUEST) -> None:
        super().__init__(message)
        self.status = status


def refusal_status(error: Exception, otherwise: int) -> int:
    """The status to refuse a request with for ``error``: its :class:`UnreadableBody`'s when it
    is one or was raised from one (a protocol's own error type wrapping it), else ``otherwise``."""
    for cause in (error, error.__cause__):
        if isinstance(cause, UnreadableBody):
            return cause.status
    return otherwise


async def read_whole(request: web.Request) -> bytes:
    """The body as ``request.read()`` reads it, within the application's :data:`BODY_TIMEOUT`;
    :class:`UnreadableBody` when it does not decode, stops arriving, or the client closed the
    connection before its end (which aiohttp would log as an error with a traceback, for what is
    a client going away)."""
    try:
        return await request.config_dict[BODY_TIMEOUT].read(request)
    except BodyTimedOut as exc:
        raise UnreadableBody(str(exc), HTTPStatus.REQUEST_TIMEOUT) from None
    except ConnectionResetError:  # the client left mid-body: nothing to answer, nothing broken
        raise UnreadableBody(
            "the client closed the connection before the end of the request body"
        ) from None
    except web.RequestPayloadError as exc:
        cause = getattr(exc.__cause__, "message", None) or " ".join(str(exc).split())
        raise UnreadableBody(
            f"request body could not be read ({cause}); send it uncompressed, or compressed as "
            "its Content-Encoding header says"
        ) from None


def closing_if_unreadable(response: R, error: Exception) -> R:
    """``response`` to a refused request, closing its connection when ``error`` (or what it was
    raised from) is an :class:`UnreadableBody`.

    After the answer aiohttp reads on through the rest of that body, meets the same decoding
    error (or the failure a body that timed out is left with) and logs it with a traceback as an
    "Unhandled exception"; the answer already said all there is, so that record is dropped
    (:func:`_not_an_answered_body`).
    """
    if isinstance(error, UnreadableBody) or isinstance(error.__cause__, UnreadableBody):
        response.force_close()
        # addFilter skips a filter that is already there: once per process
        logging.getLogger("aiohttp.server").addFilter(_not_an_answered_body)
    return response


def _not_an_answered_body(record: logging.LogRecord) -> bool:
    error = record.exc_info[1] if record.exc_info else None
    return not isinstance(error, web.RequestPayloadError)
