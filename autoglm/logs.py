"""Structured log lines shared by every component.

Each record is one JSON object per line (``ts``, ``level``, ``component``, ``msg`` and any
``extra=`` fields), so log pipelines parse them without regexes. ``--log-format text`` gives the
same fields as ``key=value`` for people reading a terminal.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD_ATTRS = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class StructuredFormatter(logging.Formatter):
    """Render a record as JSON (default) or logfmt-like text with its extra fields."""

    def __init__(self, component: str, fmt: str = "json") -> None:
        super().__init__()
        self.component = component
        self.fmt = fmt

    def format(self, record: logging.LogRecord) -> str:
        fields = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "component": self.component,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                fields[key] = value
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        if self.fmt == "json":
            return json.dumps(fields, default=str)
        return " ".join(f"{k}={_quote(v)}" for k, v in fields.items())


def _quote(value: object) -> str:
    """A logfmt value: booleans and None as JSON spells them (``true``, ``null``), text with
    spaces, ``=``, quotes or line breaks quoted, so each line still splits into its fields."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    text = str(value)
    plain = text and not any(c in text for c in ' ="\n')
    return text if plain else json.dumps(text)


CHATTY_LIBRARIES = ("apscheduler",)


def setup_logging(component: str, level: str = "info", fmt: str = "json", **fields: object) -> None:
    """Send every logger's records to stderr as structured lines for ``component``; ``fields``
    go on every line (which of a component's processes wrote it: ``worker=2``)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(StructuredFormatter(component, fmt))
    if fields:
        handler.addFilter(_Fields(fields))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # Libraries that log each routine run of a job at info (apscheduler: two lines a poll);
    # our own lines say what matters. ``debug`` still shows theirs.
    quiet = logging.NOTSET if root.level <= logging.DEBUG else logging.WARNING
    for name in CHATTY_LIBRARIES:
        logging.getLogger(name).setLevel(quiet)


class _Fields(logging.Filter):
    """Sets the same fields on every record that passes."""

    def __init__(self, fields: dict[str, object]) -> None:
        super().__init__()
        self.fields = fields

    def filter(self, record: logging.LogRecord) -> bool:
        record.__dict__.update(self.fields)
        return True
