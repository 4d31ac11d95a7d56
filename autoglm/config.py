"""One way to configure every component: CLI flags that mirror a YAML file.

A component describes its settings once, as a dataclass whose fields carry help text in their
metadata, bounds in pydantic ``Field`` constraints on their types (``Annotated[float,
Field(gt=0)]``), and checks that join fields in ``__post_init__``, raising :class:`ConfigError`.
From that single description this module builds the argparse flags (``field_name`` becomes
``--field-name``), reads an optional ``--config FILE`` whose keys are the same names, merges
defaults < file < flags and validates the result with pydantic (types, bounds, finite numbers),
so the same schema also yields the JSON schema the Helm chart's values are tested against.
Anything wrong -- an unknown key, a value of the wrong type, a failed validation -- ends the
process with one line naming the flag, the problem and what is accepted, and exit code 2, before
any work starts (:mod:`autoglm.schema_errors` words pydantic's errors).

``__post_init__`` starts with :func:`check_fields`, so settings built directly in code are
held to the same bounds, with the same message; only the loading path converts text.

Example::

    @dataclass(frozen=True)
    class ExporterConfig:
        listen: str = field(default=":9400", metadata={"help": "HOST:PORT to serve on"})
        interval: Annotated[float, Field(gt=0)] = field(
            default=1.0, metadata={"help": "seconds between collections"}
        )
        deadline: float = field(default=0.5, metadata={"help": "seconds a collection waits"})

        def __post_init__(self) -> None:
            check_fields(self)
            if self.deadline > self.interval:
                raise ConfigError("--deadline must not be longer than --interval")

    cfg = load_config(ExporterConfig, argv, prog="autoglm-exporter")
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import math
import re
import socket
import sys
import types
import typing
from collections.abc import Sequence
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import yaml
from pydantic import ConfigDict, TypeAdapter, ValidationError, with_config

from autoglm.schema_errors import (
    Location,
    annotation_at,
    bool_for_number,
    default_at,
    first_error_line,
    not_a_number,
)
from autoglm.settings_yaml import parse_settings_yaml, yaml_problem
from autoglm.version import add_version_argument

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

# A settings class is a dataclass: its fields are the flags and the file's keys.
T = TypeVar("T", bound="DataclassInstance")

EXIT_USAGE = 2

# How every settings dataclass is validated unless it declares its own ``__pydantic_config__``:
# no NaN or infinity (they pass every ``>`` check), and a number where text goes is that text
# (``model: 7`` in YAML).
SETTINGS_CONFIG = ConfigDict(allow_inf_nan=False, coerce_numbers_to_str=True)


class ConfigError(ValueError):
    """A setting is wrong; the message names it and says how to fix it."""


class OneLineErrorParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line (no usage dump), like every other bad setting."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message}; see --help", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def add_config_arguments(parser: argparse.ArgumentParser, cls: type) -> None:
    """Add ``--config``, ``--version`` and one flag per dataclass field to ``parser``.

    Flags default to ``None`` so that :func:`config_from_args` can tell what was given on the
    command line from what should come from the file or the dataclass default.
    """
    add_version_argument(parser)
    parser.add_argument(
        "--config",
        metavar="FILE",
        help="YAML file with the same keys as the flags (flags win over the file)",
    )
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if not f.init or f.metadata.get("cli") is False:
            continue
        flag = "--" + f.name.replace("_", "-")
        kind = hints[f.name]
        help_text = f.metadata.get("help", "")
        default = _default_of(f)
        if default not in (None, "", [], {}, ()):
            help_text = f"{help_text} (default: {default})"
        choices = _literal_choices(kind)
        if _base_type(kind) is bool:
            parser.add_argument(
                flag,
                dest=f.name,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_text,
            )
        elif _base_type(kind) is list:
            parser.add_argument(
                flag,
                dest=f.name,
                action="append",
                default=None,
                metavar="VALUE",
                help=help_text + " (repeatable)",
            )
        else:
            parser.add_argument(
                flag,
                dest=f.name,
                default=None,
                choices=choices,
                metavar=None if choices else f.metadata.get("metavar", f.name.upper()),
                help=help_text,
            )


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Merge defaults < YAML file < flags into ``cls``; raise :class:`ConfigError` on a problem."""
    values: dict[str, Any] = {}
    path = getattr(args, "config", None)
    if path:
        values.update(read_yaml_mapping(path, cls))
    from_file = set(values)
    for f in dataclasses.fields(cls):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = given
            from_file.discard(f.name)
    return build_config(cls, values, source=path or "flags", from_file=from_file)


def build_config(
    cls: type[T],
    values: dict[str, Any],
    source: str = "config",
    from_file: AbstractSet[str] = frozenset(),
) -> T:
    """Validate raw values (flag strings, YAML scalars) into ``cls`` with pydantic; a problem is
    a :class:`ConfigError` naming the flag, or the file ``source`` and its key for a setting in
    ``from_file`` (a user looking for ``--workers`` on a command line that has none would not
    find what to fix)."""
    hints = typing.get_type_hints(cls)
    known = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(values) - known)
    if unknown:
        raise ConfigError(
            f"{source}: unknown setting {unknown[0]!r}; "
            f"valid settings are: {', '.join(sorted(known))}"
        )
    name = functools.partial(_setting_at, source, from_file)
    prepared = {
        key: [raw] if _base_type(hints[key]) is list and not isinstance(raw, list) else raw
        for key, raw in values.items()
    }
    # pydantic reads true as 1 for a number (bool is an int in Python): `workers: true`
    # would start one worker without a word, a target's `horizons: [true]` forecast 1 step.
    loc = bool_for_number(cls, prepared)
    if loc is not None:
        raw = _value_at(prepared, loc)
        text = not_a_number(raw, annotation_at(cls, loc), default_at(cls, loc))
        raise ConfigError(f"{name(loc)}: {text}")
    try:
        return _adapter(cls).validate_python(prepared)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        raised = first.get("ctx", {}).get("error")
        if not first["loc"] and isinstance(raised, ValueError):
            # From __post_init__: a check that joins fields names them as flags.
            line = _as_file_keys(str(raised), source, from_file)
            if type(raised) is ValueError and line == str(raised):
                line = f"{source}: {line}"
            raise ConfigError(line) from None
        line = first_error_line(exc, cls, name, sentence=True)
        loc = tuple(first["loc"])
        if len(loc) == 1:
            line += _default_hint(cls, str(loc[0]), exc, loc[0] in from_file)
        raise ConfigError(line) from None
    except TypeError as exc:
        raise ConfigError(f"{source}: {exc}") from exc


def _setting_at(source: str, from_file: AbstractSet[str], loc: Location) -> str:
    """How the user wrote the setting at ``loc``: ``--workers`` on the command line,
    ``batcher.yaml: workers`` (or ``predictor.yaml: targets[0].step``) in the file."""
    if loc and loc[0] in from_file:
        return f"{source}: {yaml_path(loc)}"
    return _flag_at(loc)


_FLAG = re.compile(r"--([a-z0-9][a-z0-9-]*)(?![\w-])")


def _as_file_keys(message: str, source: str, from_file: AbstractSet[str]) -> str:
    """``message`` (a check joining fields, which names them as flags) with the flags whose
    values came from the file ``source`` written as its keys, after the file's name:
    ``up.yaml: max_workers 2 is below min_workers 3``; unchanged when none did."""

    def key(match: re.Match[str]) -> str:
        name = match.group(1).replace("-", "_")
        return name if name in from_file else match.group(0)

    rewritten = _FLAG.sub(key, message)
    return message if rewritten == message else f"{source}: {rewritten}"


def _value_at(values: Any, loc: Location) -> Any:
    for step in loc:
        values = values[step]
    return values


@functools.cache
def _adapter(cls: type[T]) -> TypeAdapter[T]:
    if "__pydantic_config__" not in vars(cls):
        with_config(SETTINGS_CONFIG)(cls)
    return TypeAdapter(cls)


def settings_json_schema(cls: type) -> dict[str, Any]:
    """``cls``'s settings as JSON Schema (types, bounds, choices, defaults), the help text as
    each property's description: what the Helm chart's values schema is tested against."""
    schema = _adapter(cls).json_schema()
    for f in dataclasses.fields(cls):
        prop = schema.get("properties", {}).get(f.name)
        if prop is not None and f.metadata.get("help"):
            prop["description"] = f.metadata["help"]
    return schema


def check_fields(settings: DataclassInstance) -> None:
    """:class:`ConfigError` when a field of ``settings`` breaks its ``Field`` constraints.

    Called first in a settings dataclass's ``__post_init__``, so settings built in code (the
    local stack, tests, a library caller) are held to the bounds that loading enforces, with
    the same message.
    """
    cls = type(settings)
    for name, adapter in _constrained_fields(cls).items():
        try:
            adapter.validate_python(getattr(settings, name))
        except ValidationError as exc:
            where = functools.partial(_field_flag_at, name)
            line = first_error_line(exc, _constrained_hints(cls)[name], where, sentence=True)
            raise ConfigError(line + _default_hint(cls, name, exc)) from None


@functools.cache
def _constrained_hints(cls: type) -> dict[str, Any]:
    """The fields whose type carries pydantic constraints (``Annotated[float, Field(gt=0)]``)."""
    extras = typing.get_type_hints(cls, include_extras=True)
    plain = typing.get_type_hints(cls)
    return {n: extras[n] for n in plain if extras[n] != plain[n]}


@functools.cache
def _constrained_fields(cls: type) -> dict[str, TypeAdapter[Any]]:
    return {
        name: TypeAdapter(hint, config=SETTINGS_CONFIG)
        for name, hint in _constrained_hints(cls).items()
    }


_BOUND_ERRORS = {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}


def _default_hint(cls: type, name: str, exc: ValidationError, in_file: bool = False) -> str:
    """`` (default: --interval 15)`` after a bound's error: a value that is accepted;
    `` (default: 15)`` for a setting from a file, whose key the line already names."""
    error = exc.errors(include_url=False)[0]
    if error["type"] not in _BOUND_ERRORS:
        return ""
    field = next((f for f in dataclasses.fields(cls) if f.name == name), None)
    default = None if field is None else _default_of(field)
    if default in (None, "", [], {}, ()):
        return ""
    shown = f"{default:g}" if isinstance(default, float) else str(default)
    return f" (default: {shown})" if in_file else f" (default: {_flag_at((name,))} {shown})"


def _field_flag_at(name: str, loc: Location) -> str:
    return _flag_at((name, *loc))


def _flag_at(loc: Location) -> str:
    """``--interval`` for ``("interval",)`` and ``--weights`` for ``("weights", 1)``; inside a
    mapping (a file-only list of them), the path a YAML file spells: ``targets[0].horizons``."""
    if all(isinstance(step, int) for step in loc[1:]):
        return "--" + str(loc[0]).replace("_", "-")
    return yaml_path(loc)


def yaml_path(loc: Location) -> str:
    """``targets[0].horizons`` for ``("targets", 0, "horizons")``."""
    path = ""
    for step in loc:
        path += f"[{step}]" if isinstance(step, int) else f".{step}" if path else str(step)
    return path


def read_yaml_file(path: str | Path, what: str) -> Any:
    """The parsed YAML in ``path``; ConfigError naming ``what`` ("spec file") when the file
    cannot be read or is not YAML."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {str(p)!r}: {exc.strerror}") from exc
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{what} {str(p)!r} is not text (YAML is UTF-8 text)") from exc
    except ValueError as exc:  # a NUL byte in the path
        raise ConfigError(f"cannot read {what} {str(p)!r}: {exc}") from exc
    try:
        return parse_settings_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{what} {str(p)!r} is not valid YAML: {yaml_problem(exc)}") from exc


def read_yaml_mapping(path: str | Path, cls: type | None = None) -> dict[str, Any]:
    """Read a YAML file that must hold a mapping; keys may use dashes or underscores."""
    p = Path(path)
    data = read_yaml_file(p, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(p)!r} must hold a mapping of setting: value")
    return {str(k).replace("-", "_"): v for k, v in data.items()}


def load_config(cls: type[T], argv: Sequence[str] | None, prog: str, description: str = "") -> T:
    """Parse ``argv`` into ``cls``; on any problem print one line and exit with code 2."""
    parser = OneLineErrorParser(prog=prog, description=description)
    add_config_arguments(parser, cls)
    args = parser.parse_args(argv)
    return config_or_exit(cls, args, prog)


def config_or_exit(cls: type[T], args: argparse.Namespace, prog: str) -> T:
    """:func:`config_from_args`, turning a :class:`ConfigError` into one line and exit code 2."""
    try:
        return config_from_args(cls, args)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE) from None


def _default_of(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _unwrap_optional(kind: Any) -> Any:
    if typing.get_origin(kind) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        if len(args) == 1:
            return args[0]
    return kind


def _base_type(kind: Any) -> Any:
    kind = _unwrap_optional(kind)
    if typing.get_origin(kind) is typing.Literal:
        return type(typing.get_args(kind)[0])
    return typing.get_origin(kind) or kind


def _literal_choices(kind: Any) -> list[str] | None:
    kind = _unwrap_optional(kind)
    if typing.get_origin(kind) is typing.Literal:
        return [str(a) for a in typing.get_args(kind)]
    return None


def finite_float(raw: Any, flag: str = "value") -> float:
    """``raw`` as a float; :class:`ConfigError` for NaN and infinities, which no setting means.

    ``float()`` accepts ``nan``, ``inf`` and ``1e999``; passed on, they slip through every ``>``
    and ``<`` check (NaN compares false both ways) and surface later as a wrong decision or a
    traceback. Also an argparse ``type=`` for flags outside a config dataclass.
    """
    value = float(raw)
    if not math.isfinite(value):
        raise ConfigError(f"{flag}: {raw!r} is not a finite number; give a number such as 0.5")
    return value


def finite_float_argument(flag: str) -> Any:
    """An argparse ``type=`` reading a finite float, whose errors name ``flag``."""

    def parse(text: str) -> float:
        try:
            return finite_float(text, flag)
        except ConfigError as exc:
            raise argparse.ArgumentTypeError(str(exc).removeprefix(f"{flag}: ")) from None
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None

    return parse


def parse_listen(value: str, default_host: str = "0.0.0.0") -> tuple[str, int]:
    """Parse ``HOST:PORT`` (``:PORT`` means all interfaces; ``[::1]:PORT`` for IPv6)."""
    host, sep, port = value.rpartition(":")
    if not sep or not (port.isascii() and port.isdigit()) or not 0 <= int(port) <= 65535:
        raise ConfigError(
            f"listen address {value!r} must be HOST:PORT, e.g. :9400 or 127.0.0.1:9400"
        )
    host = host.strip("[]") or default_host
    return host, int(port)


def check_can_listen(listen: str, flag: str = "--listen") -> None:
    """:class:`ConfigError` when ``listen`` (``HOST:PORT``) cannot be bound now.

    Run before slow start-up work (loading a model, warming it up), so a port another process
    holds costs one line at once instead of a failure minutes later. The port is released again
    at once; a process that takes it in between is still caught when the server binds.
    """
    host, port = parse_listen(listen)
    try:  # port 0 too: the host must still resolve to an address of this machine
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (OSError, UnicodeError, ValueError) as exc:
        raise ConfigError(f"{flag} {listen!r}: cannot resolve host {host!r}") from exc
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
        except OSError as exc:
            raise ConfigError(
                f"{flag} {listen!r}: cannot listen there ({exc.strerror}); another process may "
                f"hold the port: stop it or choose another {flag}"
            ) from exc
