"""How long a request body may take to arrive, and what becomes of one that stops.

aiohttp waits for a body's next bytes without end, so a client that sends its headers with a
``Content-Length`` and then stalls, or trickles a byte now and then (slowloris), holds a
handler, a connection and its buffers for as long as it likes. (Request headers are bounded
already: aiohttp closes a connection whose request has not fully arrived by the keep-alive
timeout after the connection opened or after its previous answer, 60 s here and 75 s on the
batcher, trickled or not; bytes that arrive do not extend it.)

:class:`BodyTimeout` bounds the body with one setting, ``seconds``, in two ways:

- no wait for the body's next bytes longer than ``seconds``: a client that stalls is cut after
  that long, whatever the body's size;
- after a grace of ``seconds``, the body so far must have come at :data:`MIN_BODY_RATE` on
  average: a client that trickles just often enough to pass the first bound is cut soon after.

Why not one deadline for the whole body: an honest upload's time grows with its size and its
link (the batcher's largest body by default, 16 MiB, takes over two minutes at 1 Mbit/s), and a
deadline long enough for that lets a stalled client hold on as long. Why not the pause bound
alone (nginx's ``client_body_timeout``): a byte a little more often than every ``seconds`` passes
it for as long as its ``Content-Length`` lasts, months for 1 MiB. The minimum rate is Apache
``mod_reqtimeout``'s ``MinRate``, at 16 KiB/s (128 kbit/s, below any link a server's clients
upload over, so a progressing upload is never cut); the bytes counted are those aiohttp hands
on, decompressed when a ``Content-Encoding`` says so, so the credit a body can earn stops at the
largest body accepted. The default of 20 s is ``mod_reqtimeout``'s for the body: above the
pauses of a working TCP connection (retransmissions back off to a few seconds), short enough that
a client stalling on purpose ties up a connection for little longer than that.

A body cut short is refused with 408 and one line saying how it stopped (the caller answers,
through :func:`autoglm.web.body.read_whole`), and its connection is closed as soon as that is
sent; each is counted (``autoglm_http_request_body_timeouts_total``) and logged.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from aiohttp import web
from prometheus_client import Counter

log = logging.getLogger(__name__)

BODY_TIMEOUT_S = 20.0
MIN_BODY_RATE = 16 * 1024  # bytes a second, on average, once BodyTimeout.seconds have passed


class BodyTimedOut(Exception):
    """The body stopped arriving, or came too slowly; the message says which."""


@dataclass(frozen=True)
class BodyTimeout:
    """The bounds on a body's arrival that an application's requests are read under.

    ``timeouts`` counts the bodies cut short; ``None`` where the server's owner exports no
    connection metrics (the batcher's engine behind front workers, which count their own).
    """

    seconds: float = BODY_TIMEOUT_S
    timeouts: Counter | None = None

    async def read(self, request: web.Request) -> bytes:
        """The whole body, as ``request.read()`` reads it (aiohttp's 413 past the
        application's ``client_max_size`` included); :class:`BodyTimedOut` when it stops."""
        if request.content.is_eof():
            # The whole body came with the headers (an inference request, nearly always):
            # nothing to wait for, so none of the timers below on the serving path.
            return await request.read()
        loop = asyncio.get_running_loop()
        started = loop.time()
        limit = request.client_max_size
        chunks: list[bytes] = []
        received = 0
        while True:
            credit = started + self.seconds + received / MIN_BODY_RATE - loop.time()
            wait = min(self.seconds, credit)
            if wait <= 0:
                raise self._cut(request, received, stalled=False)
            try:
                async with asyncio.timeout(wait):
                    chunk = await request.content.readany()
            except TimeoutError:
                raise self._cut(request, received, stalled=wait == self.seconds) from None
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)
            received += len(chunk)
            if limit and received > limit:
                raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=received)

    def _cut(self, request: web.Request, received: int, stalled: bool) -> BodyTimedOut:
        """Count and log a body cut short, and fail what is left of it: aiohttp would otherwise
        read on through it for up to 10 s after the answer (its lingering close) before closing
        the connection; failed, it closes as soon as the answer is sent (and logs the failure,
        which :func:`autoglm.web.body.closing_if_unreadable` drops)."""
        of = f" of {request.content_length}" if request.content_length is not None else ""
        if stalled:
            how = f"nothing arrived for {self.seconds:g} s ({received}{of} bytes received)"
        else:
            how = f"{received}{of} bytes came slower than {MIN_BODY_RATE // 1024} KiB/s"
        message = f"request body timed out: {how}; send the whole body right after the headers"
        if self.timeouts is not None:
            self.timeouts.inc()
        log.info(
            "request body timed out",
            extra={
                "method": request.method,
                "path": request.path,
                "client": request.remote,
                "received_bytes": received,
                "content_length": request.content_length,
                "reason": "stalled" if stalled else "too slow",
            },
        )
        request.content.set_exception(web.RequestPayloadError(message))
        return BodyTimedOut(message)


BODY_TIMEOUT = web.AppKey("body_timeout", BodyTimeout)
"""Where an application keeps the :class:`BodyTimeout` its requests' bodies are read under."""
