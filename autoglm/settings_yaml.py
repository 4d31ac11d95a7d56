"""YAML as settings files are read: booleans are only ``true`` and ``false``.

PyYAML follows YAML 1.1, where ``on``, ``off``, ``yes`` and ``no`` are booleans too, so
``padding: on`` or ``progress: off`` reached a setting whose choices are words as ``True`` or
``False`` and was refused with a value the user never wrote. YAML 1.2, and Kubernetes' and
Prometheus' Go readers for a string field, keep them as text. A boolean setting still takes
them: the settings' validation reads ``on``/``off``/``yes``/``no`` text as booleans.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

BOOL_TAG = "tag:yaml.org,2002:bool"


class SettingsLoader(yaml.SafeLoader):
    """PyYAML's safe loader with YAML 1.2's booleans."""


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
