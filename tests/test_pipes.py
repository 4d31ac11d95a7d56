"""A command piped into a reader that stops early ends quietly, as a shell tool does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

LISTING = """
import os, sys
from autoglm.pipes import stdout_may_close

@stdout_may_close
def main(argv=None):
    for i in range(100_000):
        print("line", i)
    return 3

if "--reader-gone" in sys.argv:
    read_end, write_end = os.pipe()
    os.close(read_end)
    os.dup2(write_end, sys.stdout.fileno())
sys.exit(main())
"""


def run_listing(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", LISTING, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_listing_whose_reader_has_gone_exits_141_without_a_traceback() -> None:
    done = run_listing("--reader-gone")
    assert done.returncode == 141
    assert done.stderr == ""


def test_a_listing_read_to_the_end_keeps_its_output_and_exit_status() -> None:
    done = run_listing()
    assert done.returncode == 3
    assert done.stdout.splitlines()[-1] == "line 99999"
