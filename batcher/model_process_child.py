"""The model process's side of ``--model-process`` (:mod:`batcher.model_process`): load the model,
say its signature, then run each batch the server sends and answer it, until the server closes
the socket. Its log lines go to the server's stderr.

    python -m batcher.model_process_child --fd N     # started by ModelProcess, never by hand
"""

from __future__ import annotations

import argparse
import math
import signal
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from batcher.forwarding import FRAME_HEADER, ChannelError, frame
from batcher.memory import MemoryMonitor
from batcher.model_process import decode_payloads, encode_payloads, read_frame


def _recv_exactly(sock: socket.socket, count: int) -> bytes | None:
    chunks = bytearray()
    while len(chunks) < count:
        data = sock.recv(min(count - len(chunks), 1 << 22))
        if not data:
            return None
        chunks += data
    return bytes(chunks)


STATS_EVERY_SECONDS = 1.0  # the allocator's statistics are read for /metrics, not per batch


class MemoryReport:
    """What the server's engine reads of the device's memory, as this process sees it: the
    headroom with every answer (the batch cap follows it) and the allocator's statistics (its
    series) at most every :data:`STATS_EVERY_SECONDS`; nothing on CPU."""

    def __init__(self, memory: MemoryMonitor, clock: Callable[[], float] = time.monotonic) -> None:
        self.memory = memory
        self._clock = clock
        self._stats_at = -math.inf

    def __call__(self) -> dict[str, Any]:
        if not self.memory.is_cuda:
            return {}
        report: dict[str, Any] = {"headroom_bytes": self.memory.headroom_bytes()}
        now = self._clock()
        if now - self._stats_at >= STATS_EVERY_SECONDS:
            report["stats"] = self.memory.stats()
            self._stats_at = now
        return report


def serve_batches(sock: socket.socket, model: Any, memory: MemoryMonitor) -> None:
    """Run each batch that arrives and answer it, until the parent closes the socket.

    A frame with ``release`` (call id 0) asks for the allocator's cache back after an idle
    period and is not answered.
    """
    import orjson

    from batcher.execution import run_guarded

    report = MemoryReport(memory)

    while (header := _recv_exactly(sock, FRAME_HEADER.size)) is not None:
        call_id, head_length, payload_length = FRAME_HEADER.unpack(header)
        body = _recv_exactly(sock, head_length + payload_length)
        if body is None:
            return
        envelope = orjson.loads(body[:head_length])
        if "release" in envelope:
            memory.release(envelope["release"])
            continue
        model.use_buckets(envelope["buckets"])
        payloads = decode_payloads(envelope["tensors"], body[head_length:])
        outcome = run_guarded(model.run, payloads, memory)
        described, raw = encode_payloads(outcome.results)
        reply = {
            "tensors": described,
            "out_of_memory": outcome.out_of_memory,
            "error": outcome.error,
            "seconds": outcome.seconds,
            "finished_at": outcome.finished_at,
            "peak_bytes": outcome.peak_bytes,
            "memory": report(),
        }
        sock.sendall(frame(call_id, reply, raw))


def child_main(argv: Sequence[str] | None = None) -> int:
    """Serve one parent over the socket pair end ``--fd``; 2 when the model does not load."""
    # Ctrl-C reaches the whole process group, and some supervisors signal every process of a
    # container: the server drains on those signals and needs its model until the last
    # accepted request is answered. This process ends when the server closes the socket.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    parser = argparse.ArgumentParser(prog="batcher.model_process")
    parser.add_argument("--fd", type=int, required=True)
    sock = socket.socket(fileno=parser.parse_args(argv).fd)
    first = read_frame(sock, time.monotonic() + 60)
    if first is None:
        return 0
    settings = first[1]
    from autoglm.config import ConfigError
    from autoglm.logs import setup_logging
    from batcher.cli import load_served_model
    from batcher.config import BatcherConfig

    config = BatcherConfig(**settings["config"])
    setup_logging("batcher", config.log_level, config.log_format, role="model-process")
    try:
        model = load_served_model(config, settings["device"])
    except ConfigError as exc:
        sock.sendall(frame(0, {"error": str(exc)}))
        return 2
    memory = MemoryMonitor(model.device, config.idle_release_seconds)
    signature = {
        "name": model.name,
        "device": model.device,
        "inputs": [[s.name, s.datatype, list(s.shape)] for s in model.inputs],
        "outputs": [[s.name, s.datatype, list(s.shape)] for s in model.outputs],
        "pads": model.pads,
        "parameter_bytes": model.parameter_bytes(),
        "memory": MemoryReport(memory)(),
    }
    sock.sendall(frame(0, signature))
    sock.settimeout(None)
    try:
        serve_batches(sock, model, memory)
    except (ChannelError, ConnectionError):
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(child_main())
