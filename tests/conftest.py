"""Suite-wide test tiers and environment skips, decided in one place.

Tiers: ``python -m pytest -m "not slow"`` is the fast tier (pure cores, in-process servers,
anything quick); ``-m slow`` holds what starts real processes (Prometheus, promtool, helm, the
components' own CLIs, the whole local stack), runs a bench smoke, or takes more than a few
seconds. ``scripts/test`` runs both, in one session. Rather than decorating every such test, the
tier is given here by folder, module, fixture or marker, from ``--durations=0`` runs
(docs/testing.md says how to re-measure); a test module may still mark a test ``slow`` itself.

Parallel runs (pytest-xdist, ``-n N --dist loadgroup``, as ``scripts/test`` runs them): tests
that share a module- or session-scoped fixture of this suite (a real Prometheus, the live stack)
are put in one ``xdist_group``, so that one worker starts it once and runs them in their order;
the CPU-bound bench smokes go in two groups (``BENCH_LANES``), each run one smoke at a time; the
rest spread one by one. ``RUN_FIRST`` starts the longest tests before the short ones, so that
they overlap the rest instead of trailing it (with ``--no-loadscope-reorder``, which keeps this
order).

Skips: the helm chart tests need the helm binary that ``scripts/install-helm`` puts in
``.tools/bin``; without it they are skipped with that reason instead of failing.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from autoglm.logs import CHATTY_LIBRARIES

ROOT = Path(__file__).resolve().parents[1]
HELM = ROOT / ".tools" / "bin" / "helm"

# Folders and modules (relative to tests/) whose tests are all slow: each starts real processes
# (helm, promtool, Prometheus, a component's CLI, the local stack) or runs a bench smoke.
SLOW_PATHS = (
    "alerts/",
    "bench/",
    "helm/",
    "live_rules_dashboards/",
    "autoscaler/test_budget_controller.py",
    "autoscaler/test_controller_prometheus.py",
    "autoscaler/test_fleet_backfill_bench.py",
    "autoscaler/test_simulator.py",
    "batcher/test_batcher_backfill_bench.py",
    "batcher/test_batcher_cli.py",
    "batcher/test_batcher_gpu_bench.py",
    "batcher/test_batcher_simulation.py",
    "batcher/test_batcher_workers.py",
    "exporter/test_cli.py",
    "exporter/test_e2e_prometheus.py",
    "exporter/test_exporter_gpu_script.py",
    "exporter/test_promtool.py",
    "jobs/test_job_resume.py",
    "predictor/test_predictor_bench.py",
    "test_readme_examples.py",
    "up/test_job_service.py",
    "up/test_up_cli.py",
)

# Single tests that take many seconds inside otherwise quick modules (model fits, long sweeps,
# real-time waits, plotting).
SLOW_TESTS = (
    "autoscaler/test_budget_core.py::test_never_exceeds_the_budget",
    "autoscaler/test_budget_core.py::test_raising_a_priority_never_lowers_the_allocation",
    "batcher/test_batcher_best_effort_http.py::test_sigterm_drains_queued_best_effort_requests",
    "batcher/test_batcher_engine.py::test_utilization_cap_leaves_the_device_idle_for_co_tenants",
    "jobs/test_job_runner.py::test_refused_best_effort_requests_make_the_job_back_off_and_retry",
    "up/test_report.py::test_report_is_html_with_an_embedded_png",
    "autoscaler/test_slo_sizing.py::test_sizing_is_monotone_in_rate_and_stays_within_bounds",
    "predictor/test_predictor_backtest.py::test_the_chosen_model_is_calibrated_with_the_backtests",
    "predictor/test_predictor_backtest.py::test_a_combination_is_scored_from_its_members",
    "predictor/test_predictor_models.py::test_the_gru_learns_a_seasonal_series_from_a_poor_start",
    "helm/test_values_schema.py::test_the_predictor_config_values_are_the_predictor_settings",
)

# Fixtures that start a real process or a Prometheus server.
SLOW_FIXTURES = frozenset({"start_exporter", "live_stack"})

# The bench smokes: each keeps a core busy while it runs, and none shares anything with another
# (ports 0, temporary folders). A parallel run gives them lanes, xdist groups that run one smoke
# after another: with two (the default), at most two run at once, one per core of CI's 2-core
# machine, instead of one worker holding all of them for ~350 s in series on a quiet machine.
# ``AUTOGLM_TEST_BENCH_LANES=1`` puts them all in one lane again (what to compare against: on a
# machine other sessions keep busy the smokes slow each other down more than they gain, see
# docs/testing.md, Measured). The lanes are about equal in a whole slow tier (about 430 and 380 s
# of wall time on 4 Dec 2026); the first holds the batcher and GPU benches, the two longest. A
# test id goes to the first lane with a prefix of it; the second lane's ``bench/`` takes any new
# smoke under tests/bench/.
BENCH_LANES = (
    (
        "bench/test_bench_smokes.py::test_batcher_bench_smoke",
        "batcher/test_batcher_gpu_bench.py",
        "bench/test_serving_cost_smokes.py::test_path_parts_smoke",
        "batcher/test_batcher_models_bench.py",
        "batcher/test_batcher_backfill_bench.py",
        "autoscaler/test_budget_simulator.py::test_the_bench_smoke",
        "autoscaler/test_fleet_backfill_bench.py",
    ),
    (
        "bench/test_batcher_serving_smoke.py",
        "bench/test_serving_cost_smokes.py::test_cost_ab_smoke",
        "bench/test_bench_smokes.py::test_exporter_bench_smoke",
        "predictor/test_predictor_bench.py",
        "bench/",
    ),
)
BENCH_SMOKES = tuple(prefix for lane in BENCH_LANES for prefix in lane)
BENCH_LANES_VARIABLE = "AUTOGLM_TEST_BENCH_LANES"

# The slow tier's longest tests (a whole stack, or a bench, for a minute or more of wall clock),
# moved to the front of the run in this order: in a parallel run they then overlap the many
# short tests (the fast tier's among them) instead of starting last and trailing them
# (docs/testing.md).
RUN_FIRST = (
    "up/test_up_cli.py",
    "live_rules_dashboards/",
    *BENCH_SMOKES,
    "test_readme_examples.py::test_example_runs[README.md:",
    "alerts/test_promtool.py::test_unit_tests_pass_in_promtool",
    "test_readme_examples.py",
)

SHARED_SCOPES = ("session", "package", "module")


def _relative_id(item: pytest.Item) -> str:
    """``helm/test_x.py::test_y[param]``: the node id from inside tests/."""
    return item.nodeid.removeprefix("tests/")


def is_slow(item: pytest.Item) -> bool:
    """Whether the test belongs to the slow tier (see the module docstring)."""
    if item.get_closest_marker("slow") or item.get_closest_marker("live"):
        return True
    test_id = _relative_id(item)
    if test_id.startswith(SLOW_PATHS) or test_id.startswith(SLOW_TESTS):
        return True
    return not SLOW_FIXTURES.isdisjoint(getattr(item, "fixturenames", ()))


def shared_fixture_home(item: pytest.Item) -> str | None:
    """Where the widest-scoped fixture of this suite that ``item`` uses is defined (a test module,
    or a conftest's folder), when that fixture is shared beyond one test; else None."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    homes = [
        (SHARED_SCOPES.index(fixture.scope), fixture.baseid)
        for name in info.names_closure
        for fixture in info.name2fixturedefs.get(name, ())[-1:]
        if fixture.baseid and fixture.scope in SHARED_SCOPES
    ]
    return min(homes)[1] if homes else None


def bench_lane(item: pytest.Item, lanes: int = len(BENCH_LANES)) -> int | None:
    """The number (1 to ``lanes``) of the lane that ``item`` runs in: its ``BENCH_LANES`` lane,
    the last of ``lanes`` when there are fewer; None for a test that is not a bench smoke."""
    test_id = _relative_id(item)
    for number, lane in enumerate(BENCH_LANES, start=1):
        if test_id.startswith(lane):
            return min(number, lanes)
    return None


def bench_lane_count() -> int:
    """How many bench lanes ``AUTOGLM_TEST_BENCH_LANES`` asks for (default: all of them)."""
    raw = os.environ.get(BENCH_LANES_VARIABLE, "")
    if not raw:
        return len(BENCH_LANES)
    if not (raw.isdigit() and 1 <= int(raw) <= len(BENCH_LANES)):
        raise pytest.UsageError(
            f"{BENCH_LANES_VARIABLE} must be a whole number from 1 to {len(BENCH_LANES)}, "
            f"got {raw!r}"
        )
    return int(raw)


def run_first_rank(item: pytest.Item) -> int:
    """The index of the first ``RUN_FIRST`` entry ``item`` matches; past the end when none."""
    test_id = _relative_id(item)
    for rank, prefix in enumerate(RUN_FIRST):
        if test_id.startswith(prefix):
            return rank
    return len(RUN_FIRST)


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_helm = None
    if not (HELM.is_file() and os.access(HELM, os.X_OK)):
        no_helm = pytest.mark.skip(
            reason=f"no helm binary at {HELM.relative_to(ROOT)}: run `bash scripts/install-helm`"
        )
    grouping = config.pluginmanager.hasplugin("xdist")
    lanes = bench_lane_count()
    for item in items:
        if is_slow(item) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if no_helm is not None and _relative_id(item).startswith("helm/"):
            item.add_marker(no_helm)
        if grouping and not item.get_closest_marker("xdist_group"):
            lane = bench_lane(item, lanes)
            group = f"bench smokes {lane}" if lane else shared_fixture_home(item)
            if group is not None:
                item.add_marker(pytest.mark.xdist_group(group))
    items.sort(key=run_first_rank)  # stable: the order within each rank is kept


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """Put the logging set-up back after each test. A test that runs a component's main in
    process (``setup_logging``) leaves a handler on the stream pytest captured for it, and the
    root logger at its level: later tests' background threads then log into a closed file, and
    what a later test captures at info would depend on the order the tests ran in."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    chatty = {name: logging.getLogger(name).level for name in CHATTY_LIBRARIES}
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    for name, was in chatty.items():
        logging.getLogger(name).setLevel(was)
