"""Every component's numeric settings, given a value of the wrong type, get one line that says
what is expected and a value that works, and names the setting as the user wrote it: the flag
on the command line, the file and its key in a ``--config`` file."""

from __future__ import annotations

import argparse
import dataclasses
import re
import typing
from pathlib import Path

import pytest
from pydantic import TypeAdapter

from autoglm.config import ConfigError, add_config_arguments, config_from_args
from autoscaler.config import AutoscalerConfig
from autoscaler.simulator.cli import SimulateSettings
from batcher.config import BatcherConfig
from exporter.config import ExporterConfig
from jobs.config import JobConfig
from predictor.config import PredictorConfig
from stack.config import UpConfig

COMPONENTS = [
    ExporterConfig,
    BatcherConfig,
    PredictorConfig,
    AutoscalerConfig,
    JobConfig,
    UpConfig,
    SimulateSettings,
]


def number_fields() -> list[tuple[type, str, type]]:
    """(settings class, field, int or float) for each flag that takes one number."""
    found = []
    for cls in COMPONENTS:
        hints = typing.get_type_hints(cls)
        for f in dataclasses.fields(cls):
            kind = hints[f.name]
            if f.init and f.metadata.get("cli") is not False and kind in (int, float):
                found.append((cls, f.name, kind))
    return found


FIELDS = number_fields()
IDS = [f"{cls.__name__}.{name}" for cls, name, _ in FIELDS]


def load(cls: type, argv: list[str]) -> object:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, cls)
    return config_from_args(cls, parser.parse_args(argv))


def refusal(cls: type, argv: list[str]) -> str:
    with pytest.raises(ConfigError) as err:
        load(cls, argv)
    return str(err.value)


def expected(kind: type) -> str:
    if kind is int:
        return r"is not a whole number; give an integer such as (\S+)"
    return r"is not (?:a|a finite) number; give a number such as (\S+)"


def assert_example_is_accepted(cls: type, name: str, example: str) -> None:
    """The value the line offers passes the field's own type and bounds."""
    annotation = typing.get_type_hints(cls, include_extras=True)[name]
    TypeAdapter(annotation).validate_python(float(example) if "." in example else int(example))


def test_every_component_has_number_settings_to_check() -> None:
    assert {cls for cls, _, _ in FIELDS} == set(COMPONENTS)


@pytest.mark.parametrize(("cls", "name", "kind"), FIELDS, ids=IDS)
def test_a_word_for_a_number_flag_says_what_to_give(cls: type, name: str, kind: type) -> None:
    flag = "--" + name.replace("_", "-")
    line = refusal(cls, [flag, "abc"])
    match = re.fullmatch(re.escape(f"{flag}: 'abc' ") + expected(kind), line)
    assert match, line
    assert_example_is_accepted(cls, name, match.group(1))


@pytest.mark.parametrize(("cls", "name", "kind"), FIELDS, ids=IDS)
def test_a_word_in_the_file_names_the_file_and_the_key(
    tmp_path: Path, cls: type, name: str, kind: type
) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text(f"{name}: abc\n")
    line = refusal(cls, ["--config", str(config)])
    match = re.fullmatch(re.escape(f"{config}: {name}: 'abc' ") + expected(kind), line)
    assert match, line
    assert_example_is_accepted(cls, name, match.group(1))


@pytest.mark.parametrize(("cls", "name", "kind"), FIELDS, ids=IDS)
def test_a_yaml_boolean_for_a_number_names_the_file_and_what_to_give(
    tmp_path: Path, cls: type, name: str, kind: type
) -> None:
    config = tmp_path / "settings.yaml"
    config.write_text(f"{name}: true\n")
    line = refusal(cls, ["--config", str(config)])
    assert re.fullmatch(re.escape(f"{config}: {name}: true ") + expected(kind), line), line


def test_a_fraction_for_a_whole_number_says_so(tmp_path: Path) -> None:
    config = tmp_path / "batcher.yaml"
    config.write_text("workers: 2.5\n")
    assert refusal(BatcherConfig, ["--config", str(config)]) == (
        f"{config}: workers: 2.5 is not a whole number; give an integer such as 0"
    )
    assert refusal(BatcherConfig, ["--workers", "2.5"]) == (
        "--workers: '2.5' is not a whole number; give an integer such as 0"
    )


def test_a_flag_over_a_bad_file_value_is_named_as_a_flag(tmp_path: Path) -> None:
    """The value that failed came from the command line: the line names the flag."""
    config = tmp_path / "batcher.yaml"
    config.write_text("max_batch_size: 8\n")
    assert refusal(BatcherConfig, ["--config", str(config), "--max-batch-size", "0"]) == (
        "--max-batch-size must be >= 1, got 0 (default: --max-batch-size 32)"
    )


def test_a_bound_broken_in_the_file_names_the_key_and_the_default(tmp_path: Path) -> None:
    config = tmp_path / "batcher.yaml"
    config.write_text("max_batch_size: 0\n")
    assert refusal(BatcherConfig, ["--config", str(config)]) == (
        f"{config}: max_batch_size must be >= 1, got 0 (default: 32)"
    )


def test_a_check_joining_settings_names_those_from_the_file_as_keys(tmp_path: Path) -> None:
    """``__post_init__`` checks name flags; the ones whose values the file gave are written
    as its keys, after its name, and a flag given on the command line stays a flag."""
    config = tmp_path / "up.yaml"
    config.write_text("max_workers: 1\nmin_workers: 2\n")
    assert refusal(UpConfig, ["--config", str(config)]) == (
        f"{config}: max_workers 1 is below min_workers 2"
    )
    assert refusal(UpConfig, ["--config", str(config), "--min-workers", "3"]) == (
        f"{config}: max_workers 1 is below --min-workers 3"
    )
    assert refusal(UpConfig, ["--max-workers", "1", "--min-workers", "2"]) == (
        "--max-workers 1 is below --min-workers 2"
    )
