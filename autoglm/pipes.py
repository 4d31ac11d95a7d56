"""Commands whose output is piped into a reader that stops early (``| head``).

The reader closes the pipe and the next write raises ``BrokenPipeError``: without this a
listing ends in a traceback, and Python prints another one when it flushes stdout at exit.
A shell reports a tool that a pipe closed as 128 + SIGPIPE, so that is the exit status here.
Only for the commands that print and exit: a server's stdout is not where its work goes.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from typing import Protocol

EXIT_PIPE_CLOSED = 141  # 128 + SIGPIPE (13)


class Main(Protocol):
    """A console script's entry point."""

    def __call__(self, argv: Sequence[str] | None = None) -> int: ...


def stdout_may_close(main: Main) -> Main:
    """``main``, ending quietly with :data:`EXIT_PIPE_CLOSED` once its reader has gone."""

    @functools.wraps(main)
    def run(argv: Sequence[str] | None = None) -> int:
        try:
            code = main(argv)
            sys.stdout.flush()  # here, not at exit, where the error could not be caught
            return code
        except BrokenPipeError:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # what is still buffered goes nowhere
            return EXIT_PIPE_CLOSED

    return run
