"""Reading a web config file: YAML in the exporter-toolkit format, validated into :class:`Settings`.

An unknown key, a hash that is not bcrypt, a header exporter-toolkit does not let a config set
-- each is a :class:`~autoglm.config.ConfigError` that names the key and says how to fix it.
``rate_limit`` is refused (rate-limit in a proxy in front); ``http_server_config.http2`` is
accepted, but the servers speak HTTP/1.1. The TLS block is :mod:`autoglm.webconfig.tls`'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from autoglm.config import ConfigError
from autoglm.webconfig.basic_auth import BCRYPT_HASH
from autoglm.webconfig.sections import mapping, reject_unknown
from autoglm.webconfig.tls import TLSSettings, load_tls

_TOP_LEVEL_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}
_HTTP_KEYS = {"http2", "headers"}

# Headers exporter-toolkit lets a config set, with the values it accepts (None: any string).
_ALLOWED_HEADERS: dict[str, set[str] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": {"deny", "sameorigin"},
    "X-Content-Type-Options": {"nosniff"},
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}


@dataclass(frozen=True)
class Settings:
    """One validated state of the file; replaced whole on reload, so readers never see a mix."""

    tls: TLSSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


def read_settings(p: Path) -> Settings:
    """Read and validate the web config file at ``p``."""
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(
            f"web config {str(p)!r}: cannot read it ({exc.strerror}); "
            "check the path given to --web-config-file"
        ) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"web config {str(p)!r} is not valid YAML: {exc}") from exc
    return settings_from_mapping(data or {}, base_dir=p.parent, source=str(p))


def settings_from_mapping(
    data: Any, base_dir: Path | None = None, source: str = "web config"
) -> Settings:
    """Validate an already parsed web config; relative file names resolve from ``base_dir``."""
    where = f"web config {source!r}" if source != "web config" else source
    section = mapping(data, where, "the file")
    reject_unknown(section, _TOP_LEVEL_KEYS, where, "")
    if "rate_limit" in section:
        raise ConfigError(
            f"{where}: rate_limit is not supported by this server; remove it "
            "(rate-limit in a proxy in front if you need it)"
        )
    base = base_dir or Path.cwd()
    tls = None
    if section.get("tls_server_config") is not None:
        tls = load_tls(
            mapping(section["tls_server_config"], where, "tls_server_config"), base, where
        )
    headers: dict[str, str] = {}
    if section.get("http_server_config") is not None:
        headers = _load_http(
            mapping(section["http_server_config"], where, "http_server_config"), where
        )
    users: dict[str, bytes] = {}
    if section.get("basic_auth_users") is not None:
        users = _load_users(mapping(section["basic_auth_users"], where, "basic_auth_users"), where)
    return Settings(tls=tls, users=users, headers=headers)


def _load_http(section: dict[str, Any], where: str) -> dict[str, str]:
    prefix = "http_server_config."
    reject_unknown(section, _HTTP_KEYS, where, prefix)
    http2 = section.get("http2", True)
    if not isinstance(http2, bool):
        raise ConfigError(f"{where}: {prefix}http2 must be true or false")
    headers_in = section.get("headers") or {}
    if not isinstance(headers_in, dict):
        raise ConfigError(f"{where}: {prefix}headers must be a mapping of header: value")
    headers: dict[str, str] = {}
    lowered = {name.lower(): name for name in _ALLOWED_HEADERS}
    for name, value in headers_in.items():
        canonical = lowered.get(str(name).lower())
        if canonical is None:
            raise ConfigError(
                f"{where}: {prefix}headers.{name} cannot be set; allowed headers are: "
                + ", ".join(_ALLOWED_HEADERS)
            )
        if value is None or value == "":
            continue
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise ConfigError(f"{where}: {prefix}headers.{name} must be a one-line string")
        accepted = _ALLOWED_HEADERS[canonical]
        if accepted is not None and value.lower() not in accepted:
            raise ConfigError(
                f"{where}: {prefix}headers.{name} {value!r} is not one of "
                + ", ".join(sorted(accepted))
            )
        headers[canonical] = value
    return headers


def _load_users(section: dict[str, Any], where: str) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(
                f"{where}: basic_auth_users: user name {user!r} must be a non-empty string "
                "without ':'"
            )
        match = BCRYPT_HASH.match(hashed) if isinstance(hashed, str) else None
        if match is None or not 4 <= int(match.group(1)) <= 31:
            raise ConfigError(
                f"{where}: basic_auth_users.{user} is not a bcrypt hash; make one with "
                "`htpasswd -nBC 10 \"\" | tr -d ':\\n'` or "
                "`python -c 'import bcrypt,getpass; "
                "print(bcrypt.hashpw(getpass.getpass().encode(), bcrypt.gensalt()).decode())'`"
            )
        users[user] = hashed.encode()
    return users
