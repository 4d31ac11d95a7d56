"""The chart's values schema agrees with the settings the components load.

A chart value that becomes a component's flag (``exporter.interval`` is ``--interval``) must
refuse what the component refuses and take what it takes, or ``helm install`` accepts a release
whose pods exit 2 at start, or refuses one the component would run. The component's settings
are the source (their pydantic schema, :func:`autoglm.config.settings_json_schema`); when this
test fails, write the schema it prints into ``helm/open-autoglm/values.schema.json``.
"""

from __future__ import annotations

import json
import re

import bcrypt
import pytest
import yaml

from autoglm.config import ConfigError, build_config, settings_json_schema
from autoglm.webconfig.parse import WebConfigFile, settings_from_mapping
from autoscaler.config import AutoscalerConfig
from batcher.config import BatcherConfig
from exporter.config import ExporterConfig
from jobs.config import JobConfig
from predictor.config import PredictorConfig, TargetSettings
from tests.helm.chart import CHART

# The keys that decide what a value may be; descriptions and defaults may differ.
CONSTRAINTS = (
    "type",
    "enum",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "pattern",
    "minLength",
)

# (component in values.yaml, its value, the settings class, the setting the template passes it to)
FLAGS = [
    ("exporter", "source", ExporterConfig, "source"),
    ("exporter", "interval", ExporterConfig, "interval"),
    ("exporter", "naming", ExporterConfig, "naming"),
    ("autoscaler", "interval", AutoscalerConfig, "interval"),
    ("autoscaler", "dryRun", AutoscalerConfig, "dry_run"),
    ("batcher", "maxBatchSize", BatcherConfig, "max_batch_size"),
    ("batcher", "sloSeconds", BatcherConfig, "slo_seconds"),
    ("batcher", "workers", BatcherConfig, "workers"),
    ("batcher", "modelProcess", BatcherConfig, "model_process"),
    ("job", "order", JobConfig, "order"),
    ("job", "maxConcurrency", JobConfig, "max_concurrency"),
    ("job", "maxRate", JobConfig, "max_rate"),
]


def _values_schema() -> dict:
    return json.loads((CHART / "values.schema.json").read_text())


def _constraints(schema: dict) -> dict:
    out = {k: schema[k] for k in CONSTRAINTS if k in schema}
    if "enum" in out:  # an enum says the type
        out.pop("type", None)
    return out


@pytest.mark.parametrize(
    ("component", "value", "settings", "name"),
    FLAGS,
    ids=[f"{c}.{v}" for c, v, _, _ in FLAGS],
)
def test_a_value_passed_as_a_flag_has_the_settings_schema(component, value, settings, name):
    chart = _values_schema()["properties"][component]["properties"][value]
    wanted = _constraints(settings_json_schema(settings)["properties"][name])
    assert _constraints(chart) == wanted, (
        f"values.schema.json {component}.{value} should constrain as {json.dumps(wanted)} "
        f"(from {settings.__module__}.{settings.__name__}.{name})"
    )


def test_the_predictor_config_values_are_the_predictor_settings():
    """``predictor.config`` is the predictor's --config file: the chart's default loads, and
    the schema requires what a target requires."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    loaded = build_config(PredictorConfig, values["predictor"]["config"], source="values.yaml")
    assert loaded.target_configs
    chart = _values_schema()["properties"]["predictor"]["properties"]["config"]
    target = chart["properties"]["targets"]["items"]
    assert set(target["required"]) == set(TargetSettings.model_json_schema()["required"])


def test_the_chart_defaults_load_as_settings():
    """The values the templates pass as flags are accepted by the components as they ship."""
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    for component, value, settings, name in FLAGS:
        schema = settings_json_schema(settings)["properties"][name]
        default = values[component][value]
        if "enum" in schema:
            assert default in schema["enum"], f"{component}.{value}"
        for bound, holds in (
            ("minimum", lambda v, b: v >= b),
            ("exclusiveMinimum", lambda v, b: v > b),
            ("maximum", lambda v, b: v <= b),
        ):
            if bound in schema:
                assert holds(default, schema[bound]), f"{component}.{value}: {default}"


def _chart_form(node: dict, defs: dict) -> dict:
    """A pydantic JSON schema as the chart writes it: references inlined, ``X | None`` as
    ``X`` (a null value drops the key in Helm), no titles, defaults or descriptions."""
    if "$ref" in node:
        node = {**defs[node["$ref"].rsplit("/", 1)[-1]], **node}
        del node["$ref"]
    branches = [b for b in node.get("anyOf", ()) if b.get("type") != "null"]
    if len(branches) == 1:
        node = {**{k: v for k, v in node.items() if k != "anyOf"}, **branches[0]}
        return _chart_form(node, defs)
    out = {k: v for k, v in node.items() if k not in ("title", "default", "description")}
    if out.get("additionalProperties") is True:
        del out["additionalProperties"]
    for key in ("properties", "patternProperties"):
        if key in out:
            out[key] = {name: _chart_form(sub, defs) for name, sub in out[key].items()}
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = _chart_form(out["additionalProperties"], defs)
    return out


def _without_descriptions(node: object) -> object:
    if isinstance(node, dict):
        return {k: _without_descriptions(v) for k, v in node.items() if k != "description"}
    return node


@pytest.mark.parametrize("component", ["exporter", "predictor", "autoscaler"])
def test_the_web_config_values_have_the_web_config_schema(component):
    """``<component>.webConfig.config`` becomes the --web-config-file the servers read: the
    chart constrains it as the servers' schema does (sections, header names and values, user
    names, the bcrypt pattern; ``rate_limit`` is refused by both)."""
    chart = _values_schema()["properties"][component]["properties"]["webConfig"]
    config = _without_descriptions(chart["properties"]["config"])
    schema = WebConfigFile.model_json_schema(by_alias=True)
    wanted = _chart_form(schema, schema.pop("$defs"))
    assert config == wanted, (
        f"values.schema.json {component}.webConfig.config should be "
        f"{json.dumps(wanted, indent=2)} (from autoglm.webconfig.parse.WebConfigFile)"
    )
    assert "rate_limit" not in config["properties"]
    with pytest.raises(ConfigError, match="rate_limit"):
        settings_from_mapping({"rate_limit": {}})


def test_a_bcrypt_hash_the_servers_take_fits_the_chart_pattern():
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()
    settings_from_mapping({"basic_auth_users": {"ops": hashed}})
    chart = _values_schema()["properties"]["exporter"]["properties"]["webConfig"]
    users = chart["properties"]["config"]["properties"]["basic_auth_users"]
    (pattern,) = users["patternProperties"].values()
    assert re.search(pattern["pattern"], hashed)
    assert not re.search(pattern["pattern"], hashed.replace("$04$", "$03$", 1))
