"""Turn dashboard builders into stable JSON text, write the committed files, and compare them.

The JSON must be byte-for-byte reproducible so that a test can fail when the committed files and
the code disagree: panels get sequential IDs in layout order and the text ends with a newline.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models.dashboard import Dashboard

from dashboards.catalogue import DASHBOARDS

JSON_DIR = Path(__file__).resolve().parent / "json"


def _number_panels(model: Dashboard) -> None:
    next_id = 1
    for panel in model.panels or []:
        panel.id_val = next_id
        next_id += 1
        for child in getattr(panel, "panels", None) or []:  # collapsed rows hold their panels
            child.id_val = next_id
            next_id += 1


def render(builder: db.Dashboard) -> str:
    """The JSON text of one dashboard, as committed."""
    model = builder.build()
    _number_panels(model)
    return json.dumps(model, cls=JSONEncoder, indent=2) + "\n"


def render_all() -> dict[str, str]:
    """File name -> JSON text for every dashboard in the catalogue."""
    return {entry.filename: render(entry.build()) for entry in DASHBOARDS}


@dataclass(frozen=True)
class Difference:
    filename: str
    problem: str  # "missing", "differs" or "not generated"


def write_all(directory: Path = JSON_DIR) -> list[Path]:
    """Write every dashboard's JSON into ``directory``; returns the paths written."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for filename, text in render_all().items():
        path = directory / filename
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written


def compare_all(directory: Path = JSON_DIR) -> list[Difference]:
    """What differs between the files in ``directory`` and what the code generates."""
    generated = render_all()
    differences = []
    for filename, text in generated.items():
        path = directory / filename
        if not path.exists():
            differences.append(Difference(filename, "missing"))
        elif path.read_text(encoding="utf-8") != text:
            differences.append(Difference(filename, "differs"))
    for path in sorted(directory.glob("*.json")):
        if path.name not in generated:
            differences.append(Difference(path.name, "not generated"))
    return differences
