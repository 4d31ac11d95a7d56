"""``autoglm <component>``: the umbrella command reaches every component's own CLI."""

from __future__ import annotations

import importlib

import pytest

from autoglm.cli import COMPONENTS, main
from autoglm.version import package_version


def test_every_component_module_has_a_main():
    for name, (module, _) in COMPONENTS.items():
        assert callable(importlib.import_module(module).main), name


def test_no_arguments_lists_components_and_is_a_usage_error(capsys):
    assert main([]) == 2
    out = capsys.readouterr().out
    for name in COMPONENTS:
        assert f"  {name} " in out


def test_unknown_component_names_the_choices(capsys):
    assert main(["exportr"]) == 2
    err = capsys.readouterr().err
    assert "unknown component 'exportr'" in err and "exporter" in err


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_bad_flag_reaches_the_component_and_exits_2(name, capsys):
    with pytest.raises(SystemExit) as exc:
        code = main([name, "--definitely-not-a-flag"])
        raise SystemExit(code)
    assert exc.value.code == 2
    assert "--definitely-not-a-flag" in capsys.readouterr().err


def test_version_is_the_installed_package_version(capsys):
    assert main(["--version"]) == 0
    assert capsys.readouterr().out == f"autoglm {package_version()}\n"


def test_help_lists_components_and_the_version_flag(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "autoglm --version" in out and "--help" in out


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_every_component_answers_version(name, capsys):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main([name, "--version"]))
    assert exc.value.code == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("autoglm") and out.endswith(package_version())
