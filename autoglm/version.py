"""The installed version of Open-AutoGLM, for every command's ``--version``.

Read from the package metadata, so the version is written in one place (``pyproject.toml``) and
a command reports what is installed, not what a source file claims.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

DISTRIBUTION = "open-autoglm"


def package_version() -> str:
    """The installed distribution's version, or a line saying it is not installed."""
    from importlib import metadata  # a few hundredths of a second, paid only when asked

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


class _PrintVersion(argparse.Action):
    """``--version``: prints ``PROG VERSION`` and exits 0, reading the metadata only when asked."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        print(f"{parser.prog} {package_version()}")
        parser.exit(0)


def add_version_argument(parser: argparse.ArgumentParser) -> None:
    """Give ``parser`` a ``--version`` flag."""
    parser.add_argument(
        "--version", action=_PrintVersion, nargs=0, help="print the version and exit"
    )
