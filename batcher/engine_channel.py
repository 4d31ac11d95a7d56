"""The private Unix-socket channel between the front workers and the engine, both ends.

A worker keeps one connection to the engine and sends each inference on it as a frame
(:mod:`batcher.forwarding`) with a call id of its own, so many requests are in flight on one
connection and answers come back in whatever order their batches finish. The engine's end runs
each call as a task of the event loop that also dispatches batches: the engine's whole cost per
request is the frame, a small JSON header and the answer's bytes, with no HTTP parsing or routing.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from batcher.forwarding import CANCEL, NO_ANSWER, ChannelError, FrameReader, frame
from batcher.oip import error_body

log = logging.getLogger(__name__)

_MAX_CALL_ID = 0xFFFFFFFF

Envelope = dict[str, Any]
Call = Callable[[Envelope, bytes], Awaitable[tuple[Envelope, bytes]]]
Notice = Callable[[Envelope], None]


class _Outbox:
    """Frames for one connection, written together once per turn of the event loop: a batch's
    answers (or the requests a worker read in one turn) cost one write, not one each."""

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._frames: list[bytes] = []

    def send(self, data: bytes) -> None:
        if not self._frames:
            asyncio.get_running_loop().call_soon(self._flush)
        self._frames.append(data)

    def _flush(self) -> None:
        if not self._transport.is_closing():
            self._transport.write(b"".join(self._frames))
        self._frames.clear()


class EngineEnd(asyncio.Protocol):
    """One worker's connection, at the engine: answers each call with ``call``'s result and
    hands messages that expect no answer to ``notice``."""

    def __init__(
        self, call: Call, notice: Notice, calls: set[asyncio.Task[None]], max_frame_bytes: int
    ) -> None:
        self._call = call
        self._notice = notice
        self._calls = calls  # shared by every connection, so a drain can wait for all of them
        self._answering: dict[int, asyncio.Task[None]] = {}  # this connection's, by call id
        self._reader = FrameReader(max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._outbox: _Outbox | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._outbox = _Outbox(transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except (ChannelError, ValueError) as exc:
            log.error("closing a worker's channel: unreadable frame", extra={"error": str(exc)})
            assert self._transport is not None
            self._transport.abort()
            return
        loop = asyncio.get_running_loop()
        for call_id, envelope, payload in frames:
            if call_id == NO_ANSWER:
                if CANCEL in envelope:  # its caller gave up: drop the call, as one process would
                    self._cancel(envelope[CANCEL])
                else:
                    self._notice(envelope)
                continue
            task = loop.create_task(self._answer(call_id, envelope, payload))
            self._calls.add(task)
            self._answering[call_id] = task
            task.add_done_callback(self._calls.discard)

    def _cancel(self, call_id: int) -> None:
        """Cancel a call in progress (its request leaves the queue, counted "cancelled")."""
        task = self._answering.pop(call_id, None)
        if task is not None:
            task.cancel()

    def connection_lost(self, exc: Exception | None) -> None:
        self._transport = None

    async def _answer(self, call_id: int, envelope: Envelope, payload: bytes) -> None:
        try:
            answer, body = await self._call(envelope, payload)
        except Exception:  # a bug must not leave the worker's client waiting: answer 500
            log.exception("a worker's call failed", extra={"model": envelope.get("model")})
            answer, body = {"status": 500, "header_length": None}, error_body("internal error")
        finally:
            self._answering.pop(call_id, None)
        if self._outbox is not None and self._transport is not None:
            self._outbox.send(frame(call_id, answer, body))


class WorkerEnd(asyncio.Protocol):
    """The connection to the engine, at a worker: :meth:`call` sends a frame and waits for the
    answer with its call id."""

    def __init__(self) -> None:
        self._reader = FrameReader(None)  # answers: as large as the model's outputs make them
        self._pending: dict[int, asyncio.Future[tuple[Envelope, bytes]]] = {}
        self._last_id = NO_ANSWER
        self._transport: asyncio.Transport | None = None
        self._outbox: _Outbox | None = None
        self.closed = asyncio.get_running_loop().create_future()

    @classmethod
    async def connect(cls, path: str) -> WorkerEnd:
        """A connection to the engine's channel socket at ``path``."""
        _, end = await asyncio.get_running_loop().create_unix_connection(cls, path)
        return end

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport
        self._outbox = _Outbox(transport)

    def data_received(self, data: bytes) -> None:
        try:
            frames = self._reader.feed(data)
        except (ChannelError, ValueError) as exc:
            self._fail(ChannelError(f"unreadable frame from the engine: {exc}"))
            return
        for call_id, envelope, payload in frames:
            waiter = self._pending.pop(call_id, None)
            if waiter is not None and not waiter.done():
                waiter.set_result((envelope, payload))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ChannelError("the engine closed the channel"))

    def _fail(self, error: ChannelError) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            transport.abort()
        for waiter in self._pending.values():
            if not waiter.done():
                waiter.set_exception(error)
        self._pending.clear()
        if not self.closed.done():
            self.closed.set_result(None)

    async def call(self, envelope: Envelope, payload: bytes) -> tuple[Envelope, bytes]:
        """Send one call; the engine's answer (envelope and body). :class:`ChannelError` when
        the channel is gone."""
        if self._transport is None or self._outbox is None:
            raise ChannelError("the engine closed the channel")
        self._last_id = call_id = self._last_id % _MAX_CALL_ID + 1  # 1.._MAX_CALL_ID, round
        waiter = asyncio.get_running_loop().create_future()
        self._pending[call_id] = waiter
        self._outbox.send(frame(call_id, envelope, payload))
        try:
            return await waiter
        except asyncio.CancelledError:  # a client's deadline passed: the engine drops it too
            if self._pending.pop(call_id, None) is not None:
                self.notify({CANCEL: call_id})
            raise

    def notify(self, envelope: Envelope) -> None:
        """Send a message that expects no answer (dropped when the channel is gone)."""
        if self._transport is not None and self._outbox is not None:
            self._outbox.send(frame(NO_ANSWER, envelope))

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
