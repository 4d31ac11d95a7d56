"""The front worker processes of ``--workers N``: started, kept alive, and drained by the engine.

The engine binds one listening socket per worker on the public port with ``SO_REUSEPORT`` (the
kernel spreads new connections over them) and hands each worker (:mod:`batcher.front_worker`) its
own by file descriptor. The engine keeps every socket open for the whole run, so while a worker
is replaced the connections arriving on its socket wait in that socket's queue for the
replacement instead of being reset, and the port is never free for another process. A worker
says it listens by writing ``ready`` on its stdout; its log lines go to the engine's stderr, each
carrying ``worker``.

A worker that exits while the engine is serving is started again (a warning and
``autoglm_batcher_worker_restarts_total``), after a pause that doubles while replacements keep
dying young, so a worker that cannot start does not spin a core. :meth:`WorkerPool.stop` sends
each worker SIGTERM, and a worker stops accepting and finishes what it holds before it exits;
the engine drains its own queues only after that, so nothing a worker accepted is lost.

With ``--grpc-listen`` every worker serves gRPC too (:mod:`batcher.grpc_front`): grpc.aio binds
its own socket, so each worker binds the gRPC port with ``SO_REUSEPORT`` while the engine holds
it bound (not listening); connections to a worker being replaced are refused there, not queued.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter

from autoglm.child_process import dies_with_this_process
from autoglm.config import ConfigError
from autoglm.web.binding import bind_socket
from autoglm.web.listener import BACKLOG

log = logging.getLogger(__name__)

READY_LINE = b"ready\n"  # what a worker writes on its stdout once it listens
CHANNEL_SOCKET = "engine.sock"  # in the private folder: inference calls, as frames
HTTP_SOCKET = "http.sock"  # in the private folder: the engine's routes, without the guard
FORWARDED_GRPC = "/grpc/"  # on HTTP_SOCKET: the gRPC calls the workers pass on, never public
START_TIMEOUT_S = 60.0
# Pauses before a replacement: doubled while workers die within STABLE_S of starting.
FIRST_RESTART_DELAY_S = 0.5
MAX_RESTART_DELAY_S = 10.0
STABLE_S = 30.0
METRICS_FOLDER = "metrics"


@dataclass(frozen=True)
class WorkerSettings:
    """How many front workers, and what each is told on its command line."""

    count: int
    web_config_file: str
    max_body_bytes: int
    body_timeout_seconds: float
    drain_timeout_seconds: float
    log_level: str
    log_format: str


class WorkerPool:
    """``settings.count`` front workers serving one port through the engine's channel in
    ``channel_dir`` (:mod:`batcher.engine_channel`); their metrics files go to
    ``channel_dir/metrics`` (prometheus_client's multiprocess mode)."""

    def __init__(self, settings: WorkerSettings, registry: CollectorRegistry) -> None:
        self.count = settings.count
        self.settings = settings
        self.restarts = Counter(
            "autoglm_batcher_worker_restarts",
            "Front worker processes (--workers) started again after one exited on its own.",
            registry=registry,
        )
        self._processes: dict[int, asyncio.subprocess.Process] = {}
        self._sockets: list[socket.socket] = []
        self._channel_dir = Path()
        self._keepers: list[asyncio.Task[None]] = []
        self._stopping = False
        self._grpc_listen = ""

    async def start(
        self, host: str, first: socket.socket, channel_dir: Path, grpc_listen: str = ""
    ) -> None:
        """Listen on ``first`` (bound with ``SO_REUSEPORT``) and as many more sockets on its
        port as there are workers beyond one, start every worker and wait until each listens;
        :class:`ConfigError` (after stopping those that did start) when one does not.

        ``grpc_listen`` (``HOST:PORT``, a port the engine holds bound with ``SO_REUSEPORT``):
        every worker also serves gRPC there, binding the port itself (grpc.aio takes no socket).
        """
        self._grpc_listen = grpc_listen
        port = first.getsockname()[1]
        self._sockets = [first] + [
            bind_socket(host, port, reuse_port=True) for _ in range(self.count - 1)
        ]
        for sock in self._sockets:
            sock.listen(BACKLOG)
        self._channel_dir = channel_dir
        started = await asyncio.gather(*(self._start_one(slot) for slot in range(self.count)))
        failed = [problem for problem in started if problem]
        if failed:
            await self.stop(timeout=5.0)
            raise ConfigError(f"--workers: {failed[0]}; its log lines above say why")
        self._keepers = [
            asyncio.get_running_loop().create_task(self._keep(slot)) for slot in range(self.count)
        ]

    @property
    def pids(self) -> list[int]:
        """The workers' process ids now, by slot."""
        running = (self._processes[slot] for slot in sorted(self._processes))
        return [p.pid for p in running if p.returncode is None]

    async def stop(self, timeout: float) -> bool:
        """SIGTERM every worker and wait for them to finish what they hold; True if all exited
        in time (the others are killed)."""
        self._stopping = True
        for keeper in self._keepers:
            keeper.cancel()
        await asyncio.gather(*self._keepers, return_exceptions=True)
        live = [p for p in self._processes.values() if p.returncode is None]
        for process in live:
            process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(asyncio.gather(*(p.wait() for p in live)), timeout)
        except TimeoutError:
            for process in live:
                if process.returncode is None:
                    log.error(
                        "front worker did not drain in time; killed", extra={"pid": process.pid}
                    )
                    process.kill()
                    await process.wait()
            return False
        finally:
            for sock in self._sockets:
                sock.close()
        return True

    async def _start_one(self, slot: int) -> str:
        """Start the worker of ``slot``; '' once it listens, else what went wrong."""
        channel_dir = self._channel_dir
        listening = self._sockets[slot]
        settings = self.settings
        command = [
            sys.executable,
            *("-m", "batcher.front_worker", "--worker", str(slot)),
            *("--socket-fd", str(listening.fileno()), "--channel-dir", str(channel_dir)),
            *("--web-config-file", settings.web_config_file),
            *("--max-body-bytes", str(settings.max_body_bytes)),
            *("--body-timeout-seconds", str(settings.body_timeout_seconds)),
            *("--drain-timeout-seconds", str(settings.drain_timeout_seconds)),
            *("--log-level", settings.log_level, "--log-format", settings.log_format),
            *("--grpc-listen", self._grpc_listen),
        ]
        environment = dict(os.environ, PROMETHEUS_MULTIPROC_DIR=str(channel_dir / METRICS_FOLDER))
        # SIGTERM (a drain) from the kernel when the engine dies without stopping the worker:
        # the engine's event loop runs on its main thread (asyncio.run in batcher.cli), which
        # lives as long as the engine; the signal comes when the thread that forked ends.
        process = await asyncio.create_subprocess_exec(
            *command,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            env=environment,
            pass_fds=(listening.fileno(),),
            preexec_fn=dies_with_this_process(),
        )
        self._processes[slot] = process
        assert process.stdout is not None
        try:
            line = await asyncio.wait_for(process.stdout.readline(), START_TIMEOUT_S)
        except TimeoutError:
            line = b""
        if line == READY_LINE:
            log.info("front worker listening", extra={"worker": slot, "pid": process.pid})
            return ""
        if process.returncode is None:
            process.kill()
        code = await process.wait()
        return f"front worker {slot} did not start (exit code {code})"

    async def _keep(self, slot: int) -> None:
        """Start the worker of ``slot`` again whenever it exits, until :meth:`stop`."""
        loop = asyncio.get_running_loop()
        delay = FIRST_RESTART_DELAY_S / 2  # doubled before the first pause
        started = loop.time()
        while True:
            process = self._processes[slot]
            code = await process.wait()
            if self._stopping:
                return
            self.restarts.inc()
            young = loop.time() - started < STABLE_S
            delay = min(delay * 2, MAX_RESTART_DELAY_S) if young else FIRST_RESTART_DELAY_S
            log.warning(
                "front worker exited; starting another",
                extra={"worker": slot, "pid": process.pid, "exit_code": code, "in_seconds": delay},
            )
            await asyncio.sleep(delay)
            if self._stopping:
                return
            started = loop.time()
            problem = await self._start_one(slot)
            if problem:
                log.error(
                    "front worker replacement failed", extra={"worker": slot, "error": problem}
                )
