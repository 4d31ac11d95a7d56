"""When to look at a web config file again, and whether it or the files it names changed.

cert-manager and friends rewrite a certificate every few weeks, and a Secret update replaces the
mounted files (a new inode or mtime). Looking costs a few ``stat`` calls, done at most once per
:data:`RELOAD_CHECK_SECONDS` by whichever request or handshake comes first after that.

A file written in place rather than renamed into place can be read half-written. The files are
looked at again once they are read (:meth:`FileWatch.still_as_seen`): when they moved meanwhile,
what was read is dropped and the next check reads them again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# How often, at most, the watched files are looked at.
RELOAD_CHECK_SECONDS = 1.0


class FileWatch:
    """The look of a config file and the files it names, as last seen."""

    def __init__(
        self, path: Path, files: Sequence[Path], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.path = path
        self._clock = clock
        self._stamp = _stamp((path, *files))
        self._next_check = clock() + RELOAD_CHECK_SECONDS
        self._lock = threading.Lock()

    def changed(self, files: Sequence[Path]) -> bool:
        """Whether the file or ``files`` (those the current settings name) look different now;
        the new look is remembered. Between checks this only reads the clock."""
        if self._clock() < self._next_check:
            return False
        if not self._lock.acquire(blocking=False):
            return False  # another thread is checking right now
        try:
            self._next_check = self._clock() + RELOAD_CHECK_SECONDS
            stamp = _stamp((self.path, *files))
            if stamp == self._stamp:
                return False
            self._stamp = stamp
            return True
        finally:
            self._lock.release()

    def still_as_seen(self, files: Sequence[Path]) -> bool:
        """Whether the file and ``files`` look as when :meth:`changed` last said they changed.

        Asked after reading them: False means they were being written while they were read,
        so what was read may be half of the new content; the look remembered is then older
        than the files', and the next check reports them changed again.
        """
        return _stamp((self.path, *files)) == self._stamp


def _stamp(files: Sequence[Path]) -> tuple[object, ...]:
    stamp: list[object] = []
    for f in files:
        try:
            st = f.stat()
            stamp.append((str(f), st.st_ino, st.st_mtime_ns, st.st_size))
        except OSError:
            stamp.append((str(f), None))
    return tuple(stamp)
