"""Request traces: arrival times (and optionally per-request work) read from a CSV file.

A trace is reduced to what the fleet model needs: arrival offsets in seconds from the first
request, sorted, and an optional work weight per request (1.0 = an average request), taken from
a column such as the Alibaba trace's ``exec_time_seconds``. Time compression (``speed``) divides
the offsets, so a day replayed at speed 24 lasts an hour; the load per second rises by the same
factor, which is the honest price of compressing a trace (say so when reporting results).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd


class TraceError(ValueError):
    """The trace cannot be used; the message names the file or column and the fix."""


@dataclass(frozen=True)
class Trace:
    arrivals: np.ndarray  # seconds since the first request, sorted, float64
    work: np.ndarray  # per-request work weight, mean 1.0 (all ones without a work column)
    source: str
    speed: float = 1.0
    mean_work_raw: float = 1.0  # the work column's mean before normalising (e.g. seconds)

    @property
    def duration(self) -> float:
        return float(self.arrivals[-1]) if len(self.arrivals) else 0.0

    def __len__(self) -> int:
        return len(self.arrivals)


def from_arrivals(
    arrivals: np.ndarray, work: np.ndarray | None = None, source: str = "synthetic"
) -> Trace:
    """A trace from arrival times in seconds (any origin, any order) and optional raw work."""
    t = np.asarray(arrivals, dtype=float)
    if t.size == 0:
        raise TraceError(f"{source}: the trace holds no requests")
    if not np.all(np.isfinite(t)):
        raise TraceError(f"{source}: arrival times must be finite numbers")
    order = np.argsort(t, kind="stable")
    t = t[order] - t[order[0]]
    raw = None if work is None else np.asarray(work, float)[order]
    w, mean_raw = _normalised_work(raw, len(t), source)
    return Trace(t, w, source, 1.0, mean_raw)


def superpose(trace: Trace, copies: int, jitter_seconds: float, seed: int = 0) -> Trace:
    """``copies`` tenants of the trace's shape sharing one fleet: the load times ``copies``.

    Copy 0 is the trace itself; every other copy shifts each request by its own uniform offset
    in ``[-jitter_seconds, +jitter_seconds]`` (seeded, so runs repeat). Unlike time compression,
    this keeps the time axis: a day stays a day, a cold start keeps its length relative to the
    load's changes, and one user's burst keeps its size (there are just more users). Shapes
    finer than the jitter (minute-level bursts) are spread across copies; the daily and weekly
    profile is kept.
    """
    if copies < 1:
        raise TraceError(f"copies must be >= 1, got {copies}")
    if jitter_seconds < 0:
        raise TraceError(f"jitter must be >= 0 seconds, got {jitter_seconds}")
    if copies == 1:
        return trace
    rng = np.random.default_rng(seed)
    n = len(trace)
    shifted = [trace.arrivals] + [
        trace.arrivals + rng.uniform(-jitter_seconds, jitter_seconds, n) for _ in range(copies - 1)
    ]
    arrivals = np.concatenate(shifted)
    order = np.argsort(arrivals, kind="stable")
    arrivals = arrivals[order]
    work = np.tile(trace.work, copies)[order]
    return Trace(
        arrivals - arrivals[0],
        work,
        f"{trace.source} x{copies}",
        trace.speed,
        trace.mean_work_raw,
    )


def load_trace(
    path: str | Path,
    time_column: str = "TIMESTAMP",
    time_format: str = "auto",
    work_column: str | None = None,
    speed: float = 1.0,
    start: float | None = None,
    duration: float | None = None,
) -> Trace:
    """Read a CSV trace.

    ``time_format`` is ``auto`` (datetime strings or numbers), ``epoch_s``, ``epoch_ms``, or a
    strftime pattern. ``start``/``duration`` (seconds, before compression) cut a window.
    """
    if speed <= 0:
        raise TraceError(
            f"speed must be > 0 (e.g. --speed 24 to replay a day in an hour), got {speed}"
        )
    p = Path(path)
    try:
        header = pd.read_csv(p, nrows=0).columns
    except (OSError, pd.errors.ParserError, pd.errors.EmptyDataError) as exc:
        raise TraceError(f"cannot read trace {str(p)!r}: {exc}") from exc
    for col in (time_column, work_column):
        if col is not None and col not in header:
            raise TraceError(
                f"{p}: no column {col!r}; columns are: {', '.join(map(str, header))} "
                "(choose with --time-column / --work-column)"
            )
    cols = [time_column] + ([work_column] if work_column else [])
    frame = pd.read_csv(p, usecols=cols)
    seconds = _to_seconds(frame[time_column], time_format, p, time_column)
    keep = np.isfinite(seconds)
    if not keep.any():
        raise TraceError(f"{p}: no parsable times in column {time_column!r}")
    seconds = seconds[keep]
    work = None
    if work_column:
        work = pd.to_numeric(frame[work_column], errors="coerce").to_numpy(float)[keep]
        work = np.where(np.isfinite(work) & (work >= 0), work, np.nan)
        fill = np.nanmean(work) if np.isfinite(work).any() else 1.0
        work = np.where(np.isnan(work), fill, work)
    order = np.argsort(seconds, kind="stable")
    seconds = seconds[order] - seconds[order[0]]
    work = None if work is None else work[order]
    if start is not None or duration is not None:
        lo = start or 0.0
        hi = lo + duration if duration is not None else np.inf
        window = (seconds >= lo) & (seconds < hi)
        if not window.any():
            raise TraceError(f"{p}: no requests between {lo:g} s and {hi:g} s of the trace")
        seconds = seconds[window] - lo
        work = None if work is None else work[window]
    w, mean_raw = _normalised_work(work, len(seconds), str(p))
    return Trace(seconds / speed, w, str(p), speed, mean_raw)


def _to_seconds(column: pd.Series, time_format: str, path: Path, name: str) -> np.ndarray:
    if time_format in ("epoch_s", "epoch_ms"):
        values = pd.to_numeric(column, errors="coerce").to_numpy(float)
        return values / 1000.0 if time_format == "epoch_ms" else values
    if time_format == "auto":
        numeric = pd.to_numeric(column, errors="coerce")
        if numeric.notna().mean() > 0.99:
            return numeric.to_numpy(float)
        parsed = pd.to_datetime(column, errors="coerce", format="mixed")
    else:
        parsed = pd.to_datetime(column.astype(str), errors="coerce", format=time_format)
    if parsed.isna().mean() > 0.5:
        raise TraceError(
            f"{path}: column {name!r} does not parse as times with format {time_format!r}; "
            "pass --time-format (epoch_s, epoch_ms or a strftime pattern)"
        )
    ns = parsed.to_numpy(dtype="datetime64[ns]").astype("int64").astype(float)
    ns[parsed.isna().to_numpy()] = np.nan
    return ns / 1e9


def _normalised_work(work: np.ndarray | None, n: int, source: str) -> tuple[np.ndarray, float]:
    if work is None:
        return np.ones(n), 1.0
    if work.shape != (n,):
        raise TraceError(f"{source}: {work.shape} work values for {n} requests")
    mean = float(np.mean(work)) if work.size else 0.0
    if not mean > 0:
        raise TraceError(f"{source}: the work column averages {mean:g}; it must be positive")
    return work / mean, mean
