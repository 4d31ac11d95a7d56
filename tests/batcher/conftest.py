"""Fixtures for the batcher tests: a virtual-time event loop and real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

T = TypeVar("T")


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock jumps to the next timer whenever nothing is ready to run.

    The engine reads time only through its loop, so under this loop a simulated model that
    "takes" 50 ms costs no real time, runs are deterministic for a given seed, and deadlines are
    checked against exact simulated times instead of a loaded machine's wall clock. Only for
    code that does no real I/O and starts no threads (nothing could wake the loop from outside).
    """

    def __init__(self) -> None:
        super().__init__()
        self._virtual_now = 0.0

    def time(self) -> float:
        return self._virtual_now

    def _run_once(self) -> None:
        if not self._ready and self._scheduled:
            upcoming = [h.when() for h in self._scheduled if not h.cancelled()]
            if upcoming:
                self._virtual_now = max(self._virtual_now, min(upcoming))
        super()._run_once()


@pytest.fixture
def run_virtual() -> Iterator[Callable[[Callable[[], Awaitable[T]]], T]]:
    """Run an async function to completion in virtual time; the loop is closed afterwards."""
    loops: list[VirtualTimeLoop] = []

    def run(main: Callable[[], Awaitable[Any]]) -> Any:
        loop = VirtualTimeLoop()
        loops.append(loop)
        return loop.run_until_complete(main())

    yield run
    for loop in loops:
        loop.close()
