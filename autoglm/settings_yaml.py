"""YAML as settings files are read: booleans are only ``true`` and ``false``, a key given twice
is an error, and a syntax error is one line.

PyYAML follows YAML 1.1, where ``on``, ``off``, ``yes`` and ``no`` are booleans too, so
``padding: on`` or ``progress: off`` reached a setting whose choices are words as ``True`` or
``False`` and was refused with a value the user never wrote. YAML 1.2, and Kubernetes' and
Prometheus' Go readers for a string field, keep them as text. A boolean setting still takes
them: the settings' validation reads ``on``/``off``/``yes``/``no`` text as booleans.

PyYAML keeps the last of two equal keys in a mapping without a word, so a setting written twice
(one edit above, one below) silently lost the first; YAML 1.2 says keys are unique. And its
errors span several lines with a caret drawing; a component's refusal is one line
(:func:`yaml_problem`).
"""

from __future__ import annotations

import re
from typing import Any

import yaml

BOOL_TAG = "tag:yaml.org,2002:bool"


class SettingsLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans and unique keys."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {key!r} is given twice", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


SettingsLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != BOOL_TAG]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
SettingsLoader.add_implicit_resolver(
    BOOL_TAG, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_settings_yaml(text: str) -> Any:
    """The YAML document in ``text``, read safely (no Python objects), booleans as YAML 1.2."""
    return yaml.load(text, Loader=SettingsLoader)  # a SafeLoader: no Python objects


def yaml_problem(error: yaml.YAMLError) -> str:
    """``error`` in one line: what is wrong and where (``line 3, column 7``), without PyYAML's
    multi-line drawing of the text."""
    if isinstance(error, yaml.MarkedYAMLError):
        mark = error.problem_mark or error.context_mark
        problem = " ".join(str(error.problem or error.context or "not YAML").split())
        if mark is not None:
            return f"{problem} at line {mark.line + 1}, column {mark.column + 1}"
        return problem
    return " ".join(str(error).split())
