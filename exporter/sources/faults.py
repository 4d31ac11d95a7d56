"""Faults that can be injected into simulated GPUs, and their spec strings.

Faults let tests, demos and alert rules meet the failures real fleets have (a GPU that falls off
the bus, an Xid, a cooling failure, a hung driver call, one broken sensor, ECC errors) without
hardware. Spec forms (CLI ``--fault``, ``POST /debug/faults``)::

    xid:gpu=2:code=79
    lost:gpu=1
    temp-ramp:gpu=0:to=95:over=30s
    hang:gpu=3
    field-error:gpu=0:field=DCGM_FI_DEV_POWER_USAGE[:reason=timeout]
    ecc:gpu=0[:sbe=N][:dbe=N]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from exporter.fields import SOURCE_FIELDS

FAULT_FORMS = (
    "xid:gpu=N:code=N, lost:gpu=N, temp-ramp:gpu=N:to=CELSIUS:over=DURATION (e.g. 30s, 2m), "
    "hang:gpu=N, field-error:gpu=N:field=DCGM_FI_...[:reason=WORD], ecc:gpu=N[:sbe=N][:dbe=N]"
)


@dataclass(frozen=True)
class XidFault:
    """The driver reports Xid ``code`` once."""

    gpu: int
    code: int

    def spec(self) -> str:
        return f"xid:gpu={self.gpu}:code={self.code}"


@dataclass(frozen=True)
class LostFault:
    """Every read fails with ``gpu_is_lost``, as NVML does after the GPU falls off the bus."""

    gpu: int

    def spec(self) -> str:
        return f"lost:gpu={self.gpu}"


@dataclass(frozen=True)
class TempRampFault:
    """Temperature climbs linearly to ``to_c`` over ``over_s`` seconds, then holds (fan failure)."""

    gpu: int
    to_c: float
    over_s: float

    def spec(self) -> str:
        return f"temp-ramp:gpu={self.gpu}:to={self.to_c:g}:over={self.over_s:g}s"


@dataclass(frozen=True)
class HangFault:
    """Reads block until the fault is cleared or the source closes (a wedged driver call)."""

    gpu: int

    def spec(self) -> str:
        return f"hang:gpu={self.gpu}"


@dataclass(frozen=True)
class FieldErrorFault:
    """One field fails with ``reason`` while the rest of the device reads fine."""

    gpu: int
    field: str
    reason: str = "unknown"

    def spec(self) -> str:
        return f"field-error:gpu={self.gpu}:field={self.field}:reason={self.reason}"


@dataclass(frozen=True)
class EccFault:
    """Adds ECC errors once; double-bit errors also leave a row remap pending, as on HBM parts."""

    gpu: int
    sbe: int = 0
    dbe: int = 0

    def spec(self) -> str:
        return f"ecc:gpu={self.gpu}:sbe={self.sbe}:dbe={self.dbe}"


Fault = XidFault | LostFault | TempRampFault | HangFault | FieldErrorFault | EccFault

_KEYS: dict[str, tuple[set[str], set[str]]] = {  # kind: (required keys, optional keys)
    "xid": ({"gpu", "code"}, set()),
    "lost": ({"gpu"}, set()),
    "temp-ramp": ({"gpu", "to", "over"}, set()),
    "hang": ({"gpu"}, set()),
    "field-error": ({"gpu", "field"}, {"reason"}),
    "ecc": ({"gpu"}, {"sbe", "dbe"}),
}
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}
_REASON = re.compile(r"^[a-z][a-z0-9_]*$")


def parse_fault(spec: str) -> Fault:
    """Parse a fault spec; ``ValueError`` names the problem and lists the accepted forms."""
    kind, *parts = spec.strip().split(":")
    if kind not in _KEYS:
        raise ValueError(f"unknown fault kind {kind!r} in {spec!r}; accepted forms: {FAULT_FORMS}")
    required, optional = _KEYS[kind]
    opts: dict[str, str] = {}
    for part in parts:
        key, eq, value = part.partition("=")
        if not eq or key not in required | optional or not value:
            raise ValueError(f"bad part {part!r} in fault {spec!r}; accepted forms: {FAULT_FORMS}")
        opts[key] = value
    missing = sorted(required - opts.keys())
    if missing:
        raise ValueError(
            f"fault {spec!r} is missing {', '.join(missing)}; accepted forms: {FAULT_FORMS}"
        )
    gpu = _count(opts["gpu"], "gpu", spec)
    if kind == "xid":
        return XidFault(gpu, _count(opts["code"], "code", spec))
    if kind == "lost":
        return LostFault(gpu)
    if kind == "temp-ramp":
        return TempRampFault(gpu, _celsius(opts["to"], spec), _duration(opts["over"], spec))
    if kind == "hang":
        return HangFault(gpu)
    if kind == "field-error":
        field = opts["field"]
        if field not in SOURCE_FIELDS:
            raise ValueError(
                f"fault {spec!r}: unknown field {field!r}; use a DCGM field a source reads, "
                f"e.g. DCGM_FI_DEV_POWER_USAGE"
            )
        reason = opts.get("reason", "unknown")
        if not _REASON.match(reason):
            raise ValueError(f"fault {spec!r}: reason must be snake_case, not {reason!r}")
        return FieldErrorFault(gpu, field, reason)
    return EccFault(
        gpu, _count(opts.get("sbe", "0"), "sbe", spec), _count(opts.get("dbe", "0"), "dbe", spec)
    )


def _count(text: str, what: str, spec: str) -> int:
    if not text.isdigit():
        raise ValueError(f"fault {spec!r}: {what} must be a whole number >= 0, not {text!r}")
    return int(text)


def _celsius(text: str, spec: str) -> float:
    try:
        value = float(text.removesuffix("c").removesuffix("C"))
    except ValueError:
        raise ValueError(f"fault {spec!r}: to must be degrees celsius, not {text!r}") from None
    if not -50.0 <= value <= 150.0:
        raise ValueError(f"fault {spec!r}: to={text} is not a GPU temperature (-50..150 C)")
    return value


def _duration(text: str, spec: str) -> float:
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"fault {spec!r}: over must be a duration like 30s, 2m or 500ms")
    return float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
