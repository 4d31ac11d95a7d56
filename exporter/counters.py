"""dcgm-exporter's counters CSV (``-f default-counters.csv``): which GPU fields to export.

Operators who replace dcgm-exporter already keep such a file, trimmed for cardinality or
extended with profiling fields, so ``--collectors FILE`` reads it as it is. Each line is
``FIELD, TYPE, HELP`` (``#`` starts a comment). A field this exporter collects is exported with
that help text; a DCGM field it does not collect is skipped with one warning at start, so a file
written for dcgm-exporter works unchanged; anything else (a name that is not a DCGM field, an
unknown type, a type that contradicts the field's, a duplicate) is an error that names the line.
Fields left out of the file are not read from the GPU at all where the source allows it (the
NVML profiling samples are the costly ones).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from pathlib import Path

from autoglm.config import ConfigError
from exporter.fields import BY_NAME, FIELDS, FieldSpec

_FIELD_NAME = re.compile(r"^DCGM_(FI|EXP)_[A-Z0-9_]+$")
_TYPES = ("gauge", "counter", "label")


@dataclass(frozen=True)
class CounterSelection:
    """The fields to export, in the file's order, and the DCGM fields the file named in vain."""

    fields: tuple[FieldSpec, ...]
    not_collected: tuple[str, ...] = ()

    @property
    def names(self) -> frozenset[str]:
        return frozenset(spec.dcgm_name for spec in self.fields)


ALL_FIELDS = CounterSelection(FIELDS)


def parse_counters(text: str, source: str = "counters file") -> CounterSelection:
    """Validate a counters CSV; :class:`ConfigError` names the line and the fix."""
    chosen: dict[str, FieldSpec] = {}
    not_collected: list[str] = []
    for number, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        where = f"{source} line {number}"
        parts = [part.strip() for part in line.split(",", 2)]
        if len(parts) < 2:
            raise ConfigError(f"{where}: {line!r} is not 'FIELD, TYPE, HELP'")
        name, kind = parts[0], parts[1]
        help_text = parts[2] if len(parts) == 3 else ""
        if not _FIELD_NAME.match(name):
            raise ConfigError(
                f"{where}: {name!r} is not a DCGM field name (DCGM_FI_... or DCGM_EXP_...)"
            )
        if kind not in _TYPES:
            raise ConfigError(f"{where}: type {kind!r} of {name} is not one of {', '.join(_TYPES)}")
        if name in chosen or name in not_collected:
            raise ConfigError(f"{where}: {name} is listed twice; keep one line")
        spec = BY_NAME.get(name)
        if spec is None:
            not_collected.append(name)
            continue
        if kind != spec.kind:
            raise ConfigError(
                f"{where}: {name} is a {spec.kind}, not a {kind}; change the type column to "
                f"{spec.kind}"
            )
        chosen[name] = replace(spec, dcgm_help=help_text) if help_text else spec
    if not chosen:
        raise ConfigError(
            f"{source}: names no field this exporter collects; supported fields: "
            + ", ".join(spec.dcgm_name for spec in FIELDS)
        )
    return CounterSelection(tuple(chosen.values()), tuple(not_collected))


def load_counters(path: str | None) -> CounterSelection:
    """The selection in ``path``, or every field when no file is given."""
    if not path:
        return ALL_FIELDS
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(
            f"--collectors {path!r}: cannot read it ({exc.strerror}); give the path of a "
            "dcgm-exporter counters CSV"
        ) from None
    except UnicodeDecodeError:
        raise ConfigError(
            f"--collectors {path!r} is not UTF-8 text; give the path of a dcgm-exporter "
            "counters CSV"
        ) from None
    return parse_counters(text, source=f"--collectors {path!r}")
