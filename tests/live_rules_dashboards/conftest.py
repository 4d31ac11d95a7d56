"""One live stack (exporters, Prometheus, Alertmanager, webhook) per test module that uses it.

Module-scoped, not session-scoped: the stack keeps about half a core busy (its steady load, the
job, two autoscalers, the predictor's refits), and a session-scoped one stayed up, idle, until
its pytest worker had run every other test it was given, for most of the slow tier's time.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.live_rules_dashboards.stack import LiveStack, running_stack


@pytest.fixture(scope="module")
def live_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveStack]:
    with running_stack(tmp_path_factory.mktemp("live-stack")) as stack:
        yield stack
