"""The top-rate search of ``bench/batcher.py`` ends whatever the runs answer."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "batcher.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_batcher_search", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def drive(search, sustained) -> tuple[float, list[float]]:
    """Answer every rate the search asks for with ``sustained(rate)``; the result and the asks."""
    asked = [next(search)]
    try:
        while True:
            asked.append(search.send(sustained(asked[-1])))
            assert len(asked) < 1000, "the search does not end"
    except StopIteration as stop:
        return stop.value, asked


def test_a_search_where_every_rate_passes_stops_at_the_ceiling(bench):
    found, asked = drive(bench.top_rate_search(50.0, 60.0, 1.0, ceiling=200.0), lambda r: True)
    assert found == 200.0 and max(asked) == 200.0


def test_the_ceiling_does_not_move_a_search_that_finds_its_limit(bench):
    def limit(rate: float) -> bool:
        return rate <= 137.0

    capped, _ = drive(bench.top_rate_search(50.0, 60.0, 1.0, ceiling=200.0), limit)
    free, _ = drive(bench.top_rate_search(50.0, 60.0, 1.0), limit)
    assert capped == free and 136.0 <= capped <= 137.0
