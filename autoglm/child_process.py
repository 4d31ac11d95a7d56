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
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
from collections.abc import Callable

PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def dies_with_this_process() -> Callable[[], None] | None:
    """A ``preexec_fn`` for :class:`subprocess.Popen` that has the child sent SIGTERM when this
    process dies; None (no ``preexec_fn``) where that cannot be asked for.

    The kernel sends the signal when the *thread* that forked the child ends, not the process,
    so this asks for it only on the main thread, which lives as long as the process: a child
    started from a worker thread would otherwise be stopped when that thread ends. Call it on
    the thread that then starts the child.
    """
    if not sys.platform.startswith("linux"):
        return None
    if threading.current_thread() is not threading.main_thread():
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
