"""Reading one section of a web config: its type, its known keys, its string values, its paths.

Every message names the file and the key (``tls_server_config.cert_file``) so a typo is found
from the error alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autoglm.config import ConfigError


def reject_unknown(section: Mapping[str, Any], known: set[str], where: str, prefix: str) -> None:
    """A ConfigError for the first key of ``section`` not in ``known``, listing the valid ones."""
    for key in section:
        if key not in known:
            raise ConfigError(
                f"{where}: unknown key {prefix}{key!s}; valid keys are: "
                + ", ".join(prefix + k for k in sorted(known))
            )


def optional_string(section: Mapping[str, Any], key: str, where: str, prefix: str) -> str | None:
    """The string at ``key``; None when absent or empty."""
    value = section.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {prefix}{key} must be a string")
    return value


def string_list(section: Mapping[str, Any], key: str, where: str, prefix: str) -> list[str]:
    """The list of strings at ``key``; empty when absent."""
    value = section.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {prefix}{key} must be a list of strings")
    return value


def resolve(base: Path, name: str) -> Path:
    """A file named in the config: relative names start at the config's folder."""
    p = Path(name)
    return p if p.is_absolute() else base / p
