"""One live stack (exporters, Prometheus, Alertmanager, webhook) per test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.live_rules_dashboards.stack import LiveStack, running_stack


@pytest.fixture(scope="session")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with running_stack(tmp_path_factory.mktemp("live-stack")) as stack:
        yield stack
