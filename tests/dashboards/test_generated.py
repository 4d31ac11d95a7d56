"""The committed dashboard JSON is exactly what the Python code generates."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from dashboards.catalogue import DASHBOARDS
from dashboards.output import JSON_DIR, compare_all, render_all

ROOT = Path(__file__).resolve().parents[2]


def test_committed_json_matches_the_code() -> None:
    differences = compare_all(JSON_DIR)
    assert differences == [], f"{differences}: run python -m dashboards and commit the JSON"


def test_generation_is_deterministic() -> None:
    assert render_all() == render_all()
    assert sorted(render_all()) == sorted(e.filename for e in DASHBOARDS)


def _generator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "dashboards", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_check_mode_fails_on_a_stale_file_and_writing_fixes_it(tmp_path: Path) -> None:
    out = tmp_path / "json"
    shutil.copytree(JSON_DIR, out)
    assert _generator("--check", "--out-dir", str(out)).returncode == 0

    stale = out / DASHBOARDS[0].filename
    stale.write_text(stale.read_text().replace('"title": ', '"title": "x', 1))
    (out / "left-over.json").write_text("{}")
    result = _generator("--check", "--out-dir", str(out))
    assert result.returncode == 1
    assert f"{stale}: differs" in result.stderr
    assert "left-over.json: not generated" in result.stderr
    assert "python -m dashboards" in result.stderr

    (out / "left-over.json").unlink()
    assert _generator("--out-dir", str(out)).returncode == 0
    assert _generator("--check", "--out-dir", str(out)).returncode == 0
