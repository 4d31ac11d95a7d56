"""Reading a web config file: YAML in the exporter-toolkit format, validated into :class:`Settings`.

The file's keys are described once, as pydantic models (:class:`WebConfigFile`): the servers
validate with them and the Helm chart's ``webConfig.config`` schema is tested against their JSON
schema. An unknown key, a hash that is not bcrypt, a header exporter-toolkit does not let a config
set -- each is a :class:`~autoglm.config.ConfigError`, one line that names the YAML path and says
how to fix it. ``rate_limit`` is refused (rate-limit in a proxy in front);
``http_server_config.http2`` is accepted, but the servers speak HTTP/1.1. The TLS block is a
mapping here: what its keys mean (files, versions, client authentication) is checked by
:mod:`autoglm.webconfig.tls`, which needs the files and OpenSSL to do it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
    model_validator,
)

from autoglm.config import ConfigError, yaml_path
from autoglm.schema_errors import annotation_at, field_names, problem
from autoglm.settings_yaml import parse_settings_yaml, yaml_problem
from autoglm.webconfig.tls import TLSSettings, load_tls

# What Go's bcrypt and htpasswd write ($2a$, $2b$, $2y$; $2x$ from old PHP), cost 04 to 31.
BCRYPT_HASH = r"^\$2[abxy]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}$"
_MAKE_A_HASH = (
    "make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'` or "
    "`python -c 'import bcrypt,getpass; "
    "print(bcrypt.hashpw(getpass.getpass().encode(), bcrypt.gensalt()).decode())'`"
)
_SECTION = ConfigDict(extra="forbid", strict=True, frozen=True)


def _explained(message: str) -> Any:
    """A validator that keeps the type's constraints (and so its JSON schema) but words a
    failure as ``message`` rather than as the pattern it missed."""

    def check(value: Any, handler: ValidatorFunctionWrapHandler) -> Any:
        try:
            return handler(value)
        except ValidationError:
            raise ValueError(message.format(value=value)) from None

    return WrapValidator(check)


UserName = Annotated[
    str,
    Field(min_length=1, pattern=r"^[^:]+$"),
    _explained("user name {value!r} must be a non-empty string without ':'"),
]
BcryptHash = Annotated[
    str, Field(pattern=BCRYPT_HASH), _explained("is not a bcrypt hash; " + _MAKE_A_HASH)
]
OneLine = Annotated[str, Field(pattern=r"^[^\r\n]*$"), _explained("must be a one-line string")]


def _lower_case(value: Any) -> Any:
    """Header values compared as HTTP does (``DENY`` is ``deny``); empty means not set."""
    if isinstance(value, str):
        return value.lower() or None
    return value


def _empty_is_unset(value: Any) -> Any:
    return None if value == "" else value


class Headers(BaseModel):
    """The response headers exporter-toolkit lets a config set, with the values it accepts;
    names in any case (``x-frame-options``), an empty value sets nothing."""

    model_config = _SECTION

    content_security_policy: Annotated[OneLine | None, BeforeValidator(_empty_is_unset)] = Field(
        None, alias="Content-Security-Policy"
    )
    x_frame_options: Annotated[
        Literal["deny", "sameorigin"] | None, BeforeValidator(_lower_case)
    ] = Field(None, alias="X-Frame-Options")
    x_content_type_options: Annotated[Literal["nosniff"] | None, BeforeValidator(_lower_case)] = (
        Field(None, alias="X-Content-Type-Options")
    )
    x_xss_protection: Annotated[OneLine | None, BeforeValidator(_empty_is_unset)] = Field(
        None, alias="X-XSS-Protection"
    )
    strict_transport_security: Annotated[OneLine | None, BeforeValidator(_empty_is_unset)] = Field(
        None, alias="Strict-Transport-Security"
    )

    @model_validator(mode="before")
    @classmethod
    def _names_as_http_spells_them(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        canonical = {str(f.alias).lower(): f.alias for f in cls.model_fields.values()}
        return {canonical.get(str(name).lower(), name): value for name, value in data.items()}


class HTTPServerConfig(BaseModel):
    """``http_server_config``: ``http2`` is accepted (the servers speak HTTP/1.1 either way)."""

    model_config = _SECTION

    http2: bool = True
    headers: Headers | None = None


class WebConfigFile(BaseModel):
    """A web config file in the exporter-toolkit format, as the servers read it."""

    model_config = _SECTION

    tls_server_config: dict[str, Any] | None = Field(
        None, description="checked by autoglm.webconfig.tls: files, versions, client auth"
    )
    http_server_config: HTTPServerConfig | None = None
    basic_auth_users: dict[UserName, BcryptHash] | None = Field(
        None, description="user: bcrypt hash ($2y$...)"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_rate_limit(cls, data: Any) -> Any:
        if isinstance(data, dict) and "rate_limit" in data:
            raise ValueError(
                "rate_limit is not supported by this server; remove it "
                "(rate-limit in a proxy in front if you need it)"
            )
        return data


@dataclass(frozen=True)
class Settings:
    """One validated state of the file; replaced whole on reload, so readers never see a mix."""

    tls: TLSSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


def read_settings(p: Path) -> Settings:
    """Read and validate the web config file at ``p``.

    A file without a YAML document (empty, or only comments) is a config that sets nothing:
    plain HTTP without auth, as with exporter-toolkit. Anything else that is not a mapping
    (a list, a lone word, ``false``) is a :class:`~autoglm.config.ConfigError`. Whether a
    running server may take a file is :func:`autoglm.webconfig.loaded.refused_change`'s call.
    """
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(
            f"web config {str(p)!r}: cannot read it ({exc.strerror}); "
            "check the path given to --web-config-file"
        ) from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"web config {str(p)!r} is not UTF-8 text (YAML is UTF-8 text); "
            "give --web-config-file a YAML web config file"
        ) from exc
    except ValueError as exc:  # a NUL byte in the path
        raise ConfigError(f"web config {str(p)!r}: cannot read it ({exc})") from exc
    try:
        data = parse_settings_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"web config {str(p)!r} is not valid YAML: {yaml_problem(exc)}") from exc
    # Only a missing document is an empty config: `false`, `[]` or `0` are not mappings.
    data = {} if data is None else data
    return settings_from_mapping(data, base_dir=p.parent, source=str(p))


def settings_from_mapping(
    data: Any, base_dir: Path | None = None, source: str = "web config"
) -> Settings:
    """Validate an already parsed web config; relative file names resolve from ``base_dir``."""
    where = f"web config {source!r}" if source != "web config" else source
    try:
        parsed = WebConfigFile.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(f"{where}: {error_line(exc)}") from None
    tls = None
    if parsed.tls_server_config is not None:
        tls = load_tls(parsed.tls_server_config, base_dir or Path.cwd(), where)
    http = parsed.http_server_config
    headers = (
        http.headers.model_dump(by_alias=True, exclude_none=True) if http and http.headers else {}
    )
    users = {user: hashed.encode() for user, hashed in (parsed.basic_auth_users or {}).items()}
    return Settings(tls=tls, users=users, headers=headers)


def error_line(exc: ValidationError) -> str:
    """The first error of validating a :class:`WebConfigFile`, as the YAML path and the fix."""
    error = exc.errors(include_url=False)[0]
    loc = tuple(error["loc"])
    if loc[-1:] == ("[key]",):  # a mapping's key is wrong: name the mapping
        loc = loc[:-2]
    path = yaml_path(loc)
    kind = error["type"]
    raised = error.get("ctx", {}).get("error")
    if kind == "extra_forbidden":
        known = field_names(annotation_at(WebConfigFile, loc[:-1]))
        if loc[:-1] == ("http_server_config", "headers"):
            return f"{path} cannot be set; allowed headers are: {', '.join(known)}"
        prefix = path.removesuffix(str(loc[-1]))
        return f"unknown key {path}; valid keys are: " + ", ".join(prefix + k for k in known)
    if kind == "value_error" and isinstance(raised, ValueError):
        text = str(raised)
    elif kind in ("model_type", "model_attributes_type", "dict_type"):
        text = "must be a mapping of key: value"
    elif kind == "bool_type":
        text = "must be true or false"
    else:
        text = problem(error, WebConfigFile)
    if not path:
        return text if kind == "value_error" else f"the file {text}"
    predicate = text.startswith(("is ", "must ", "cannot "))
    return f"{path} {text}" if predicate else f"{path}: {text}"
