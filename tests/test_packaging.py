"""The image builds from the same package list as pip: a package the Dockerfile forgets to copy
installs fine here and breaks only inside the container (as `alerts/` once did for `autoglm up`)."""

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _packaged_top_levels() -> set[str]:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    patterns = pyproject["tool"]["setuptools"]["packages"]["find"]["include"]
    return {pattern.rstrip("*").rstrip(".") for pattern in patterns}


def _copied_into_the_image() -> set[str]:
    dockerfile = (ROOT / "Dockerfile").read_text()
    return set(re.findall(r"^COPY (\w+) \./\1$", dockerfile, flags=re.MULTILINE))


def test_the_image_copies_every_package_pip_installs() -> None:
    packaged = _packaged_top_levels()
    assert packaged, "pyproject.toml lists no packages"
    missing = packaged - _copied_into_the_image()
    assert not missing, f"Dockerfile does not COPY {sorted(missing)} before `pip install .`"


def test_every_copied_folder_is_a_package_pip_installs() -> None:
    extra = _copied_into_the_image() - _packaged_top_levels()
    assert not extra, f"Dockerfile copies {sorted(extra)}, which pyproject.toml does not package"
