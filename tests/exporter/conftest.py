"""Fixtures for exporter tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.exporter.processes import ExporterProcess


@pytest.fixture
def start_exporter() -> Iterator[Callable[..., ExporterProcess]]:
    """Start exporter processes; every one still running at teardown is stopped."""
    started: list[ExporterProcess] = []

    def start(*args: str) -> ExporterProcess:
        proc = ExporterProcess(args)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.stop()
