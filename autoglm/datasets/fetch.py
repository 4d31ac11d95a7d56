"""Downloading a whole trace into the traces folder, checked against its catalogued SHA-256.

This is the only place in the project that downloads anything. The file is written next to its
destination as ``.part`` and moved into place only once its checksum matches, so an interrupted
or altered download never leaves a file that later passes for the trace.
"""

from __future__ import annotations

import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from autoglm.datasets.catalog import Trace
from autoglm.datasets.store import DatasetError, sha256_of

BLOCK = 1 << 16

Progress = Callable[[int, int], None]  # bytes so far, bytes expected


def source_url(trace: Trace, mirror: str | None = None) -> str:
    """Upstream, or the same relative path under a mirror (``https://...`` or ``file:///...``)."""
    if mirror:
        return f"{mirror.rstrip('/')}/{trace.relative_path}"
    return trace.url


def fetch(
    trace: Trace,
    directory: Path,
    mirror: str | None = None,
    progress: Progress | None = None,
    timeout: float = 60.0,
) -> tuple[Path, bool]:
    """The trace's local path, and whether it was downloaded (False: a good copy was there)."""
    dest = directory / trace.relative_path
    if dest.is_file() and sha256_of(dest) == trace.sha256:
        return dest, False
    url = source_url(trace, mirror)
    part = dest.with_name(dest.name + ".part")
    digest = hashlib.sha256()
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with urllib.request.urlopen(url, timeout=timeout) as reply, part.open("wb") as out:
            expected = int(reply.headers.get("Content-Length") or trace.size)
            done = 0
            for block in iter(lambda: reply.read(BLOCK), b""):
                out.write(block)
                digest.update(block)
                done += len(block)
                if progress is not None:
                    progress(done, expected)
    except (OSError, urllib.error.URLError) as exc:
        part.unlink(missing_ok=True)
        raise DatasetError(
            f"trace {trace.name}: cannot download {url} into {dest.parent} ({exc}); "
            "check the network and the folder, or pass --mirror"
        ) from None
    got = digest.hexdigest()
    if got != trace.sha256:
        part.unlink(missing_ok=True)
        raise DatasetError(
            f"trace {trace.name}: {url} has SHA-256 {got}, not the catalogued {trace.sha256}; "
            "the download is corrupt or upstream changed the file, so nothing was kept"
        )
    os.replace(part, dest)
    return dest, True
