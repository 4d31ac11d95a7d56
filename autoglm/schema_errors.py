"""How a pydantic ValidationError becomes the one line a user reads.

Every component's settings (dataclasses validated by pydantic) and the GPUAutoscaler spec (a
pydantic model) are checked by pydantic, and a bad value must still end in one line that names
the field, the problem and the fix (``--gpus: 'many' is not a whole number; give an integer such
as 1``, ``spec.maxReplicas: must be >= 1, got 0``). pydantic's own text ("Input should be a valid
integer, unable to parse string as an integer") names no field the user wrote, says nothing of
what would do, and lists every error at once; this module words the first one, naming the field
the way the caller's users spell it (a flag, a key of a settings file, or a path into a custom
resource).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable
from typing import Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    PlainValidator,
    TypeAdapter,
    ValidationError,
    WrapValidator,
)
from pydantic_core import ErrorDetails, PydanticUndefined

Location = tuple[int | str, ...]


def first_error_line(
    exc: ValidationError,
    model: type,
    name: Callable[[Location], str],
    sentence: bool = False,
) -> str:
    """``name(loc): problem`` for the first error in ``exc``; a message raised by a validator
    as a ValueError (a :class:`~autoglm.config.ConfigError`, a spec error) is kept as it is.

    With ``sentence``, a bound reads as one (``--interval must be > 0, got 0``), as the
    components' hand-written checks always have.
    """
    error = exc.errors(include_url=False)[0]
    raised = error.get("ctx", {}).get("error")
    if error["type"] == "value_error" and isinstance(raised, ValueError):
        # A check in ``__post_init__`` names its fields itself; one on a field is placed.
        where = name(tuple(error["loc"])) if error["loc"] else ""
        return f"{where}: {raised}" if where else str(raised)
    where, text = name(tuple(error["loc"])), problem(error, model)
    if not where:
        return text
    return f"{where} {text}" if sentence and text.startswith("must ") else f"{where}: {text}"


def problem(error: ErrorDetails, model: type) -> str:
    """What is wrong with the value and what is accepted, without the field's name."""
    kind, raw, ctx = error["type"], error["input"], error.get("ctx", {})
    loc = tuple(error["loc"])
    annotation = annotation_at(model, loc)
    if kind == "missing":
        return "is required"
    if kind == "extra_forbidden":
        known = ", ".join(field_names(annotation_at(model, loc[:-1])))
        return f"unknown field; valid fields are {known}"
    if raw is None and kind.endswith("_type"):
        return "no value given (an empty YAML key); give one or drop the key"
    if kind == "literal_error":
        choices = literal_choices(annotation)
        if choices:
            return f"{raw!r} is not one of {', '.join(choices)}"
    if kind in _NUMBER_ERRORS:
        return not_a_number(raw, annotation, default_at(model, loc), finite=kind == "finite_number")
    if kind in ("bool_parsing", "bool_type"):
        return f"{_shown(raw)} is not true or false; give true or false"
    bounds = {
        "greater_than_equal": (">=", "ge"),
        "greater_than": (">", "gt"),
        "less_than_equal": ("<=", "le"),
        "less_than": ("<", "lt"),
    }
    if kind in bounds:
        op, key = bounds[kind]
        bound = ctx[key]
        return (
            f"must be {op} {bound:g}, got {raw}"
            if isinstance(bound, float)
            else (f"must be {op} {bound}, got {raw}")
        )
    if kind == "string_too_short":
        return f"expected a non-empty string, got {raw!r}"
    if kind == "string_type":
        return f"expected a string, got {raw!r}"
    if kind in ("model_type", "dict_type", "model_attributes_type"):
        return f"expected a mapping, got {raw!r}"
    if kind in ("list_type", "tuple_type"):
        return f"expected a list, got {raw!r}"
    if kind == "too_short":
        return f"must have at least {ctx.get('min_length', 1)} item(s)"
    if kind == "string_pattern_mismatch":
        return f"{raw!r} does not match {ctx.get('pattern')!r}"
    message = str(error["msg"])
    return message[:1].lower() + message[1:]


_NUMBER_ERRORS = {
    "finite_number",
    "int_parsing",
    "int_type",
    "int_from_float",
    "float_parsing",
    "float_type",
}


def not_a_number(raw: Any, annotation: Any, default: Any = None, finite: bool = False) -> str:
    """Why ``raw`` is refused where ``annotation`` (an int or a float type) goes, and a value
    that is accepted there: ``'abc' is not a whole number; give an integer such as 4``.

    pydantic's "valid int" says neither what a valid one looks like nor that ``2.5`` fails for
    being a fraction; the example is the field's default where it has one, so it meets the
    field's bounds too.
    """
    whole = _base(annotation) is int
    example = _example(annotation, default, whole)
    such = "" if example is None else f" such as {example if whole else format(example, 'g')}"
    if whole:
        return f"{_shown(raw)} is not a whole number; give an integer{such}"
    what = "a finite number" if finite else "a number"
    return f"{_shown(raw)} is not {what}; give a number{such}"


def _example(annotation: Any, default: Any, whole: bool) -> int | float | None:
    """``default`` when it is a number ``annotation`` accepts, else a plain one that is."""
    fallbacks: list[Any] = [4, 1] if whole else [0.5, 1.0]
    for candidate in [default, *fallbacks]:
        if isinstance(candidate, bool) or not isinstance(candidate, int | float):
            continue
        if whole and not isinstance(candidate, int):
            continue
        if annotation is None:
            return candidate
        try:
            TypeAdapter(annotation).validate_python(candidate)
        except ValidationError:
            continue
        return candidate
    return None


def _shown(raw: Any) -> str:
    """``raw`` as the user wrote it: ``true`` for a YAML boolean, quoted text, a number."""
    return str(raw).lower() if isinstance(raw, bool) else repr(raw)


def bool_for_number(model: type, value: Any, loc: Location = ()) -> Location | None:
    """Where in ``value`` (settings of ``model``: mappings and lists, as YAML reads them) a
    boolean is given for a number, or None.

    pydantic reads ``true`` as 1 for an int or a float (bool is an int in Python), so
    ``workers: true`` or a target's ``horizons: [true]`` would be accepted without a word.
    """
    if isinstance(value, bool):
        annotation = annotation_at(model, loc)
        number = _base(annotation) in (int, float) and not _reads_itself(annotation)
        return loc if loc and number else None
    steps: Any = ()
    if isinstance(value, dict):
        steps = value.items()
    elif isinstance(value, list | tuple):
        steps = enumerate(value)
    for step, item in steps:
        if isinstance(step, int | str):
            found = bool_for_number(model, item, (*loc, step))
            if found is not None:
                return found
    return None


def _reads_itself(annotation: Any) -> bool:
    """Whether ``annotation`` parses its input with a validator of its own (a duration's
    ``15m``), which refuses a boolean in its own words."""
    while typing.get_origin(annotation) is typing.Annotated:
        base, *metadata = typing.get_args(annotation)
        if any(isinstance(m, BeforeValidator | PlainValidator | WrapValidator) for m in metadata):
            return True
        annotation = base
    return False


def default_at(model: type, loc: Location) -> Any:
    """The default of the field at ``loc`` in a model or a dataclass, or None where it has
    none (a required field, a list's item)."""
    if not loc or not isinstance(loc[-1], str):
        return None
    owner = _unwrap(annotation_at(model, loc[:-1]))
    if isinstance(owner, type) and issubclass(owner, BaseModel):
        for name, info in owner.model_fields.items():
            if loc[-1] in (name, info.alias):
                default = info.get_default(call_default_factory=True)
                return None if default is PydanticUndefined else default
    elif isinstance(owner, type) and dataclasses.is_dataclass(owner):
        for f in dataclasses.fields(owner):
            if f.name == loc[-1]:
                if f.default is not dataclasses.MISSING:
                    return f.default
                if f.default_factory is not dataclasses.MISSING:
                    return f.default_factory()
    return None


def annotation_at(model: type, loc: Location) -> Any:
    """The annotation of the field at ``loc`` (field names or aliases, list indexes) in a model
    or a dataclass, or None where the location leaves them (a dict's keys, a union's tag)."""
    kind: Any = model
    for step in loc:
        kind = _unwrap(kind)
        if isinstance(step, int):
            args = typing.get_args(kind)
            if typing.get_origin(kind) in (list, tuple) and args:
                kind = args[0]
                continue
            return None
        kind = _annotations(kind).get(step)
        if kind is None:
            return None
    return kind


def field_names(model: Any) -> list[str]:
    """The names a user writes for ``model``'s fields (aliases where set), sorted."""
    return sorted(_annotations(_unwrap(model)))


def _annotations(model: Any) -> dict[str, Any]:
    """Field name (or alias) to annotation, for a pydantic model or a dataclass."""
    if isinstance(model, type) and issubclass(model, BaseModel):
        # pydantic keeps a field's constraints and validators apart from its annotation.
        return {
            f.alias or n: typing.Annotated[(f.annotation, *f.metadata)]
            if f.metadata
            else f.annotation
            for n, f in model.model_fields.items()
        }
    if isinstance(model, type) and dataclasses.is_dataclass(model):
        hints = typing.get_type_hints(model, include_extras=True)
        return {f.name: hints[f.name] for f in dataclasses.fields(model) if f.init}
    return {}


def literal_choices(annotation: Any) -> list[str]:
    """The values a Literal (or an optional one) allows, as text."""
    annotation = _unwrap(annotation)
    if typing.get_origin(annotation) is typing.Literal:
        return [str(a) for a in typing.get_args(annotation)]
    return []


def _unwrap(kind: Any) -> Any:
    """``X`` for ``X | None`` and for ``Annotated[X, ...]``."""
    while True:
        if typing.get_origin(kind) is typing.Annotated:
            kind = typing.get_args(kind)[0]
            continue
        if typing.get_origin(kind) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(kind) if a is not type(None)]
            if len(args) == 1:
                kind = args[0]
                continue
        return kind


def _base(kind: Any) -> Any:
    kind = _unwrap(kind)
    return typing.get_origin(kind) or kind
