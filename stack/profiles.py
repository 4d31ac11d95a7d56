"""Request-rate profiles the load generator replays: a trace excerpt or a synthetic day.

A profile answers one question: how many requests per (wall-clock) second at ``elapsed`` seconds
after the start? Every profile plays on a compressed clock (one day lasts ``day_seconds`` of wall
time) and repeats each day, so a run of any length has load to replay. Pure functions of time:
the load generator and the tests ask the same profile and get the same answer.
"""

from __future__ import annotations

import bisect
import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from autoglm.config import ConfigError
from stack.config import DAY_SECONDS, UpConfig
from stack.request_traces import FORMS, OWN_HEADER, counts_from_trace, trace_file

EXCERPT = "genai_requests_15min.csv"
# The trace replay starts at 15:00 of its first day, just before the service's busy evening
# (its quiet hours are 05:00-15:00), so a newcomer sees the load rise within a minute.
TRACE_START_SECONDS = 15 * 3600.0
DIURNAL_PEAK_SECONDS = 14 * 3600.0
STEP_WINDOW = (0.2, 0.5)  # share of the day the step profile holds its peak
SPIKE_WINDOW = (0.45, 0.5)
# The ramp profile's day, as shares of it: quiet until the ramp starts (long enough for the
# predictor to gather the history it needs), a linear rise to the peak, a plateau, a linear fall,
# quiet again. At the default compression the whole shape passes within the first two minutes.
RAMP_SHAPE = (0.24, 0.4, 0.46, 0.52)


class RateProfile(Protocol):
    """Requests per second ``elapsed`` wall-clock seconds after the start."""

    @property
    def name(self) -> str: ...

    @property
    def peak_rps(self) -> float: ...

    def rate(self, elapsed: float) -> float: ...


@dataclass(frozen=True)
class TraceProfile:
    """Binned request counts scaled so the busiest bin is ``peak_rps``, linearly interpolated."""

    times: tuple[float, ...]  # bin offsets in profile seconds, increasing
    counts: tuple[float, ...]
    peak_rps: float
    day_seconds: float
    start_seconds: float = TRACE_START_SECONDS
    name: str = "trace"

    def rate(self, elapsed: float) -> float:
        span = self.times[-1] - self.times[0] + self._bin
        played = self.start_seconds + elapsed * DAY_SECONDS / self.day_seconds
        t = self.times[0] + (played - self.times[0]) % span
        i = bisect.bisect_right(self.times, t) - 1
        j = (i + 1) % len(self.times)
        frac = (t - self.times[i]) / self._bin
        level = self.counts[i] + (self.counts[j] - self.counts[i]) * frac
        return self.peak_rps * level / max(self.counts)

    @property
    def _bin(self) -> float:
        return self.times[1] - self.times[0] if len(self.times) > 1 else DAY_SECONDS


@dataclass(frozen=True)
class ShapeProfile:
    """A synthetic day between ``base_rps`` and ``peak_rps``: ramp, diurnal, step or spike."""

    name: str
    base_rps: float
    peak_rps: float
    day_seconds: float

    def rate(self, elapsed: float) -> float:
        day = (elapsed % self.day_seconds) / self.day_seconds
        if self.name == "ramp":
            return self.base_rps + (self.peak_rps - self.base_rps) * ramp_level(day)
        if self.name == "diurnal":
            phase = 2.0 * math.pi * (day - DIURNAL_PEAK_SECONDS / DAY_SECONDS)
            return self.base_rps + (self.peak_rps - self.base_rps) * (1.0 + math.cos(phase)) / 2
        low, high = STEP_WINDOW if self.name == "step" else SPIKE_WINDOW
        return self.peak_rps if low <= day < high else self.base_rps


def ramp_level(day: float) -> float:
    """The ramp profile's level (0: base, 1: peak) at ``day``, a share of the day in [0, 1)."""
    rise, top, fall, bottom = RAMP_SHAPE
    if day < rise or day >= bottom:
        return 0.0
    if day < top:
        return (day - rise) / (top - rise)
    if day < fall:
        return 1.0
    return (bottom - day) / (bottom - fall)


def read_trace(path: str | Path | None) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """``(offsets, counts)`` to replay: the shipped excerpt without ``path``, else what
    ``--trace-file`` names, a dataset or a file (:mod:`stack.request_traces`)."""
    file = trace_file(str(path)) if path else Path(__file__).with_name("data") / EXCERPT
    where = str(file) if path else f"stack/data/{EXCERPT}"
    try:
        text = file.read_text()
    except OSError as exc:
        raise ConfigError(f"--trace-file: cannot read {where!r}: {exc.strerror}") from exc
    except UnicodeDecodeError:
        raise ConfigError(f"--trace-file {where!r} is not a CSV file; give {FORMS}") from None
    rows = list(csv.reader(text.splitlines()))
    header = [c.strip() for c in rows[0]] if rows else []
    if header == OWN_HEADER:
        times, counts = _own_rows(rows[1:], where)
    else:
        times, counts = counts_from_trace(file, header)
    if len(times) < 2 or max(counts) <= 0:
        raise ConfigError(f"--trace-file {where!r}: needs at least two rows and some requests")
    return tuple(times), tuple(counts)


def _own_rows(rows: list[list[str]], where: str) -> tuple[list[float], list[float]]:
    times: list[float] = []
    counts: list[float] = []
    for line, row in enumerate(rows, start=2):
        try:
            t, n = float(row[0]), float(row[1])
        except (IndexError, ValueError):
            raise ConfigError(f"--trace-file {where!r} line {line}: expected two numbers") from None
        if times and t <= times[-1]:
            raise ConfigError(f"--trace-file {where!r} line {line}: offsets must increase")
        if n < 0 or not math.isfinite(n):
            raise ConfigError(f"--trace-file {where!r} line {line}: requests must be >= 0")
        times.append(t)
        counts.append(n)
    return times, counts


def profile_from_config(cfg: UpConfig) -> RateProfile:
    """The profile ``cfg`` asks for; ConfigError for an unreadable trace file."""
    if cfg.profile == "trace":
        times, counts = read_trace(cfg.trace_file or None)
        return TraceProfile(times, counts, cfg.peak_rps, cfg.day_seconds)
    return ShapeProfile(cfg.profile, cfg.base_rps, cfg.peak_rps, cfg.day_seconds)
