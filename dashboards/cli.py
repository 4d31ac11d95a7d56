"""Command line of the dashboard generator: write the JSON files or check them.

The generator builds dashboards with grafana_foundation_sdk, one of the test extras; the committed
JSON needs nothing. Without the SDK the command says how to install it instead of a traceback.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from autoglm.config import EXIT_USAGE, load_config

PROG = "python -m dashboards"
SDK = "grafana_foundation_sdk"


@dataclass(frozen=True)
class GeneratorConfig:
    out_dir: str = field(
        default="",
        metadata={
            "help": "directory that holds the dashboard JSON files "
            "(default: dashboards/json in the package)"
        },
    )
    check: bool = field(
        default=False,
        metadata={"help": "write nothing; exit 1 if the files differ from what the code generates"},
    )


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(
        GeneratorConfig,
        argv,
        prog=PROG,
        description="Generate the Grafana dashboards from their Python modules.",
    )
    try:
        from dashboards.output import JSON_DIR, compare_all, write_all
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.partition(".")[0] != SDK:
            raise
        print(
            f"{PROG}: error: the generator needs {SDK}, one of the test extras; "
            "install them with: pip install -e '.[test]'",
            file=sys.stderr,
        )
        return EXIT_USAGE
    directory = Path(config.out_dir) if config.out_dir else JSON_DIR
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
