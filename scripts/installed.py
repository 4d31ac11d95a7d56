"""Whether this checkout is installed for its tests already, so `scripts/test` can skip pip.

A pip run that has nothing to do still takes about 20 CPU-seconds here (it resolves every
requirement against the indexes and rebuilds the editable wheel), and CI calls `scripts/test`
twice. `scripts/test` records a stamp after each install it makes; the next call skips pip only
while the stamp names this interpreter and this pyproject.toml, and every requirement of the
project and of its test extra is still installed at a version it accepts.

    python scripts/installed.py          # exit 0: installed; 1: install (the reason on stderr)
    python scripts/installed.py --stamp  # after an install: record it
"""

from __future__ import annotations

import hashlib
import json
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = ROOT / "pyproject.toml"
STAMP = ROOT / ".tools" / "installed.json"
EXTRA = "test"
PROJECT = tomllib.loads(PYPROJECT.read_text())["project"]["name"]


def current() -> dict[str, str]:
    """What a stamp records: the interpreter, and the pyproject.toml it installed."""
    digest = hashlib.sha256(PYPROJECT.read_bytes()).hexdigest()
    return {"python": sys.executable, "pyproject_sha256": digest}


def missing_requirement() -> str | None:
    """The first requirement of the project or its test extra that this interpreter lacks."""
    try:
        from packaging.requirements import Requirement
    except ImportError:
        return "packaging (to read the requirements)"
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    wanted = [PROJECT] + project["dependencies"]
    wanted += project["optional-dependencies"][EXTRA]
    for line in wanted:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": EXTRA}):
            continue
        try:
            version = metadata.version(requirement.name)
        except metadata.PackageNotFoundError:
            return line
        if not requirement.specifier.contains(version, prereleases=True):
            return f"{line} (installed: {version})"
    return None


def reason_to_install() -> str | None:
    """Why pip must run, or None when everything is installed as the stamp recorded it."""
    if not STAMP.is_file():
        return f"no install recorded in {STAMP.relative_to(ROOT)}"
    try:
        recorded = json.loads(STAMP.read_text())
    except json.JSONDecodeError:
        return f"{STAMP.relative_to(ROOT)} is not JSON"
    if recorded != current():
        return "pyproject.toml or the interpreter changed since the last install"
    missing = missing_requirement()
    if missing is not None:
        return f"not installed: {missing}"
    source = json.loads(metadata.distribution(PROJECT).read_text("direct_url.json") or "{}")
    if source.get("url") != ROOT.as_uri():
        return f"{PROJECT} is installed from {source.get('url', 'an index')}, not this checkout"
    return None


def main(argv: list[str]) -> int:
    if argv == ["--stamp"]:
        STAMP.parent.mkdir(parents=True, exist_ok=True)
        STAMP.write_text(json.dumps(current()) + "\n")
        return 0
    if argv:
        print("usage: python scripts/installed.py [--stamp]", file=sys.stderr)
        return 2
    reason = reason_to_install()
    if reason is not None:
        print(f"scripts/test: installing: {reason}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
