"""What the benches write as JSON: a report with no infinity or NaN, which JSON cannot hold."""

from __future__ import annotations

import json
import math
from pathlib import Path


def finite(value: object) -> object:
    """``value`` with every non-finite float written as None (null): a p99 of a point where every
    request failed, a ratio with nothing to divide by."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def write_report(path: Path, report: dict) -> None:
    """Write ``report`` as finite JSON at ``path`` (its folder made if need be) and say where."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(finite(report), indent=2) + "\n")
    print(f"wrote {path}")
