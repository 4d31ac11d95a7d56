"""Suite-wide test tiers and environment skips, decided in one place.

Tiers: ``python -m pytest -m "not slow"`` is the fast tier (pure cores, in-process servers,
anything quick); ``-m slow`` holds what starts real processes (Prometheus, promtool, helm, the
components' own CLIs, the whole local stack), runs a bench smoke, or takes more than a few
seconds. ``scripts/test`` runs both. Rather than decorating every such test, the tier is given
here by folder, module, fixture or marker, from ``--durations=0`` runs (docs/testing.md says how
to re-measure); a test module may still mark a test ``slow`` itself.

Skips: the helm chart tests need the helm binary that ``scripts/install-helm`` puts in
``.tools/bin``; without it they are skipped with that reason instead of failing.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

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
)

# Fixtures that start a real process or a Prometheus server.
SLOW_FIXTURES = frozenset({"start_exporter", "live_stack"})


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


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_helm = None
    if not (HELM.is_file() and os.access(HELM, os.X_OK)):
        no_helm = pytest.mark.skip(
            reason=f"no helm binary at {HELM.relative_to(ROOT)}: run `bash scripts/install-helm`"
        )
    for item in items:
        if is_slow(item) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
        if no_helm is not None and _relative_id(item).startswith("helm/"):
            item.add_marker(no_helm)
