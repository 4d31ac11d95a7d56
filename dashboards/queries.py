"""What a dashboard asks Prometheus: every PromQL expression in it, made concrete.

Dashboard JSON holds PromQL with Grafana variables in it. To check the queries against promtool
or a live Prometheus, they must be made concrete: user variables get a value (or ``.*``) and
Grafana's built-in interval variables get durations. The metric names an expression reads are
found by a small PromQL scanner, so tests can ask whether each one is produced by the project.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

BUILTINS: dict[str, str] = {
    "__range": "1h",
    "__range_s": "3600",
    "__range_ms": "3600000",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
}
"""Grafana's built-in variables with the values used to make a query concrete."""

VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*(\w+)\s*\)\s*$", re.DOTALL)


@dataclass(frozen=True)
class DashboardQuery:
    """One PromQL expression of a dashboard and where it sits."""

    dashboard: str  # uid
    where: str  # panel title, annotation name or variable name
    expr: str
    kind: Literal["target", "annotation", "variable"]
    instant: bool  # Grafana runs it as an instant query (tables, variables), else over a range


def _panels(dashboard: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])  # a collapsed row holds its panels


def panels(dashboard: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Every panel of a dashboard, rows included, in layout order."""
    return list(_panels(dashboard))


def queries(dashboard: Mapping[str, Any]) -> list[DashboardQuery]:
    """Every PromQL expression: panel targets, annotations and the selectors of variables."""
    uid = dashboard["uid"]
    found = []
    for panel in _panels(dashboard):
        for target in panel.get("targets", []):
            instant = bool(target.get("instant")) and not target.get("range")
            found.append(DashboardQuery(uid, panel["title"], target["expr"], "target", instant))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):
            name = f"annotation {annotation['name']}"
            found.append(DashboardQuery(uid, name, annotation["expr"], "annotation", False))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query":
            continue
        query = variable["query"]
        text = query if isinstance(query, str) else query.get("query", "")
        match = LABEL_VALUES.match(text)
        expr = match.group(1) if match else text
        found.append(DashboardQuery(uid, f"variable {variable['name']}", expr, "variable", True))
    return found


def example_values(dashboard: Mapping[str, Any]) -> dict[str, str]:
    """Values of the single-value variables that name one: where ``.*`` cannot stand in.

    A multi-value variable sits inside ``=~`` matchers, where ``.*`` (its "All") is valid; a
    single-value one may sit where only a value parses (``offset ${horizon}s``), so it carries
    an example as its current value and queries are made concrete with it.
    """
    found = {}
    for variable in dashboard.get("templating", {}).get("list", []):
        current = variable.get("current") or {}
        value = current.get("value")
        if not variable.get("multi") and isinstance(value, str) and value:
            found[variable["name"]] = value
    return found


def variables_used(text: str) -> set[str]:
    """Names of the Grafana variables in ``text``: ``$x``, ``${x}``, ``${x:fmt}``, ``[[x]]``."""
    return {next(g for g in m.groups() if g) for m in VARIABLE.finditer(text)}


def make_concrete(expr: str, values: Mapping[str, str] | None = None) -> str:
    """``expr`` with every variable replaced: built-ins by a duration, others from ``values``.

    Variables missing from ``values`` become ``.*`` (the "All" value of the dashboards'
    multi-value variables, which are only used inside ``=~`` matchers).
    """
    chosen = {**BUILTINS, **(values or {})}

    def replace(match: re.Match[str]) -> str:
        name = next(g for g in match.groups() if g)
        return chosen.get(name, ".*")

    return VARIABLE.sub(replace, expr)


_TOKEN = re.compile(
    r"""(?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
      |(?P<number>\d[\w.]*)
      |(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
      |(?P<space>\s+)
      |(?P<other>.)""",
    re.VERBOSE | re.DOTALL,
)
_KEYWORDS = {"and", "or", "unless", "offset", "bool", "inf", "nan", "atan2"}
_LABEL_LISTS = {"by", "without", "on", "ignoring", "group_left", "group_right"}


def metric_names(expr: str) -> set[str]:
    """The metric names a concrete PromQL expression selects.

    A scanner, not a parser (promtool checks the syntax): it skips strings, label matchers
    ``{...}``, ranges ``[...]``, the label lists of ``by``/``on``/..., function and aggregation
    names (an identifier followed by ``(``) and keywords; what remains are metric names.
    """
    tokens = [
        (m.lastgroup, m.group())
        for m in _TOKEN.finditer(expr)
        if m.lastgroup not in ("space", "string")
    ]
    names: set[str] = set()
    depth_brace = depth_bracket = 0
    skip_parens = 0  # inside a label list such as by (a, b)
    for index, (kind, text) in enumerate(tokens):
        following = tokens[index + 1][1] if index + 1 < len(tokens) else ""
        if text == "{":
            depth_brace += 1
        elif text == "}":
            depth_brace -= 1
        elif text == "[":
            depth_bracket += 1
        elif text == "]":
            depth_bracket -= 1
        elif skip_parens and text == "(":
            skip_parens += 1
        elif skip_parens and text == ")":
            skip_parens -= 1
            if skip_parens == 1:
                skip_parens = 0
        elif depth_brace or depth_bracket or skip_parens or kind != "ident":
            continue
        elif text in _LABEL_LISTS:
            if following == "(":
                skip_parens = 1
        elif text.lower() in _KEYWORDS or following == "(" or following in ("by", "without"):
            continue  # keyword, function, or aggregation written as ``sum by (a) (...)``
        else:
            names.add(text)
    return names
