"""The platform's Prometheus rules, shipped as package data so an installed copy can load them."""

from importlib.resources import files
from pathlib import Path

RULES_FILE = Path(str(files(__name__) / "rules.yaml"))
