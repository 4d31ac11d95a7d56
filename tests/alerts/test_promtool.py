"""The rules file checked and unit-tested by the real promtool, plus completeness checks.

promtool parses every expression and runs the unit tests in ``alerts/tests/``; the checks here make
sure no alert escapes that: each one has a firing case with expected labels and annotations, a
case where it must stay quiet, the annotations on-call needs, and a runbook section to land on.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dashboards.runbooks import RUNBOOK_BASE_URL, runbook_url

pytestmark = pytest.mark.live  # runs the real promtool/prometheus binaries

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "alerts" / "rules.yaml"
TEST_FILES = sorted((ROOT / "alerts" / "tests").glob("*.yaml"))
RUNBOOKS = ROOT / "docs" / "runbooks.md"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
SEVERITIES = {"critical", "warning", "info"}
RECORD_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*:[a-zA-Z0-9_]+:[a-zA-Z0-9_]+$")


def _rules() -> list[dict]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


ALERTS = [rule for rule in _rules() if "alert" in rule]
RECORDS = [rule for rule in _rules() if "record" in rule]


def _alert_cases() -> list[dict]:
    cases = []
    for path in TEST_FILES:
        for test in yaml.safe_load(path.read_text())["tests"]:
            cases.extend(test.get("alert_rule_test", []))
    return cases


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PROMTOOL, *args], capture_output=True, text=True, timeout=240, cwd=ROOT, check=False
    )


def test_rules_file_passes_promtool_check() -> None:
    result = _promtool("check", "rules", str(RULES))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS) + len(RECORDS)} rules found" in result.stdout


def test_unit_tests_pass_in_promtool() -> None:
    assert TEST_FILES, "no promtool test files in alerts/tests"
    result = _promtool("test", "rules", *map(str, TEST_FILES))
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_unit_tests_can_fail(tmp_path: Path) -> None:
    """Guards the harness: a wrong expected annotation must make promtool fail."""
    (tmp_path / "tests").mkdir()
    shutil.copy(RULES, tmp_path / "rules.yaml")
    original = (ROOT / "alerts" / "tests" / "exporter.yaml").read_text()
    broken = original.replace("serves data 2m 45s old.", "serves data 2m 44s old.", 1)
    assert broken != original
    (tmp_path / "tests" / "exporter.yaml").write_text(broken)
    result = _promtool("test", "rules", str(tmp_path / "tests" / "exporter.yaml"))
    assert result.returncode != 0
    assert "AutoglmExporterSnapshotStale" in result.stdout + result.stderr


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_alert_has_severity_annotations_and_runbook(alert: dict) -> None:
    assert alert["labels"]["severity"] in SEVERITIES
    annotations = alert["annotations"]
    assert set(annotations) >= {"summary", "description", "runbook_url"}
    assert annotations["summary"].strip() and annotations["description"].strip()
    assert annotations["runbook_url"] == runbook_url(alert["alert"])
    assert annotations["runbook_url"].startswith(RUNBOOK_BASE_URL + "#")
    # a description that carries no value or label tells on-call nothing they can act on
    assert "{{" in annotations["description"]


def test_every_alert_has_a_runbook_section_and_every_section_an_alert() -> None:
    headings = re.findall(r"^## (\S+)\s*$", RUNBOOKS.read_text(), flags=re.MULTILINE)
    anchors = {h.lower() for h in headings}
    for alert in ALERTS:
        anchor = alert["annotations"]["runbook_url"].rsplit("#", 1)[1]
        assert anchor in anchors, f"docs/runbooks.md has no section '## {alert['alert']}'"
    assert anchors == {a["alert"].lower() for a in ALERTS}, "runbook sections without an alert"


@pytest.mark.parametrize("alert", ALERTS, ids=[a["alert"] for a in ALERTS])
def test_every_alert_has_firing_and_quiet_unit_tests(alert: dict) -> None:
    cases = [c for c in _alert_cases() if c["alertname"] == alert["alert"]]
    firing = [c for c in cases if c.get("exp_alerts")]
    quiet = [c for c in cases if c.get("exp_alerts") == []]
    assert firing, f"{alert['alert']}: no promtool case where it fires"
    assert quiet, f"{alert['alert']}: no promtool case where it must stay quiet"
    for case in firing:
        for expected in case["exp_alerts"]:
            assert expected.get("exp_labels", {}).get("severity") == alert["labels"]["severity"]
            assert set(expected.get("exp_annotations", {})) == set(alert["annotations"])


def test_recording_rules_follow_level_metric_operations() -> None:
    for rule in RECORDS:
        assert RECORD_NAME.match(rule["record"]), rule["record"]


def test_alert_names_are_unique() -> None:
    names = [a["alert"] for a in ALERTS]
    assert len(names) == len(set(names))
