"""Requests per bin from what ``autoglm up --trace-file`` names: a dataset or a file.

``--trace-file`` takes what every trace option takes (:func:`autoglm.datasets.resolve`): a
path, a shipped excerpt's name or a fetched trace's name; a trace that is not fetched yet is an
error naming the fetch command. The load generator replays evenly spaced request counts, so a
file is read by its header:

* ``offset_seconds,requests``: the stack's own format, read by :mod:`stack.profiles`;
* a ``requests`` column beside a time column (``genai-requests-hourly``): counts per bin already;
* one request per row with its time (``TIMESTAMP``: ``azure-llm-*``; ``gmt_create``:
  ``genai-requests``): counted per minute of the trace, times read as the simulator reads them
  (:func:`autoscaler.simulator.trace.load_trace`).

Traces of something other than requests (GPU duty cycle, latency) are refused with the forms
that are accepted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from autoglm.config import ConfigError
from autoglm.datasets import DatasetError, resolve
from autoscaler.simulator.trace import TraceError, load_trace

OWN_HEADER = ["offset_seconds", "requests"]
# Columns that hold one request's arrival time in the catalogued request traces.
ARRIVAL_COLUMNS = ("TIMESTAMP", "gmt_create")
# Requests per row are counted in bins this long (trace seconds): fine enough for the Azure
# hour's bursts, and many bins even for its ten-minute excerpts.
BIN_SECONDS = 60.0
FORMS = (
    "offset_seconds,requests rows, a requests column beside a time column "
    "(genai-requests-hourly), or one request per row with a "
    + " or ".join(ARRIVAL_COLUMNS)
    + " column (azure-llm-*, genai-requests)"
)


def trace_file(name_or_path: str) -> Path:
    """The file ``--trace-file`` names; ConfigError naming the fetch command when a catalogued
    trace is not here yet."""
    try:
        return resolve(name_or_path)
    except DatasetError as exc:
        raise ConfigError(f"--trace-file: {exc}") from None


def counts_from_trace(path: Path, header: list[str]) -> tuple[list[float], list[float]]:
    """``(offsets, counts)`` from a trace in its own format (not ``offset_seconds,requests``)."""
    where = str(path)
    if "requests" in header and len(header) > 1:
        return _aggregate(path, header, where)
    column = next((c for c in ARRIVAL_COLUMNS if c in header), None)
    if column is None:
        raise ConfigError(
            f"--trace-file {where!r}: not a request trace (columns: {', '.join(header)}); "
            f"the header must be that of {FORMS}"
        )
    try:
        arrivals = load_trace(path, time_column=column).arrivals
    except TraceError as exc:
        raise ConfigError(f"--trace-file: {exc}") from None
    counts = np.bincount((arrivals // BIN_SECONDS).astype(int))
    return [BIN_SECONDS * i for i in range(len(counts))], [float(n) for n in counts]


def _aggregate(path: Path, header: list[str], where: str) -> tuple[list[float], list[float]]:
    time_column = next(c for c in header if c != "requests")
    frame = pd.read_csv(path, usecols=[time_column, "requests"])
    stamps = pd.to_datetime(frame[time_column], errors="coerce", format="mixed")
    counts = pd.to_numeric(frame["requests"], errors="coerce")
    if stamps.isna().any() or counts.isna().any():
        raise ConfigError(
            f"--trace-file {where!r}: every row needs a time in {time_column!r} and a number "
            "in 'requests'"
        )
    seconds = (stamps - stamps.iloc[0]).dt.total_seconds()
    return [float(s) for s in seconds], [float(n) for n in counts]
