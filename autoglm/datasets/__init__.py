"""The public traces the project replays: named, checksummed, fetched on demand, excerpted.

Commands that take a trace pass what the user typed through :func:`resolve`, so a catalog name
(``genai-requests``), an excerpt name (``genai-requests-hourly``) or a path all work.
"""

from autoglm.datasets.catalog import EXCERPTS, TRACES, Excerpt, Trace
from autoglm.datasets.store import (
    ENV_TRACES_DIR,
    DatasetError,
    expected_path,
    fetch_hint,
    resolve,
    traces_dir,
)

__all__ = [
    "ENV_TRACES_DIR",
    "EXCERPTS",
    "TRACES",
    "DatasetError",
    "Excerpt",
    "Trace",
    "expected_path",
    "fetch_hint",
    "resolve",
    "traces_dir",
]
