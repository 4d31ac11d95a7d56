"""Where traces live on this machine, and turning a trace name or a path into a file.

The traces folder is, first found: the ``--cache-dir`` a command was given, the
``AUTOGLM_TRACES_DIR`` environment variable (CI points it at ``shared/autoscaling-traces``), then
``$XDG_CACHE_HOME/autoglm/traces`` (``~/.cache/autoglm/traces`` without XDG). Inside it each
trace keeps its upstream folder layout, so a copy of the data sets' own folders works as is.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

from autoglm.datasets.catalog import EXCERPTS, TRACES, Trace

ENV_TRACES_DIR = "AUTOGLM_TRACES_DIR"


class DatasetError(ValueError):
    """A trace cannot be found or trusted; the message says which and the command that fixes it."""


class DatasetUsageError(DatasetError):
    """The request itself is wrong (an unknown trace name, a bad --mirror or --cache-dir): the
    CLI's usage error, exit 2, found before anything is downloaded."""


def traces_dir(override: str | Path | None = None, environ: Mapping[str, str] = os.environ) -> Path:
    """The folder that holds (or will hold) the whole traces."""
    if override:
        return Path(override).expanduser()
    if environ.get(ENV_TRACES_DIR):
        return Path(environ[ENV_TRACES_DIR]).expanduser()
    cache = environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache).expanduser() / "autoglm" / "traces"


def trace_named(name: str) -> Trace:
    """The catalog entry, or an error listing the names there are."""
    if name not in TRACES:
        raise DatasetUsageError(f"no trace named {name!r}; choose one of: {', '.join(TRACES)}")
    return TRACES[name]


def expected_path(name: str, directory: str | Path | None = None) -> Path:
    """Where a whole trace is (or will be once fetched) in the traces folder."""
    return traces_dir(directory) / trace_named(name).relative_path


def fetch_hint(name: str) -> str:
    """The one command that makes a missing trace present."""
    return f"fetch it with `autoglm datasets fetch {name}` (or set {ENV_TRACES_DIR})"


def resolve(name_or_path: str | Path, directory: str | Path | None = None) -> Path:
    """The file behind what a user typed where a trace is expected: a path, or a catalog name.

    An existing path wins, so a file that happens to share a trace's name is still read. A
    whole trace that is not fetched yet is an error naming the fetch command; nothing is
    downloaded here (only ``autoglm datasets fetch`` downloads).
    """
    path = Path(name_or_path).expanduser()
    if path.exists():
        return path
    name = str(name_or_path)
    if name in EXCERPTS:
        return EXCERPTS[name].path
    if name in TRACES:
        local = expected_path(name, directory)
        if local.is_file():
            return local
        raise DatasetError(f"trace {name} is not in {local.parent}: {fetch_hint(name)}")
    raise DatasetError(
        f"{name} does not exist, and no trace or excerpt has that name "
        "(`autoglm datasets list` names them)"
    )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
