"""Per-test CPU time, to find what keeps a tier's cores busy (docs/testing.md, "What a test may
cost"): ``python -m pytest -p tests.cpu_report --cpu-report FILE ...``.

CI's slow tier is CPU-bound on its 2-core machine, so its wall time follows the CPU its tests
spend, much of it in the processes they start. Wall-clock durations (``--durations``) do not show
that: a test that waits on a server looks as long as one that keeps both cores busy.

For each test, the worker process's own CPU time and that of the child processes it reaped
during the test (``getrusage``: user + system) are appended to FILE as one JSON line; the
run's end prints the tests and modules that spent most. A fixture's processes count where the
fixture is torn down: a module- or session-scoped one on the last test that used it (which is
how a session-scoped stack that stayed up, idle, for most of a run was found). Children that are
never reaped, and the pytest-xdist controller, are not counted.
"""

from __future__ import annotations

import collections
import json
import resource
import time
from collections.abc import Generator
from pathlib import Path

import pytest

SHOWN = 15


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-report",
        metavar="FILE",
        help="append each test's CPU seconds (its own and its children's) to FILE as JSON lines",
    )


def _worker(config: pytest.Config) -> str | None:
    """The pytest-xdist worker's id (gw0, ...), None in the controller or a run without xdist."""
    workerinput = getattr(config, "workerinput", None)
    return workerinput["workerid"] if workerinput else None


def _cpu_seconds() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, None, None]:
    path = item.config.getoption("cpu_report")
    if not path:
        yield
        return
    own_before, children_before = _cpu_seconds()
    started = time.monotonic()
    yield
    own_after, children_after = _cpu_seconds()
    record = {
        "test": item.nodeid,
        "cpu_seconds": round(own_after - own_before + children_after - children_before, 3),
        "children_cpu_seconds": round(children_after - children_before, 3),
        "wall_seconds": round(time.monotonic() - started, 3),
        "worker": _worker(item.config) or "main",
    }
    with open(path, "a") as out:  # one short line per write: workers' lines do not interleave
        out.write(json.dumps(record) + "\n")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    path = terminalreporter.config.getoption("cpu_report")
    if not path or _worker(terminalreporter.config) or not Path(path).is_file():
        return
    records = [json.loads(line) for line in Path(path).read_text().splitlines() if line]
    by_module: collections.Counter[str] = collections.Counter()
    for record in records:
        by_module[record["test"].split("::")[0]] += record["cpu_seconds"]
    write = terminalreporter.write_line
    terminalreporter.section("CPU seconds (own + reaped children)")
    write(f"{sum(by_module.values()):.0f} CPU-s in {len(records)} tests, lines in {path}")
    for record in sorted(records, key=lambda r: -r["cpu_seconds"])[:SHOWN]:
        write(f"{record['cpu_seconds']:8.1f}  {record['wall_seconds']:7.1f} s  {record['test']}")
    write("by module:")
    for module, seconds in by_module.most_common(SHOWN):
        write(f"{seconds:8.1f}  {module}")
