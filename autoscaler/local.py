"""What gets scaled in local mode: a group of worker processes, each playing a pod.

The group is a :class:`~autoscaler.scale_target.ScaleTarget`, as a Kubernetes workload is
(:mod:`autoscaler.controller.kube_target`), so the reconciler (and the decision core behind it)
cannot tell a Deployment from a handful of batcher workers on a laptop. A worker process
has a name (``HOST:PORT``, which is also its Prometheus ``instance`` label), a start time and a
readiness read from an HTTP URL, so the HPA's readiness rules apply to it unchanged.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import requests

from autoglm.child_process import start_child
from autoglm.ports import free_port
from autoscaler.core.replica_calculator import PodSample
from autoscaler.scale_target import TargetScale
from autoscaler.spec import DEFAULT_RESOURCE

log = logging.getLogger(__name__)

# A worker plays a pod with one GPU: what a Utilization target's usage is a share of.
WORKER_REQUESTS = {"worker": {DEFAULT_RESOURCE: 1.0}}


@dataclass
class _Worker:
    port: int
    process: subprocess.Popen
    started_at: float
    ready: bool | None = None
    ready_changed_at: float | None = None


class LocalProcessGroup:
    """N copies of ``command``, each on its own port, started and stopped to follow the count.

    The port reaches a worker two ways: ``{port}`` in any argument of ``command`` is replaced,
    and the environment variable ``port_env`` is set. ``base_port`` 0 picks free ports. Workers
    run in their own session, so stopping one (SIGTERM to its process group, SIGKILL after
    ``stop_timeout``) also stops anything it spawned: no orphans are left behind. A worker is
    sent SIGTERM by the kernel when this process dies, even by SIGKILL
    (:func:`autoglm.child_process.start_child`; the scaling loop starts workers from its own
    thread). Scale-down
    stops the newest workers first, as a ReplicaSet prefers to delete the youngest pods.
    """

    def __init__(
        self,
        command: Sequence[str],
        *,
        base_port: int = 0,
        host: str = "127.0.0.1",
        port_env: str = "PORT",
        ready_url: str | None = "http://{host}:{port}/v2/health/ready",
        env: Mapping[str, str] | None = None,
        stop_timeout: float = 10.0,
        ready_timeout: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not command:
            raise ValueError("command must name the worker program, e.g. ['autoglm-batcher', ...]")
        self.command = list(command)
        self.base_port, self.host, self.port_env = base_port, host, port_env
        self.ready_url, self.env = ready_url, dict(env or {})
        self.stop_timeout, self.ready_timeout = stop_timeout, ready_timeout
        self.clock = clock
        self.description = f"local:{os.path.basename(self.command[0])}"
        self.restarts = 0
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._session = requests.Session()

    # --- ScaleTarget ---------------------------------------------------------------------------

    def get_scale(self) -> TargetScale:
        with self._lock:
            alive = sum(1 for w in self._workers if w.process.poll() is None)
            return TargetScale(len(self._workers), alive)

    def set_replicas(self, replicas: int) -> None:
        if replicas < 0:
            raise ValueError(f"replicas must be >= 0, got {replicas}")
        with self._lock:
            while len(self._workers) < replicas:
                self._workers.append(self._start(self._free_port()))
            doomed = self._workers[replicas:]
            del self._workers[replicas:]
        for worker in reversed(doomed):
            self._stop(worker)

    def pods(self) -> list[PodSample]:
        with self._lock:
            workers = list(self._workers)
        return [self._sample(w) for w in workers]

    # --- supervision ---------------------------------------------------------------------------

    def supervise(self) -> int:
        """Restart workers that exited on their own (as a ReplicaSet replaces failed pods)."""
        restarted = 0
        with self._lock:
            for i, worker in enumerate(self._workers):
                code = worker.process.poll()
                if code is not None:
                    log.warning(
                        "worker exited; restarting it",
                        extra={"port": worker.port, "exit_code": code},
                    )
                    self._workers[i] = self._start(worker.port)
                    restarted += 1
        self.restarts += restarted
        return restarted

    def exit_statuses(self) -> list[int]:
        """The exit status of each worker process that has exited (and not been restarted)."""
        with self._lock:
            return [code for w in self._workers if (code := w.process.poll()) is not None]

    def pids(self) -> list[int]:
        with self._lock:
            return [w.process.pid for w in self._workers]

    def ports(self) -> list[int]:
        with self._lock:
            return [w.port for w in self._workers]

    def close(self) -> None:
        """Stop every worker (newest first)."""
        self.set_replicas(0)
        self._session.close()

    # --- internals -----------------------------------------------------------------------------

    def _free_port(self) -> int:
        used = {w.port for w in self._workers}
        if self.base_port:
            port = self.base_port
            while port in used:
                port += 1
            return port
        while True:
            port = free_port(self.host)
            if port not in used:
                return port

    def _start(self, port: int) -> _Worker:
        argv = [
            arg.replace("{port}", str(port)).replace("{host}", self.host) for arg in self.command
        ]
        env = {**os.environ, **self.env, self.port_env: str(port)}
        process = start_child(argv, env=env, start_new_session=True, stdin=subprocess.DEVNULL)
        log.info("worker started", extra={"port": port, "pid": process.pid, "argv": argv})
        return _Worker(port, process, self.clock())

    def _stop(self, worker: _Worker) -> None:
        proc = worker.process
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                log.warning("worker ignored SIGTERM; killing it", extra={"port": worker.port})
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait()
        # The leader has exited; make sure nothing it spawned outlives it.
        _signal_group(proc.pid, signal.SIGKILL)
        log.info(
            "worker stopped",
            extra={"port": worker.port, "pid": proc.pid, "exit_code": proc.returncode},
        )

    def _sample(self, worker: _Worker) -> PodSample:
        name = f"{self.host}:{worker.port}"
        if worker.process.poll() is not None:
            return PodSample(
                name,
                None,
                ready=False,
                phase="Failed",
                started_at=worker.started_at,
                containers=WORKER_REQUESTS,
            )
        ready = self._probe(worker.port)
        if ready != worker.ready:
            worker.ready, worker.ready_changed_at = ready, self.clock()
        return PodSample(
            name,
            None,
            ready=ready,
            phase="Running",
            started_at=worker.started_at,
            ready_changed_at=worker.ready_changed_at,
            containers=WORKER_REQUESTS,
        )

    def _probe(self, port: int) -> bool:
        if self.ready_url is None:
            return True
        url = self.ready_url.format(host=self.host, port=port)
        try:
            return self._session.get(url, timeout=self.ready_timeout).status_code == 200
        except requests.RequestException:
            return False


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
