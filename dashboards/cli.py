"""Command line of the dashboard generator: write the JSON files or check them."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autoglm.config import ConfigError, load_config
from dashboards.output import JSON_DIR, compare_all, write_all


@dataclass(frozen=True)
class GeneratorConfig:
    out_dir: str = field(
        default=str(JSON_DIR), metadata={"help": "directory that holds the dashboard JSON files"}
    )
    check: bool = field(
        default=False,
        metadata={"help": "write nothing; exit 1 if the files differ from what the code generates"},
    )

    def __post_init__(self) -> None:
        if not self.out_dir:
            raise ConfigError("out-dir must not be empty (e.g. --out-dir dashboards/json)")


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(
        GeneratorConfig,
        argv,
        prog="python -m dashboards",
        description="Generate the Grafana dashboards from their Python modules.",
    )
    directory = Path(config.out_dir)
    if config.check:
        differences = compare_all(directory)
        for difference in differences:
            print(f"{directory / difference.filename}: {difference.problem}", file=sys.stderr)
        if differences:
            print("dashboards are out of date; run: python -m dashboards", file=sys.stderr)
            return 1
        print(f"dashboards in {directory} are up to date")
        return 0
    for path in write_all(directory):
        print(f"wrote {path}")
    return 0
