"""The shared flags-mirror-YAML configuration: merging, conversion and one-line errors."""

from __future__ import annotations

import argparse
import socket
from dataclasses import dataclass, field
from typing import Annotated, Literal

import pytest
from pydantic import Field

from autoglm.config import (
    ConfigError,
    OneLineErrorParser,
    add_config_arguments,
    check_can_listen,
    check_fields,
    config_from_args,
    finite_float_argument,
    load_config,
    parse_listen,
)
from autoglm.version import package_version


@dataclass(frozen=True)
class DemoConfig:
    listen: str = field(default=":9400", metadata={"help": "HOST:PORT"})
    interval: float = field(default=1.0, metadata={"help": "seconds"})
    gpus: int = 2
    source: Literal["auto", "nvml", "simulated"] = "auto"
    debug: bool = False
    labels: list[str] = field(default_factory=list)
    weights: list[float] = field(default_factory=list)
    name: str = field(default="", metadata={"help": "a name"})
    workers: Annotated[int, Field(ge=1, le=64)] = 4

    def __post_init__(self) -> None:
        check_fields(self)
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


@pytest.mark.parametrize(
    ("word", "flag"), [("on", True), ("off", False), ("yes", True), ("no", False)]
)
def test_on_off_yes_no_in_a_file_are_words_for_text_and_booleans_for_flags(
    tmp_path, word: str, flag: bool
):
    """YAML 1.1 read ``off`` as False: a setting whose choices are words (``padding: on``)
    was refused with a value the user never wrote."""
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(f"name: {word}\ndebug: {word}\n")
    cfg = parse(["--config", str(cfg_file)])
    assert (cfg.name, cfg.debug) == (word, flag)


def test_dashed_keys_in_file_and_repeatable_list_flags(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("labels: [a, b]\n")
    assert parse(["--config", str(cfg_file)]).labels == ["a", "b"]
    assert parse(["--labels", "x", "--labels", "y"]).labels == ["x", "y"]


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("gpus: many\n", "c.yaml: gpus: 'many' is not a whole number; give an integer such as 2"),
        ("gpu: 3\n", "unknown setting 'gpu'"),
        ("source: cuda\n", "c.yaml: source: 'cuda' is not one of auto, nvml, simulated"),
        ("interval: -1\n", "c.yaml: interval must be > 0"),
        ("- just a list\n", "must hold a mapping"),
        ("gpus: [\n", "is not valid YAML"),
        ("debug: maybe\n", "c.yaml: debug: 'maybe' is not true or false; give true or false"),
        ("gpus: true\n", "c.yaml: gpus: true is not a whole number"),  # pydantic would read 1
        ("interval: false\n", "c.yaml: interval: false is not a number; give a number such as 1"),
        # A setting written twice would silently lose the first (PyYAML keeps the last).
        ("gpus: 2\nsource: auto\ngpus: 4\n", "key 'gpus' is given twice at line 3, column 1"),
        ("gpus: 2\n  source: auto\n", "mapping values are not allowed here at line 2, column 9"),
    ],
)
def test_bad_values_name_the_problem(tmp_path, content, message):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(content)
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")) as err:
        parse(["--config", str(cfg_file)])
    assert "\n" not in str(err.value)  # one line, without PyYAML's drawing of the text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--workers", "0"], "--workers must be >= 1, got 0 (default: --workers 4)"),
        (["--workers", "65"], "--workers must be <= 64, got 65 (default: --workers 4)"),
        (
            ["--workers", "2.5"],
            "--workers: '2.5' is not a whole number; give an integer such as 4",
        ),
        (
            ["--workers", "abc"],
            "--workers: 'abc' is not a whole number; give an integer such as 4",
        ),
    ],
)
def test_a_bound_names_the_flag_the_limit_and_the_default(argv, message):
    with pytest.raises(ConfigError) as err:
        parse(argv)
    assert str(err.value) == message


def test_settings_built_in_code_are_held_to_the_same_bounds():
    with pytest.raises(ConfigError) as err:
        DemoConfig(workers=0)
    assert str(err.value) == "--workers must be >= 1, got 0 (default: --workers 4)"


def test_a_number_in_the_file_where_text_goes_is_that_text(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("name: 7\nlabels: solo\n")
    cfg = parse(["--config", str(cfg_file)])
    assert (cfg.name, cfg.labels) == ("7", ["solo"])


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


@pytest.mark.parametrize("value", ["9400", "host:", "host:99999", "host:abc", "host:\u00b2"])
def test_parse_listen_rejects(value):
    with pytest.raises(ConfigError, match="must be HOST:PORT"):
        parse_listen(value)


def test_unknown_flag_is_one_line_and_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        load_config(DemoConfig, ["--gpus", "2", "--no-such-flag"], prog="demo")
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["demo: error: unrecognized arguments: --no-such-flag; see --help"]


@pytest.mark.parametrize("text", ["nan", "NaN", "inf", "-inf", "Infinity", "1e999"])
def test_non_finite_numbers_are_refused_on_the_command_line(text):
    with pytest.raises(ConfigError, match=f"--interval: '{text}' is not a finite number"):
        parse([f"--interval={text}"])


@pytest.mark.parametrize("content", ["interval: .nan\n", "interval: .inf\n", "interval: -.inf\n"])
def test_non_finite_numbers_are_refused_in_the_file(tmp_path, content):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text(content)
    with pytest.raises(
        ConfigError, match=r"c.yaml: interval: .* is not a finite number; give a number such as 1"
    ):
        parse(["--config", str(cfg_file)])


def test_non_finite_numbers_are_refused_in_lists_and_as_integers(tmp_path):
    with pytest.raises(ConfigError, match="--weights: 'nan' is not a finite number"):
        parse(["--weights", "1", "--weights", "nan"])
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("gpus: .inf\n")
    with pytest.raises(
        ConfigError, match=r"c\.yaml: gpus: inf is not a whole number; give an integer such as 2"
    ):
        parse(["--config", str(cfg_file)])


def test_finite_float_argument_names_its_flag_in_one_line(capsys):
    parser = OneLineErrorParser(prog="demo")
    parser.add_argument("--q", type=finite_float_argument("--q"))
    assert parser.parse_args(["--q", "0.25"]).q == 0.25
    for bad in ("nan", "inf", "lots"):
        with pytest.raises(SystemExit) as exc:
            parser.parse_args(["--q", bad])
        assert exc.value.code == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert line.startswith("demo: error: argument --q: ") and bad in line


def test_a_file_that_is_not_text_is_one_line(tmp_path):
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_bytes(b"\xff\xfe\x00binary")
    with pytest.raises(ConfigError, match="is not text"):
        parse(["--config", str(cfg_file)])


def test_help_shows_defaults_but_never_an_empty_one(capsys):
    parser = argparse.ArgumentParser(prog="demo")
    add_config_arguments(parser, DemoConfig)
    text = " ".join(parser.format_help().split())
    assert "(default: :9400)" in text and "(default: 1.0)" in text
    assert "(default: )" not in text
    assert "--name NAME a name" in text


def test_every_config_command_answers_version(capsys):
    parser = argparse.ArgumentParser(prog="demo")
    add_config_arguments(parser, DemoConfig)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"demo {package_version()}\n"
    assert package_version()[0].isdigit()


def test_a_port_someone_listens_on_is_refused_before_start():
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(ConfigError, match=f"--listen '127.0.0.1:{port}': cannot listen"):
            check_can_listen(f"127.0.0.1:{port}")
    check_can_listen(f"127.0.0.1:{port}")  # free again once the holder is gone
    check_can_listen("127.0.0.1:0")


@pytest.mark.parametrize("port", [9400, 0], ids=["port", "any-port"])
def test_an_unresolvable_listen_host_is_one_error(port: int):
    """Port 0 (any free port) too: the host is checked before the slow start-up."""
    with pytest.raises(ConfigError, match="cannot resolve host"):
        check_can_listen(f"no-such-host.invalid:{port}", flag="--listen")


def test_an_address_of_another_machine_is_refused_with_any_port():
    with pytest.raises(ConfigError, match=r"'192\.0\.2\.1:0': cannot listen there"):
        check_can_listen("192.0.2.1:0")  # TEST-NET-1: never this machine's
