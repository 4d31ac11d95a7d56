"""The batcher's private folder (its front workers' sockets and shared metrics), and clearing the
folders of batchers killed before they could remove their own.

A batcher stopped by a signal it can handle removes its folder; one killed outright (SIGKILL,
the OOM killer) leaves it in the temporary directory. In the chart that directory is an
``emptyDir``, which outlives the container, so a crash loop would fill it one folder a restart.
So each folder holds a lock file that its batcher keeps locked (``flock``) while it runs. The
kernel drops the lock when the process dies, however it dies, so a batcher that starts and can
take a folder's lock knows its owner is gone and removes it. A process id would not tell:
a restarted container hands out the same ones again.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import IO

log = logging.getLogger(__name__)

PREFIX = "autoglm-batcher-"
LOCK_FILE = "owner.lock"


class PrivateFolder:
    """A new private folder (mode 0700) under ``root`` (the temporary directory by default),
    locked as its owner's until :meth:`remove`; the stale folders of dead batchers are cleared
    first."""

    def __init__(self, root: Path | None = None) -> None:
        root = Path(tempfile.gettempdir()) if root is None else root
        clear_stale(root)
        self.path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=root))
        # Locked under another name, then renamed: a batcher clearing stale folders meanwhile
        # never finds this one's lock file unlocked.
        unnamed = self.path / (LOCK_FILE + ".new")
        self._lock: IO[str] = open(unnamed, "w")  # noqa: SIM115 -- held for the folder's life
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(unnamed, self.path / LOCK_FILE)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()


def clear_stale(root: Path) -> list[Path]:
    """Remove the private folders under ``root`` whose owner is gone (their lock can be taken);
    the folders removed. A folder without a lock file (one being made, or one from a version
    before the lock) is left alone."""
    removed = []
    for folder in sorted(root.glob(PREFIX + "*")):
        try:
            with open(folder / LOCK_FILE) as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(folder, ignore_errors=True)
        except OSError:  # no lock file, or locked: its batcher runs
            continue
        removed.append(folder)
    if removed:
        log.info(
            "removed the private folders of batchers that were killed",
            extra={"folders": [str(f) for f in removed]},
        )
    return removed
