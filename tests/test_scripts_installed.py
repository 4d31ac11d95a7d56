"""scripts/installed.py: when `scripts/test` may skip pip, and why it may not."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def installed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The script as a module, its stamp in ``tmp_path`` and its pyproject.toml a copy there."""
    spec = importlib.util.spec_from_file_location("installed", ROOT / "scripts" / "installed.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text((ROOT / "pyproject.toml").read_text())
    monkeypatch.setattr(module, "PYPROJECT", pyproject)
    monkeypatch.setattr(module, "STAMP", tmp_path / ".tools" / "installed.json")
    monkeypatch.setattr(module, "ROOT", tmp_path)
    return module


def _add_test_requirement(module: ModuleType, line: str) -> None:
    text = module.PYPROJECT.read_text()
    module.PYPROJECT.write_text(text.replace("test = [\n", f"test = [\n    {line!r},\n", 1))


def test_without_a_stamp_pip_runs(installed: ModuleType, capsys: pytest.CaptureFixture) -> None:
    assert installed.main([]) == 1
    assert "no install recorded" in capsys.readouterr().err


def test_a_changed_pyproject_or_interpreter_voids_the_stamp(
    installed: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert installed.main(["--stamp"]) == 0
    _add_test_requirement(installed, "pytest>=1")
    assert "pyproject.toml or the interpreter changed" in installed.reason_to_install()
    installed.main(["--stamp"])
    monkeypatch.setattr(sys, "executable", "/elsewhere/bin/python")
    assert "pyproject.toml or the interpreter changed" in installed.reason_to_install()


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("no-such-package-for-autoglm>=1", "not installed: no-such-package-for-autoglm>=1"),
        ("pytest<1", "not installed: pytest<1 (installed: "),
    ],
)
def test_a_missing_or_unacceptable_requirement_makes_pip_run(
    installed: ModuleType, line: str, reason: str
) -> None:
    _add_test_requirement(installed, line)
    installed.main(["--stamp"])
    assert installed.reason_to_install().startswith(reason)


def test_a_requirement_for_another_platform_is_not_asked_for(installed: ModuleType) -> None:
    _add_test_requirement(installed, "no-such-package-for-autoglm; sys_platform == 'beos'")
    assert installed.missing_requirement() is None


def test_an_install_of_another_checkout_makes_pip_run(installed: ModuleType) -> None:
    """The stamp and the requirements hold, but the project is installed from elsewhere: the
    suite's own checkout (or nowhere), not ``tmp_path``."""
    installed.main(["--stamp"])
    assert "not this checkout" in installed.reason_to_install()


def test_anything_but_stamp_is_a_usage_error(installed: ModuleType) -> None:
    assert installed.main(["--force"]) == 2
