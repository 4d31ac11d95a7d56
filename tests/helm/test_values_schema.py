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


WEB_CONFIG_COMPONENTS = ["exporter", "predictor", "autoscaler", "batcher", "job"]


@pytest.mark.parametrize("component", WEB_CONFIG_COMPONENTS)
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


def test_every_components_web_config_block_has_the_same_shape():
    """One webConfig block for all: the templates read every one with the same helpers."""
    schema = _values_schema()["properties"]
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    block = schema["exporter"]["properties"]["webConfig"]
    for component in WEB_CONFIG_COMPONENTS:
        assert schema[component]["properties"]["webConfig"] == block, component
        assert values[component]["webConfig"] == values["exporter"]["webConfig"], component


def test_a_bcrypt_hash_the_servers_take_fits_the_chart_pattern():
    hashed = bcrypt.hashpw(b"secret", bcrypt.gensalt(rounds=4)).decode()
    settings_from_mapping({"basic_auth_users": {"ops": hashed}})
    chart = _values_schema()["properties"]["exporter"]["properties"]["webConfig"]
    users = chart["properties"]["config"]["properties"]["basic_auth_users"]
    (pattern,) = users["patternProperties"].values()
    assert re.search(pattern["pattern"], hashed)
    assert not re.search(pattern["pattern"], hashed.replace("$04$", "$03$", 1))


# --- predictor.config: the predictor's --config file ----------------------------------------

# Settings the chart passes as flags (flags win over the file): in predictor.config they would
# be ignored, so the schema refuses them and names nothing else to set.
PREDICTOR_SET_BY_CHART = ("listen", "prometheus_url", "web_config_file")
# Strings the predictor reads as durations in __post_init__ (parse_duration), which pydantic's
# schema cannot see; update_interval may also be empty (the smallest step).
PREDICTOR_DURATIONS = ("prometheus_timeout", "refit_interval", "update_interval")
# parse_duration's grammar (predictor.config._DURATION, units _UNITS) restricted to values > 0,
# in RE2 syntax for Helm: a positive number of seconds, or a number with a unit.
DURATION_PATTERN = r"^\s*(0*[1-9][0-9]*(\.[0-9]+)?|0+\.[0-9]*[1-9][0-9]*)\s*(ms|s|m|h|d|w)?\s*$"


def _duration(empty: bool = False) -> dict:
    pattern = DURATION_PATTERN
    if empty:
        pattern = pattern[:1] + "(" + pattern[1:-1] + ")?" + pattern[-1:]
    return {"type": ["number", "string"], "exclusiveMinimum": 0, "pattern": pattern}


def _with_items(node: dict, defs: dict) -> dict:
    """:func:`_chart_form`, also inside arrays' ``items``."""
    if "$ref" in node or "anyOf" in node:
        node = _chart_form(node, defs)
    out = _chart_form(node, defs)
    if "items" in out:
        out["items"] = _with_items(out["items"], defs)
    if "properties" in out:
        out["properties"] = {k: _with_items(v, defs) for k, v in out["properties"].items()}
    return out


def predictor_config_schema() -> dict:
    """``predictor.config`` as the chart's values schema must constrain it: the predictor's
    settings (:class:`PredictorConfig`, a target :class:`TargetSettings`) in the chart's form,
    less what the chart sets, plus the checks the settings make in code (durations, header
    values, ``torch_threads >= 1``), which their pydantic schema cannot show."""
    import dataclasses
    import typing

    from predictor.config import Duration

    schema = settings_json_schema(PredictorConfig)
    defs = schema.pop("$defs")
    settings = {f.name for f in dataclasses.fields(PredictorConfig) if f.init}
    properties = {
        name: _with_items(prop, defs)
        for name, prop in schema["properties"].items()
        if name in settings and name not in PREDICTOR_SET_BY_CHART
    }
    for name in PREDICTOR_DURATIONS:
        properties[name] = _duration(empty=name == "update_interval")
    properties["prometheus_headers"]["additionalProperties"] = {"type": "string"}
    properties["torch_threads"]["minimum"] = 1
    target = properties["targets"]["items"]
    hints = typing.get_type_hints(TargetSettings, include_extras=True)
    for name, hint in hints.items():
        if hint == Duration:
            target["properties"][name] = _duration()
        elif hint == list[Duration]:
            target["properties"][name]["items"] = _duration()
    return {"type": "object", "additionalProperties": False, "properties": properties}


def test_the_predictor_config_schema_is_the_predictor_settings():
    """Every setting of the predictor's config file is in the chart's schema with its
    constraints, and nothing else is: a typo (``refit_intervall``) or an out-of-range target
    (``quantile: 1.2``) fails ``helm install`` instead of crash-looping the predictor."""
    chart = _without_descriptions(_values_schema()["properties"]["predictor"]["properties"])
    wanted = predictor_config_schema()
    assert chart["config"] == wanted, (
        "values.schema.json predictor.config should be "
        f"{json.dumps(wanted, indent=2)} (from predictor.config.PredictorConfig)"
    )


def test_the_duration_pattern_is_the_predictor_grammar():
    from predictor.config import _DURATION, _UNITS, parse_duration

    assert set(re.findall(r"\w+", DURATION_PATTERN.rsplit("(", 1)[1])) == set(_UNITS)
    assert _DURATION.pattern.startswith(r"^\s*(\d+(?:\.\d+)?)\s*(")
    for text in (
        "1",
        "15m",
        "1.5h",
        " 2 d ",
        "7d",
        "1w",
        "500ms",
        "0.5",
        "00.5s",
        "10",
        "1s",
        "0",
        "0s",
        "0.0m",
        "-1m",
        "1y",
        "m",
        "1.m",
        ".5s",
        "1e3",
        "1h30m",
        "",
    ):
        try:
            parse_duration(text, "x")
            accepted = True
        except ConfigError:
            accepted = False
        assert bool(re.search(DURATION_PATTERN, text)) == accepted, text


PREDICTOR_CONFIGS = [
    {"refit_intervall": "1h"},
    {"listen": ":9401"},
    {"prometheus_url": "http://p:9090"},
    {"target_configs": []},
    {"refit_interval": "0s"},
    {"refit_interval": 3600},
    {"refit_interval": "soon"},
    {"update_interval": ""},
    {"update_interval": "30s"},
    {"prometheus_timeout": True},
    {"torch_threads": 0},
    {"torch_threads": 4},
    {"log_level": "trace"},
    {"prometheus_headers": {"X-Scope-OrgID": "ml"}},
    {"prometheus_headers": {"X-Scope-OrgID": 1}},
    {"prometheus_insecure_skip_verify": "maybe"},
    {"targets": [{"name": "g", "query": "x", "horizon": [5]}]},
    {"targets": [{"name": "g", "query": "x", "quantile": 1.2}]},
    {"targets": [{"name": "g", "query": "x", "quantile": 0.4}]},
    {"targets": [{"name": "g", "query": "x", "quantile": 0.99}]},
    {"targets": [{"name": "g g", "query": "x"}]},
    {"targets": [{"name": "g", "step": "0"}]},
    {"targets": [{"name": "g", "step": "30s", "seasons": ["1d", 3600]}]},
    {"targets": [{"name": "g", "seasons": ["daily"]}]},
    {"targets": [{"name": "g", "horizons": []}]},
    {"targets": [{"name": "g", "horizons": [0]}]},
    {"targets": [{"name": "g", "aggregate": "max"}]},
    {"targets": [{"name": "g", "counter": True, "aggregate": "sum"}]},
    {"targets": [{"query": "x"}]},
]


@pytest.mark.parametrize(
    "config", PREDICTOR_CONFIGS, ids=[json.dumps(c) for c in PREDICTOR_CONFIGS]
)
def test_the_chart_refuses_a_predictor_config_the_predictor_refuses(config):
    """The chart's schema and the predictor agree on each value (the chart refuses what the
    predictor would refuse at start, or what the chart's flags would override)."""
    import jsonschema

    values = yaml.safe_load((CHART / "values.yaml").read_text())["predictor"]["config"]
    merged = {**values, **config}
    chart = _values_schema()["properties"]["predictor"]["properties"]["config"]
    chart_accepts = jsonschema.Draft7Validator(chart).is_valid(merged)
    settable = {k: v for k, v in merged.items() if k not in PREDICTOR_SET_BY_CHART}
    try:
        build_config(PredictorConfig, merged, source="predictor.config")
        predictor_accepts = settable == merged
    except ConfigError:
        predictor_accepts = False
    assert chart_accepts == predictor_accepts


def test_helm_refuses_a_misspelt_predictor_setting():
    from tests.helm.chart import render_failure

    stderr = render_failure(
        "--set",
        "predictor.config.refit_intervall=1h",
        "--set-json",
        'predictor.config.targets=[{"name":"g","query":"x","horizon":[5],"quantile":1.2}]',
    )
    assert "refit_intervall" in stderr
    assert "horizon" in stderr
    assert "quantile" in stderr
