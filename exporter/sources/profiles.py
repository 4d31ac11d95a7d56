"""Load profiles: how busy each simulated GPU is at a given time.

A profile is a pure function of time and GPU index, so the simulated source stays deterministic for
a given clock. Specs (CLI ``--profile``):

* ``constant:0.6`` -- every GPU at 60 %;
* ``diurnal:period=86400:low=0.2:high=0.9[:peak=50400]`` -- a cosine day, highest at ``peak``
  seconds into each period of the (unix) clock, so a simulated fleet is busy when real ones are;
* ``trace:PATH[:speed=N][:container=mean|each|ID][:unit=percent|ratio]`` -- replay of a CSV of
  ``timestamp,value`` rows (optionally a ``container_ip`` column, as in the Alibaba
  ``pod_gpu_duty_cycle``), plain or inside a ``.tar.gz``; ``speed`` compresses time, the trace
  loops; ``container=mean`` replays the mean over containers, ``each`` gives GPU *i* the *i*-th
  busiest container, an ID picks one; values above 1 are read as percent unless ``unit`` says.
"""

from __future__ import annotations

import bisect
import csv
import io
import math
import tarfile
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from autoglm.datasets import resolve as resolve_trace

PROFILE_FORMS = (
    "constant:RATIO, diurnal:period=SECONDS:low=RATIO:high=RATIO[:peak=SECONDS], "
    "trace:PATH[:speed=N][:container=mean|each|ID][:unit=percent|ratio]"
)


class LoadProfile(Protocol):
    """Utilization (0..1) of GPU ``gpu`` at unix time ``now``, ``elapsed`` seconds after start."""

    @property
    def spec(self) -> str:
        """The spec the profile was parsed from."""

    def utilization(self, now: float, elapsed: float, gpu: int) -> float: ...


@dataclass(frozen=True)
class ConstantProfile:
    level: float
    spec: str = ""

    def utilization(self, now: float, elapsed: float, gpu: int) -> float:
        return self.level


@dataclass(frozen=True)
class DiurnalProfile:
    period_s: float
    low: float
    high: float
    peak_s: float  # offset within the period where load is highest
    spec: str = ""

    def utilization(self, now: float, elapsed: float, gpu: int) -> float:
        phase = 2.0 * math.pi * ((now - self.peak_s) % self.period_s) / self.period_s
        return self.low + (self.high - self.low) * (1.0 + math.cos(phase)) / 2.0


@dataclass(frozen=True)
class Series:
    """A time series with strictly increasing timestamps, values as ratios 0..1."""

    times: tuple[float, ...]
    values: tuple[float, ...]

    def at(self, offset: float) -> float:
        """Linearly interpolated value ``offset`` seconds after the first sample, looping."""
        if len(self.times) == 1:
            return self.values[0]
        start, span = self.times[0], self.times[-1] - self.times[0]
        t = start + offset % span
        i = bisect.bisect_right(self.times, t)
        if i >= len(self.times):
            return self.values[-1]
        t0, t1 = self.times[i - 1], self.times[i]
        v0, v1 = self.values[i - 1], self.values[i]
        return v0 + (v1 - v0) * (t - t0) / (t1 - t0)


@dataclass(frozen=True)
class TraceProfile:
    """Replays recorded utilization; GPU ``i`` uses ``series[i % len(series)]``."""

    series: tuple[Series, ...]
    speed: float
    spec: str = ""

    def utilization(self, now: float, elapsed: float, gpu: int) -> float:
        return self.series[gpu % len(self.series)].at(elapsed * self.speed)


def load_profile(spec: str) -> LoadProfile:
    """Parse a profile spec (see the module docstring); ``ValueError`` names the problem."""
    kind, _, rest = spec.strip().partition(":")
    if kind == "constant":
        level = _ratio(rest, "constant level", spec)
        return ConstantProfile(level, spec)
    if kind == "diurnal":
        opts = _options(rest.split(":") if rest else [], {"period", "low", "high", "peak"}, spec)
        period = _positive(opts.get("period", "86400"), "period", spec)
        low = _ratio(opts.get("low", "0.2"), "low", spec)
        high = _ratio(opts.get("high", "0.9"), "high", spec)
        if low > high:
            raise ValueError(f"profile {spec!r}: low ({low}) is above high ({high})")
        peak = _number(opts.get("peak", str(period * 14 / 24)), "peak", spec)
        return DiurnalProfile(period, low, high, peak, spec)
    if kind == "trace":
        path, *parts = rest.split(":")
        if not path:
            raise ValueError(f"profile {spec!r}: trace needs a file path; forms: {PROFILE_FORMS}")
        opts = _options(parts, {"speed", "container", "unit"}, spec)
        speed = _positive(opts.get("speed", "1"), "speed", spec)
        unit = opts.get("unit", "auto")
        if unit not in ("auto", "percent", "ratio"):
            raise ValueError(f"profile {spec!r}: unit must be percent or ratio, not {unit!r}")
        series = read_trace(resolve_trace(path), opts.get("container", "mean"), unit)
        return TraceProfile(series, speed, spec)
    raise ValueError(f"unknown load profile {spec!r}; use one of: {PROFILE_FORMS}")


def read_trace(path: Path, container: str = "mean", unit: str = "auto") -> tuple[Series, ...]:
    """Read a utilization trace CSV (or the single CSV inside a .tar.gz) into series.

    ``container``: ``mean`` (one series, mean over containers at each timestamp), ``each`` (one
    series per container, busiest first), or a container id.
    """
    rows = _rows(path)
    by_container: dict[str, dict[float, float]] = defaultdict(dict)
    for ts, value, cid in rows:
        by_container[cid][ts] = value
    if not by_container:
        raise ValueError(f"trace {path}: no data rows")
    if container == "mean":
        sums: dict[float, list[float]] = defaultdict(list)
        for points in by_container.values():
            for ts, value in points.items():
                sums[ts].append(value)
        selected = [{ts: sum(vs) / len(vs) for ts, vs in sums.items()}]
    elif container == "each":
        selected = sorted(by_container.values(), key=lambda pts: -sum(pts.values()) / len(pts))
    elif container in by_container:
        selected = [by_container[container]]
    else:
        sample = ", ".join(sorted(by_container)[:3])
        raise ValueError(
            f"trace {path}: no container {container!r}; use mean, each or an id such as {sample}"
        )
    scale = _unit_scale(unit, (v for pts in selected for v in pts.values()))
    return tuple(_series(points, scale) for points in selected)


def _rows(path: Path) -> list[tuple[float, float, str]]:
    if not path.is_file():
        raise ValueError(f"trace file {path} does not exist")
    if path.name.endswith((".tar.gz", ".tgz")):
        with tarfile.open(path, "r:gz") as archive:
            members = [m for m in archive.getmembers() if m.isfile() and m.name.endswith(".csv")]
            if len(members) != 1:
                raise ValueError(f"trace {path}: expected one .csv inside, found {len(members)}")
            handle = archive.extractfile(members[0])
            assert handle is not None  # a regular file member always has content
            return _parse_csv(io.TextIOWrapper(handle, encoding="utf-8"), path)
    with path.open(encoding="utf-8", newline="") as text:
        return _parse_csv(text, path)


def _parse_csv(text: Iterable[str], path: Path) -> list[tuple[float, float, str]]:
    reader = csv.reader(text)
    header = [h.strip().lower() for h in next(reader, [])]
    ts_col = next((i for i, h in enumerate(header) if h.startswith("timestamp")), None)
    if ts_col is None or "value" not in header:
        raise ValueError(
            f"trace {path}: header must name a timestamp column (timestamp, timestamp_anon) "
            f"and a value column; found {header}"
        )
    value_col = header.index("value")
    cid_col = next((i for i, h in enumerate(header) if h.startswith("container")), None)
    rows = []
    for line_no, row in enumerate(reader, start=2):
        if not row:
            continue
        try:
            ts, value = float(row[ts_col]), float(row[value_col])
        except (ValueError, IndexError) as exc:
            raise ValueError(f"trace {path}: line {line_no}: not a number ({exc})") from None
        if math.isnan(value):
            continue
        rows.append((ts, value, row[cid_col] if cid_col is not None else ""))
    return rows


def _unit_scale(unit: str, values: Iterable[float]) -> float:
    if unit == "percent":
        return 0.01
    if unit == "ratio":
        return 1.0
    return 0.01 if max(values, default=0.0) > 1.0 else 1.0


def _series(points: dict[float, float], scale: float) -> Series:
    times = sorted(points)
    return Series(tuple(times), tuple(min(1.0, max(0.0, points[t] * scale)) for t in times))


def _options(parts: list[str], allowed: set[str], spec: str) -> dict[str, str]:
    opts = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or key not in allowed:
            raise ValueError(
                f"profile {spec!r}: bad option {part!r}; allowed: "
                f"{', '.join(sorted(allowed))}; forms: {PROFILE_FORMS}"
            )
        opts[key] = value
    return opts


def _number(text: str, what: str, spec: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"profile {spec!r}: {what} must be a number, not {text!r}") from None


def _positive(text: str, what: str, spec: str) -> float:
    value = _number(text, what, spec)
    if value <= 0:
        raise ValueError(f"profile {spec!r}: {what} must be above 0, not {text!r}")
    return value


def _ratio(text: str, what: str, spec: str) -> float:
    value = _number(text, what, spec)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"profile {spec!r}: {what} is a ratio between 0 and 1, not {text!r}")
    return value
