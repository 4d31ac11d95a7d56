"""Running the model in a process of its own (``--model-process``), out of the server's GIL.

In one process the model's thread and the event loop share one interpreter lock. torch lets the
lock go inside each operator but takes it back between operators, and a thread that wants it back
waits until the holder gives it up: up to the interpreter's switch interval (5 ms) when the loop
is busy parsing requests. A forward pass of a few operators then takes several times its own
time exactly when the server is loaded, so batches run slower, queues grow and the latency SLO
is missed at a rate the CPU could hold (docs/batcher-serving.md has the measurements).

Here the model runs in a child process with an interpreter of its own, and the engine's
:class:`~batcher.execution.BatchExecutor` is :class:`ModelProcess`: each batch goes to the child
as one frame over a private socket pair (the requests' tensors as raw bytes after a small JSON
envelope, :mod:`batcher.forwarding`'s framing) and its outcome comes back the same way. What the
engine decides and how it recovers (out-of-memory splits, model errors) is unchanged: the child
runs each batch through :func:`~batcher.execution.run_guarded` and sends back the
:class:`~batcher.execution.Outcome`. A child that dies fails its batch, the batches after it fail
fast while a new child loads the model, and serving resumes.

On CUDA the allocator and the CUDA context live in the child, and this process never touches
CUDA: the child sends the device's headroom with every answer (the engine's memory cap reads it)
and the allocator's statistics now and then (the memory series), and the engine's idle release
is passed on to it (:class:`ReportedMemory`). In a model repository it serves CPU models only
for now: there the models share one memory budget read in this process.

The child's side is :mod:`batcher.model_process_child`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any, cast

import numpy as np
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from batcher import oip
from batcher.config import BatcherConfig
from batcher.execution import Outcome
from batcher.forwarding import FrameReader, frame
from batcher.memory import MemoryMonitor, bucket_size
from batcher.tensor_spec import TensorSpec

log = logging.getLogger(__name__)

Payload = dict[str, np.ndarray]
START_TIMEOUT_SECONDS = 600.0  # a large model from a slow disk
RESTART_BACKOFF_SECONDS = 1.0  # after a child that did not load, doubled up to the maximum
RESTART_BACKOFF_MAX_SECONDS = 60.0


class ModelProcessFailed(RuntimeError):
    """The child could not load the model: its one line on why, or how it ended."""


def encode_payloads(payloads: Sequence[Payload]) -> tuple[list[list[list[Any]]], bytes]:
    """Each payload's tensors as ``[name, datatype, shape, bytes]`` and their raw bytes, joined."""
    described: list[list[list[Any]]] = []
    parts: list[bytes] = []
    for payload in payloads:
        tensors = []
        for name, array in payload.items():
            datatype = oip.datatype_of(array)
            raw = oip.encode_binary_output(name, datatype, array)
            tensors.append([name, datatype, list(array.shape), len(raw)])
            parts.append(raw)
        described.append(tensors)
    return described, b"".join(parts)


def decode_payloads(described: list[list[list[Any]]], raw: bytes) -> list[Payload]:
    """The payloads :func:`encode_payloads` described, read back from ``raw``."""
    view = memoryview(raw)
    offset = 0
    payloads = []
    for tensors in described:
        payload = {}
        for name, datatype, shape, length in tensors:
            raw_tensor = view[offset : offset + length]
            payload[name] = oip.decode_binary_data(
                bytes(raw_tensor) if datatype == "BYTES" else raw_tensor,  # type: ignore[arg-type]
                name,
                datatype,
                oip.DATATYPES[datatype],
                shape,
            )
            offset += length
        payloads.append(payload)
    return payloads


class _Replies(asyncio.Protocol):
    """The parent's end of the socket: hands each reply frame to the waiting batch."""

    def __init__(self, owner: ModelProcess) -> None:
        self._owner = owner
        self._reader = FrameReader(None)

    def data_received(self, data: bytes) -> None:
        for _, envelope, payload in self._reader.feed(data):
            self._owner._replied(envelope, payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self._owner._lost()


class ModelProcess:
    """The engine's executor when the model runs in a child process; one batch at a time, the
    next one queued in the socket while it runs (``queues_batches``).

    :meth:`start` spawns the child and waits until it has loaded the model (blocking: call it
    before serving, or on a worker thread); the model's signature comes back with it.
    """

    def __init__(self, config: BatcherConfig, device: str) -> None:
        # what the child is sent first: the model's settings and its device, as JSON
        self.settings = {"config": dataclasses.asdict(config), "device": device}
        self.device = device  # as the child settled it (``auto`` decided), once it is up
        self.name = ""
        self.inputs: tuple[TensorSpec, ...] = ()
        self.outputs: tuple[TensorSpec, ...] = ()
        self.pads = False
        self.parameter_bytes = 0.0
        self.buckets: tuple[int, ...] | None = None
        self.memory: dict[str, Any] = {}  # the child's last memory report ({} on CPU)
        self.restarts = 0
        self.up = False  # a child has loaded the model and has not died since
        self.queues_batches = True
        self._proc: subprocess.Popen | None = None
        self._sock: socket.socket | None = None
        self._transport: asyncio.Transport | None = None
        # the batches sent and not answered yet, oldest first: the child answers in order
        self._pending: collections.deque[asyncio.Future[Outcome]] = collections.deque()
        self._restarting: asyncio.Task[None] | None = None
        self._connecting: asyncio.Future[tuple[asyncio.BaseTransport, Any]] | None = None
        self._closing = False
        self._calls = 0

    # --- the child's life ------------------------------------------------------------------

    def start(self) -> None:
        """Spawn the child and wait for the model's signature; :class:`ModelProcessFailed`
        with the child's one line on why it could not load the model, or how it ended (a child
        silent for :data:`START_TIMEOUT_SECONDS` is killed)."""
        ours, theirs = socket.socketpair()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "batcher.model_process_child", "--fd", str(theirs.fileno())],
            pass_fds=(theirs.fileno(),),
            stdin=subprocess.DEVNULL,
        )
        theirs.close()
        ours.sendall(frame(0, self.settings))
        try:
            signature = read_frame(ours, time.monotonic() + START_TIMEOUT_SECONDS)
        except TimeoutError:
            ours.close()
            self._proc.kill()
            self._proc.wait()
            raise ModelProcessFailed(
                f"the model process did not load the model within {START_TIMEOUT_SECONDS:.0f} s"
            ) from None
        if signature is None:
            ours.close()
            code = self._proc.wait(timeout=30)
            raise ModelProcessFailed(f"the model process exited with code {code} while loading")
        envelope = signature[1]
        if "error" in envelope:
            ours.close()
            self._proc.wait(timeout=30)
            raise ModelProcessFailed(envelope["error"])
        self.name = envelope["name"]
        self.device = envelope["device"]
        self.inputs = tuple(TensorSpec(n, d, tuple(s)) for n, d, s in envelope["inputs"])
        self.outputs = tuple(TensorSpec(n, d, tuple(s)) for n, d, s in envelope["outputs"])
        self.pads = envelope["pads"]
        self.parameter_bytes = envelope["parameter_bytes"]
        self.memory = envelope["memory"]
        self._sock = ours
        self.up = True
        log.info(
            "model process ready",
            extra={"pid": self._proc.pid, "model": self.name, "device": self.device},
        )

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def close(self) -> None:
        """Stop the child: it exits when its socket closes (SIGKILL if it does not in 30 s)."""
        self._closing = True
        if self._restarting is not None:
            self._restarting.cancel()
        transport, self._transport = self._transport, None
        if transport is not None:
            with contextlib.suppress(RuntimeError):  # its event loop has ended already
                transport.close()
        if self._sock is not None:
            self._sock.close()
        if self._proc is not None:
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()

    def _lost(self) -> None:
        """The socket closed: the child exited. Fail the batches it held and start a new one."""
        self._transport, self._connecting = None, None
        self.up = False
        while self._pending:
            waiting = self._pending.popleft()
            if not waiting.done():
                waiting.set_result(Outcome(error="the model process ended while running the batch"))
        if not self._closing:
            self._restarting = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        """Start children until one loads the model, waiting longer after each that does not
        (a model that fails to load now may load once a disk or a device is back); the model
        stays not ready meanwhile."""
        if self._proc is not None:
            code = await asyncio.to_thread(self._proc.wait)
            log.error("model process exited; starting another", extra={"exit_code": code})
        backoff = RESTART_BACKOFF_SECONDS
        while not self._closing:
            try:
                await asyncio.to_thread(self.start)
            except (ModelProcessFailed, OSError, TimeoutError) as exc:
                log.error(
                    "model process could not be restarted; trying again",
                    extra={"error": str(exc), "retry_in_seconds": backoff},
                )
                await asyncio.sleep(backoff)
                backoff = min(2 * backoff, RESTART_BACKOFF_MAX_SECONDS)
                continue
            self.restarts += 1
            return

    # --- the executor -------------------------------------------------------------------------

    def batch_size_for(self, items: int) -> int:
        return bucket_size(items, self.buckets) if self.buckets else items

    async def execute(self, payloads: list[Payload]) -> Outcome:
        if self._transport is None:
            if self._restarting is not None and not self._restarting.done():
                return Outcome(error="the model process is restarting; retry shortly")
            if self._sock is None or self._sock.fileno() < 0:
                return Outcome(error="the model process is gone and could not be restarted")
            await self._connect()
        return await self.send(payloads)

    async def _connect(self) -> None:
        """Attach the socket to this loop, once for all the batches that ask meanwhile."""
        if self._connecting is None:
            loop = asyncio.get_running_loop()
            self._connecting = asyncio.ensure_future(
                loop.create_connection(lambda: _Replies(self), sock=self._sock)
            )
        transport, _ = await asyncio.shield(self._connecting)
        self._transport = cast(asyncio.Transport, transport)  # a socket's: readable, writable

    def send(self, payloads: list[Payload]) -> asyncio.Future[Outcome]:
        if self._transport is None:  # not connected yet, or the child is being replaced
            return asyncio.ensure_future(self.execute(payloads))
        described, raw = encode_payloads(payloads)
        self._calls += 1
        waiting: asyncio.Future[Outcome] = asyncio.get_running_loop().create_future()
        self._pending.append(waiting)
        envelope = {"tensors": described, "buckets": list(self.buckets) if self.buckets else None}
        self._transport.write(frame(self._calls, envelope, raw))
        return waiting

    def release_cache(self, last_activity: float) -> bool:
        """Ask the child to give its allocator's cached blocks back (not answered); False when
        there is no child to ask."""
        if self._transport is None:
            return False
        self._transport.write(frame(0, {"release": last_activity}))
        return True

    def _replied(self, envelope: dict[str, Any], payload: bytes) -> None:
        self.memory = {**self.memory, **envelope["memory"]}  # stats come now and then
        if not self._pending:
            return
        waiting = self._pending.popleft()
        if waiting.done():
            return
        waiting.set_result(
            Outcome(
                results=decode_payloads(envelope["tensors"], payload),
                out_of_memory=envelope["out_of_memory"],
                error=envelope["error"],
                seconds=envelope["seconds"],
                finished_at=envelope["finished_at"],
                peak_bytes=envelope["peak_bytes"],
            )
        )


class ReportedMemory(MemoryMonitor):
    """The engine's view of the device memory of a model running in a :class:`ModelProcess`:
    what the child reported with its last answer (the allocator and the CUDA context live
    there; this process never touches CUDA), and idle release passed on to it."""

    def __init__(self, process: ModelProcess, device: str, idle_release_seconds: float) -> None:
        super().__init__(device, idle_release_seconds)
        self.process = process

    def stats(self) -> dict[str, float]:
        return dict(self.process.memory.get("stats", {}))

    def headroom_bytes(self) -> float | None:
        return self.process.memory.get("headroom_bytes")

    def release(self, last_activity: float) -> bool:
        self._released_after = last_activity
        if not self.is_cuda or not self.process.release_cache(last_activity):
            return False
        self.releases += 1
        return True


class ModelProcessCollector(Collector):
    """``autoglm_batcher_model_process_up{model}`` (1 while a child serves batches) and
    ``autoglm_batcher_model_process_restarts_total{model}`` (children started after one died)."""

    def __init__(self, process: ModelProcess) -> None:
        self.process = process

    def collect(self) -> Iterable[Metric]:
        name = self.process.name
        up = GaugeMetricFamily(
            "autoglm_batcher_model_process_up",
            "1 while the model's child process is serving batches; 0 while it is replaced.",
            labels=["model"],
        )
        up.add_metric([name], 1.0 if self.process.up else 0.0)
        restarts = CounterMetricFamily(
            "autoglm_batcher_model_process_restarts",
            "Model processes started after the previous one died.",
            labels=["model"],
        )
        restarts.add_metric([name], float(self.process.restarts))
        return [up, restarts]


def read_frame(sock: socket.socket, deadline: float) -> tuple[int, dict, bytes] | None:
    """One whole frame from a blocking socket; None at end of stream."""
    reader = FrameReader(None)
    while time.monotonic() < deadline:
        sock.settimeout(max(0.0, deadline - time.monotonic()))
        data = sock.recv(1 << 20)
        if not data:
            return None
        frames = reader.feed(data)
        if frames:
            return frames[0]
    raise TimeoutError("the model process sent nothing in time")
