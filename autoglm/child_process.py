"""Child processes that die with the process that started them, however it dies.

A supervisor (``autoglm up``, a batcher engine with front workers) stops its children when it is
stopped, but a SIGKILL (or a crash of the interpreter) runs no cleanup, and a child left running
is orphaned: Prometheus in a session of its own kept a core busy long after a killed
``autoglm up``. On Linux the kernel can signal a child when its parent dies
(``PR_SET_PDEATHSIG``); :func:`dies_with_this_process` asks for it between fork and exec. Python's
``subprocess`` has no option for it, hence a ``preexec_fn``, kept to a libc call, ``os.getppid``
and ``os._exit``: it runs in the forked child of a process with threads, where taking a lock
(logging, imports) could deadlock. Elsewhere there is no such signal, and a child outlives a
killed parent unless it watches for that itself (the batcher's ``--exit-with-parent``).

The kernel sends the signal when the *thread* that forked the child ends, not the process. A
child started on a thread that may end first (an autoscaler's loop scaling its workers) goes
through :func:`start_child`, which forks it on a launcher thread that lives as long as the
process.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that has the child sent SIGTERM when this
    process dies; None (no ``preexec_fn``) where that cannot be asked for.

    Only the main thread lives as long as the process, so this asks for the signal there alone:
    a child started from a worker thread would otherwise be stopped when that thread ends (use
    :func:`start_child` from such a thread). Call it on the thread that then starts the child.
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    return _death_signal_hook()


def start_child(argv: Sequence[str], **popen_kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **popen_kwargs)`` for a child that dies with this process, from
    any thread: the main thread forks it itself, any other thread hands the fork to the launcher
    thread and waits for it (an error of Popen's is raised here, on the caller's thread)."""
    if threading.current_thread() is threading.main_thread():
        return subprocess.Popen(argv, preexec_fn=dies_with_this_process(), **popen_kwargs)
    return _launcher().start(list(argv), popen_kwargs)


def _death_signal_hook() -> Callable[[], None] | None:
    if not sys.platform.startswith("linux"):
        return None
    prctl = ctypes.CDLL(None).prctl  # libc's, looked up here rather than in the child
    death_signal = int(signal.SIGTERM)
    parent = os.getpid()

    def in_child() -> None:
        prctl(PR_SET_PDEATHSIG, death_signal)
        # The parent may have died between fork and prctl: the child was re-parented then, and
        # no signal will come. Stop here instead of running orphaned.
        if os.getppid() != parent:
            os._exit(1)

    return in_child


class _Launcher:
    """A daemon thread that forks children on request and never ends before the process does,
    so the parent-death signal it asks for comes only with the process's death."""

    def __init__(self) -> None:
        self._requests: queue.SimpleQueue[tuple[list[str], dict[str, Any], Future]] = (
            queue.SimpleQueue()
        )
        self.thread = threading.Thread(target=self._serve, name="child-launcher", daemon=True)
        self.thread.start()

    def start(self, argv: list[str], popen_kwargs: dict[str, Any]) -> subprocess.Popen:
        started: Future[subprocess.Popen] = Future()
        self._requests.put((argv, popen_kwargs, started))
        return started.result()

    def _serve(self) -> None:
        while True:
            argv, popen_kwargs, started = self._requests.get()
            try:
                process = subprocess.Popen(argv, preexec_fn=_death_signal_hook(), **popen_kwargs)
            except BaseException as exc:  # handed to the caller, who raises it
                started.set_exception(exc)
            else:
                started.set_result(process)


_the_launcher: _Launcher | None = None
_launcher_lock = threading.Lock()


def _launcher() -> _Launcher:
    global _the_launcher
    with _launcher_lock:
        if _the_launcher is None:
            _the_launcher = _Launcher()
        return _the_launcher
