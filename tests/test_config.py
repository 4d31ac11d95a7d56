"""The shared flags-mirror-YAML configuration: merging, conversion and one-line errors."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Literal

import pytest

from autoglm.config import (
    ConfigError,
    add_config_arguments,
    config_from_args,
    load_config,
    parse_listen,
)


@dataclass(frozen=True)
class DemoConfig:
    listen: str = field(default=":9400", metadata={"help": "HOST:PORT"})
    interval: float = field(default=1.0, metadata={"help": "seconds"})
    gpus: int = 2
    source: Literal["auto", "nvml", "simulated"] = "auto"
    debug: bool = False
    labels: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.interval <= 0:
            raise ConfigError("--interval must be > 0, e.g. --interval 1")


def parse(argv: list[str]) -> DemoConfig:
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, DemoConfig)
    return config_from_args(DemoConfig, parser.parse_args(argv))


def test_defaults_file_and_flags_merge_in_that_order(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("interval: 0.5\ngpus: 8\nsource: simulated\n")
    cfg = parse(["--config", str(cfg_file), "--gpus", "4", "--debug"])
    assert cfg == DemoConfig(interval=0.5, gpus=4, source="simulated", debug=True)


def test_dashed_keys_in_file_and_repeatable_list_flags(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("labels: [a, b]\n")
    assert parse(["--config", str(cfg_file)]).labels == ["a", "b"]
    assert parse(["--labels", "x", "--labels", "y"]).labels == ["x", "y"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("gpus: many\n", "--gpus: 'many' is not a valid int"),
        ("gpu: 3\n", "unknown setting 'gpu'"),
        ("source: cuda\n", "--source: 'cuda' is not one of auto, nvml, simulated"),
        ("interval: -1\n", "--interval must be > 0"),
        ("- just a list\n", "must hold a mapping"),
        ("gpus: [\n", "is not valid YAML"),
        ("debug: maybe\n", "--debug: 'maybe' is not a valid bool"),
    ],
)
def test_bad_values_name_the_problem(tmp_path, content, message):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(content)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        parse(["--config", str(cfg_file)])


def test_load_config_exits_2_with_one_line(capsys, tmp_path):
    with pytest.raises(SystemExit) as exc:
        load_config(DemoConfig, ["--config", str(tmp_path / "missing.yaml")], prog="demo")
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("demo: error: cannot read config file")


@pytest.mark.parametrize(
    ("value", "expected"),
    [(":9400", ("0.0.0.0", 9400)), ("127.0.0.1:80", ("127.0.0.1", 80)), ("[::1]:9", ("::1", 9))],
)
def test_parse_listen(value, expected):
    assert parse_listen(value) == expected


@pytest.mark.parametrize("value", ["9400", "host:", "host:99999", "host:abc"])
def test_parse_listen_rejects(value):
    with pytest.raises(ConfigError, match="must be HOST:PORT"):
        parse_listen(value)


def test_unknown_flag_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        load_config(DemoConfig, ["--gpus", "2", "--no-such-flag"], prog="demo")
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["demo: error: unrecognized arguments: --no-such-flag; see --help"]
