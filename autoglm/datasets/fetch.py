"""Downloading a whole trace into the traces folder, checked against its catalogued SHA-256.

This is the only place in the project that downloads anything. The file is written next to its
destination as ``.part`` and moved into place only once its checksum matches, so an interrupted
or altered download never leaves a file that later passes for the trace.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from autoglm.datasets.catalog import Trace
from autoglm.datasets.store import DatasetError, DatasetUsageError, sha256_of

BLOCK = 1 << 16

Progress = Callable[[int, int], None]  # bytes so far, bytes expected


def source_url(trace: Trace, mirror: str | None = None) -> str:
    """Upstream, or the same relative path under a mirror (``https://...`` or ``file:///...``)."""
    if mirror:
        return f"{mirror.rstrip('/')}/{trace.relative_path}"
    return trace.url


def check_mirror(mirror: str | None) -> None:
    """DatasetUsageError unless ``mirror`` (when given) is an http(s):// URL with a host or a
    file:// URL."""
    if not mirror:
        return
    hint = "e.g. --mirror https://mirror.example/traces or --mirror file:///srv/traces"
    try:
        parts = urlsplit(mirror)
        parts.port  # noqa: B018 -- raises on a port out of range
    except ValueError:
        raise DatasetUsageError(f"--mirror {mirror!r} is not a valid URL; {hint}") from None
    if parts.scheme in ("http", "https") and parts.hostname:
        return
    if parts.scheme == "file" and parts.path:
        return
    raise DatasetUsageError(
        f"--mirror {mirror!r} must be an http://, https:// URL with a host or a file:// URL; {hint}"
    )


def check_cache_dir(directory: Path) -> None:
    """DatasetUsageError unless ``directory`` is a folder, or one that can be created."""
    if directory.exists() and not directory.is_dir():
        raise DatasetUsageError(
            f"traces folder {str(directory)!r} is not a directory; give --cache-dir (or "
            "$AUTOGLM_TRACES_DIR) a folder"
        )
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DatasetUsageError(
            f"traces folder {str(directory)!r} cannot be created ({exc.strerror}); give "
            "--cache-dir (or $AUTOGLM_TRACES_DIR) a folder you can write"
        ) from None


def fetch(
    trace: Trace,
    directory: Path,
    mirror: str | None = None,
    progress: Progress | None = None,
    timeout: float = 60.0,
) -> tuple[Path, bool]:
    """The trace's local path, and whether it was downloaded (False: a good copy was there)."""
    check_mirror(mirror)
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
    except (OSError, ValueError, urllib.error.URLError) as exc:  # ValueError: a bad URL
        with contextlib.suppress(OSError):  # the folder may be what failed
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
