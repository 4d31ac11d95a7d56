"""``autoglm datasets``: list, fetch, verify and locate the public traces the project uses.

    autoglm datasets list [--long]
    autoglm datasets fetch [NAME ...] [--mirror URL]   # every trace when no name is given
    autoglm datasets verify [NAME ...]
    autoglm datasets path NAME|PATH
    autoglm datasets derive                             # rewrite the committed excerpts

Each takes ``--cache-dir DIR`` (default: ``$AUTOGLM_TRACES_DIR``, else
``$XDG_CACHE_HOME/autoglm/traces``). Exit status: 0 done, 1 a trace missing or not matching its
checksum, 2 a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

from autoglm.config import OneLineErrorParser
from autoglm.datasets.catalog import EXCERPTS, TRACES, Trace
from autoglm.datasets.excerpts import DERIVATIONS
from autoglm.datasets.fetch import check_cache_dir, check_mirror, fetch
from autoglm.datasets.store import (
    DatasetError,
    DatasetUsageError,
    resolve,
    sha256_of,
    trace_named,
    traces_dir,
)
from autoglm.version import add_version_argument

EXIT_MISSING = 1
EXIT_USAGE = 2


class ProgressLine:
    """Prints a trace's download progress at every tenth, so a log shows it is moving."""

    def __init__(self, name: str, out: TextIO) -> None:
        self.name = name
        self.out = out
        self.last_tenth = -1

    def __call__(self, done: int, expected: int) -> None:
        tenth = min(10, done * 10 // max(expected, 1))
        if tenth > self.last_tenth:
            self.last_tenth = tenth
            share = f"{tenth * 10:3d}%"
            print(f"{self.name}: {share} of {expected / 1e6:.2f} MB", file=self.out, flush=True)


def _parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="autoglm datasets", description=__doc__.split("\n\n")[0])
    add_version_argument(parser)
    common = OneLineErrorParser(add_help=False)
    common.add_argument("--cache-dir", help="traces folder (default: $AUTOGLM_TRACES_DIR, XDG)")
    # Not required=True: argparse would then report a missing command before an unknown flag.
    commands = parser.add_subparsers(dest="command", parser_class=OneLineErrorParser)
    listing = commands.add_parser("list", parents=[common], help="the traces and excerpts")
    listing.add_argument("--long", action="store_true", help="with URL, licence and citation")
    fetching = commands.add_parser("fetch", parents=[common], help="download and verify")
    fetching.add_argument("names", nargs="*", metavar="NAME", help="traces (default: all)")
    fetching.add_argument("--mirror", help="base URL holding the traces in their upstream layout")
    verifying = commands.add_parser("verify", parents=[common], help="check the checksums")
    verifying.add_argument("names", nargs="*", metavar="NAME", help="traces (default: all)")
    locating = commands.add_parser("path", parents=[common], help="the file a name stands for")
    locating.add_argument("name", metavar="NAME|PATH")
    commands.add_parser("derive", parents=[common], help="rewrite the committed excerpts")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.error("choose a command: list, fetch, verify, path or derive")
    directory = traces_dir(args.cache_dir)
    try:
        if args.command == "list":
            return list_traces(directory, args.long)
        if args.command == "fetch":
            # Every name, the mirror and the folder are checked before the first download.
            traces = _named(args.names)
            check_mirror(args.mirror)
            check_cache_dir(directory)
            return fetch_traces(traces, directory, args.mirror)
        if args.command == "verify":
            return verify_traces(_named(args.names), directory, explicit=bool(args.names))
        if args.command == "path":
            print(resolve(args.name, directory))
            return 0
        return derive_excerpts(directory)
    except DatasetError as exc:
        print(f"autoglm datasets: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if isinstance(exc, DatasetUsageError) else EXIT_MISSING


def _named(names: list[str]) -> list[Trace]:
    return [trace_named(n) for n in names] if names else list(TRACES.values())


def list_traces(directory: Path, long: bool) -> int:
    print(f"traces folder: {directory}")
    for trace in TRACES.values():
        present = "fetched" if (directory / trace.relative_path).is_file() else "not fetched"
        print(f"  {trace.name:<28} {trace.size / 1e6:6.2f} MB  {present:<12} {trace.description}")
        if long:
            print(f"  {'':<28} url: {trace.url}")
            print(f"  {'':<28} sha256: {trace.sha256}")
            print(f"  {'':<28} licence: {trace.licence}")
            print(f"  {'':<28} cite: {trace.citation}")
    print("excerpts committed with the package (no fetch needed):")
    for excerpt in EXCERPTS.values():
        print(f"  {excerpt.name:<28} from {excerpt.source:<22} {excerpt.description}")
        if long:
            print(f"  {'':<28} file: {excerpt.path}")
            print(f"  {'':<28} licence: {excerpt.licence}")
    return 0


def fetch_traces(traces: list[Trace], directory: Path, mirror: str | None) -> int:
    for trace in traces:
        path, downloaded = fetch(trace, directory, mirror, ProgressLine(trace.name, sys.stderr))
        state = "downloaded and verified" if downloaded else "already present and verified"
        print(f"{trace.name}: {state}: {path}")
    return 0


def verify_traces(traces: list[Trace], directory: Path, explicit: bool) -> int:
    """A missing trace fails only when asked for by name; a wrong checksum always fails."""
    failed = False
    for trace in traces:
        path = directory / trace.relative_path
        if not path.is_file():
            failed |= explicit
            print(f"{trace.name}: missing from {path.parent}")
        elif (got := sha256_of(path)) != trace.sha256:
            failed = True
            print(f"{trace.name}: MISMATCH {path} has {got}, expected {trace.sha256}")
        else:
            print(f"{trace.name}: ok")
    for excerpt in EXCERPTS.values():
        if (got := sha256_of(excerpt.path)) != excerpt.sha256:
            failed = True
            print(f"{excerpt.name}: MISMATCH {excerpt.path} has {got}, expected {excerpt.sha256}")
    return EXIT_MISSING if failed else 0


def derive_excerpts(directory: Path) -> int:
    """Regenerate every excerpt from its whole trace; update the checksums in the catalog after."""
    for excerpt in EXCERPTS.values():
        source = resolve(excerpt.source, directory)
        text = DERIVATIONS[excerpt.name](source)
        excerpt.path.write_text(text, encoding="utf-8", newline="")
        changed = "" if sha256_of(excerpt.path) == excerpt.sha256 else " (checksum changed)"
        print(f"{excerpt.name}: wrote {excerpt.path}{changed}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
