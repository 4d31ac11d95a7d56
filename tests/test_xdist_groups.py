"""The suite's xdist groups reach pytest-xdist (tests/conftest.py, docs/testing.md).

Tests that share a module-scoped fixture run on one worker, so a process the fixture starts (the
live stack, a Prometheus) starts once. pytest-xdist's `--dist loadgroup` reads a group from the
``@group`` suffix it adds to each node id; where it cannot add it (pytest 9.2 with
pytest-xdist 3.8), every test is scheduled alone, nothing fails, and the live stack starts on
every worker that draws one of its tests. This module's two tests share such a fixture.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

GROUP = "tests/test_xdist_groups.py"


@pytest.fixture(scope="module")
def shared() -> Iterator[list[str]]:
    yield []


@pytest.mark.parametrize("which", ["first", "second"])
def test_a_module_fixture_puts_its_tests_in_one_group(
    request: pytest.FixtureRequest, shared: list[str], which: str
) -> None:
    marker = request.node.get_closest_marker("xdist_group")
    assert marker is not None and marker.args == (GROUP,)
    if request.config.getoption("loadgroup", False):  # what a worker is told of `--dist`
        assert request.node.nodeid.endswith(f"@{GROUP}"), (
            f"pytest-xdist did not put {request.node.nodeid} in its group: the installed pytest "
            "and pytest-xdist do not work together (see pyproject.toml's test extra)"
        )
