"""How each committed excerpt is derived from its whole trace.

The excerpts are regenerated with ``autoglm datasets derive`` (after ``fetch``) and a test
re-derives them whenever the whole traces are present, so what is committed stays provably a
function of the public data. Azure rows are copied verbatim (CC-BY 4.0 allows it, with the
attribution in ``data/SOURCES.txt``); from the Alibaba traces only aggregates leave the trace.
"""

from __future__ import annotations

import csv
import io
import tarfile
from collections import defaultdict
from collections.abc import Callable
from datetime import datetime, timedelta
from pathlib import Path

EXCERPT_MINUTES = 10


def azure_first_minutes(trace: Path, minutes: int = EXCERPT_MINUTES) -> str:
    """The header and the rows of the first ``minutes`` of an Azure LLM trace, byte for byte."""
    lines = trace.read_text(encoding="utf-8").splitlines(keepends=True)
    header, rows = lines[0], lines[1:]
    start = _azure_time(rows[0])
    end = start + timedelta(minutes=minutes)
    return header + "".join(row for row in rows if _azure_time(row) < end)


def _azure_time(row: str) -> datetime:
    # TIMESTAMP carries 7 fractional digits; whole seconds are enough to cut a window.
    return datetime.strptime(row[:19], "%Y-%m-%d %H:%M:%S")


def genai_requests_hourly(trace: Path) -> str:
    """Requests per hour and their mean execution time, every hour of the trace (empty ones too)."""
    counts: dict[datetime, int] = defaultdict(int)
    exec_sums: dict[datetime, float] = defaultdict(float)
    exec_counts: dict[datetime, int] = defaultdict(int)
    with trace.open(encoding="utf-8", newline="") as handle:
        for row in csv.DictReader(handle):
            hour = datetime.strptime(row["gmt_create"][:13], "%Y-%m-%d %H")
            counts[hour] += 1
            if row["exec_time_seconds"]:
                exec_sums[hour] += float(row["exec_time_seconds"])
                exec_counts[hour] += 1
    out = ["hour,requests,mean_exec_seconds"]
    hour, last = min(counts), max(counts)
    while hour <= last:
        mean = f"{exec_sums[hour] / exec_counts[hour]:.2f}" if exec_counts[hour] else ""
        out.append(f"{hour:%Y-%m-%d %H:%M:%S},{counts[hour]},{mean}")
        hour += timedelta(hours=1)
    return "\n".join(out) + "\n"


def genai_duty_cycle_mean(trace: Path) -> str:
    """Mean GPU duty cycle over the pods reporting at each sample time, and how many reported.

    The file reads as an exporter trace profile as it is (a ``timestamp_anon`` and a ``value``
    column), so the local demo replays the service's fleet-wide load without the whole trace.
    """
    sums: dict[str, float] = defaultdict(float)
    pods: dict[str, int] = defaultdict(int)
    with tarfile.open(trace, "r:gz") as archive:
        (member,) = [m for m in archive.getmembers() if m.isfile()]
        handle = archive.extractfile(member)
        assert handle is not None  # a regular file member always has content
        for row in csv.DictReader(io.TextIOWrapper(handle, encoding="utf-8")):
            if row["value"]:
                sums[row["timestamp_anon"]] += float(row["value"])
                pods[row["timestamp_anon"]] += 1
    out = ["timestamp_anon,value,pods"]
    for stamp in sorted(sums, key=float):
        out.append(f"{stamp},{sums[stamp] / pods[stamp]:.3f},{pods[stamp]}")
    return "\n".join(out) + "\n"


DERIVATIONS: dict[str, Callable[[Path], str]] = {
    "azure-llm-code-10min": azure_first_minutes,
    "azure-llm-conv-10min": azure_first_minutes,
    "genai-requests-hourly": genai_requests_hourly,
    "genai-gpu-duty-cycle-mean": genai_duty_cycle_mean,
}
