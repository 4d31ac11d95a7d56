"""Every command line, fed arbitrary flags: an answer (exit 0) or one error line (exit 2), never a
traceback.

Each CLI's ``main(argv)`` runs in process on flags drawn by hypothesis from its own parser (every
option, values from a list of troublemakers -- NaN, infinities, negatives, empty strings, folders
and missing files -- and arbitrary text), plus a ``--config`` YAML file of arbitrary values. The
step where real work would start (a server, a simulation, a download) is patched to raise
:class:`ReachedStart`, so what runs is the parsing and validation, fast and without side effects.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import logging
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from unittest import mock

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autoglm.config import OneLineErrorParser, add_config_arguments

ROOT = Path(__file__).resolve().parents[1]
EXCERPT = ROOT / "autoglm" / "datasets" / "data" / "azure_llm_conv_10min.csv"
CONFIG_FILE = "fuzz-config.yaml"
# A fixed, bounded draw by default, so the suite is the same every run; a longer random hunt:
# AUTOGLM_FUZZ_EXAMPLES=2000 python -m pytest tests/test_cli_fuzz.py
HUNT = os.environ.get("AUTOGLM_FUZZ_EXAMPLES")
EXAMPLES = int(HUNT or 40)


class ReachedStart(Exception):
    """Validation passed: the patched step where the command's real work begins was reached."""


def reached_start(*args: object, **kwargs: object) -> None:
    raise ReachedStart


@dataclass(frozen=True)
class Cli:
    """One command: how to call it, its parser (for the flags), and where its work starts."""

    name: str
    main: str  # "module:function" taking argv
    parser: Callable[[], argparse.ArgumentParser]
    prefix: tuple[str, ...] = ()  # the subcommand, if any
    starts: tuple[str, ...] = ()  # "module.attribute" replaced by reached_start
    codes: frozenset[int] = frozenset({0, 2})
    extra_values: tuple[str, ...] = ()

    def call(self, argv: Sequence[str]) -> int:
        module, _, function = self.main.partition(":")
        with contextlib.ExitStack() as patches:
            for target in self.starts:
                patches.enter_context(mock.patch(target, reached_start))
            try:
                code = getattr(importlib.import_module(module), function)([*self.prefix, *argv])
            except SystemExit as exc:
                code = exc.code
            except ReachedStart:
                code = 0
        if code is None:
            return 0
        return code if isinstance(code, int) else 2


def config_parser(module: str, cls: str, prog: str) -> Callable[[], argparse.ArgumentParser]:
    def build() -> argparse.ArgumentParser:
        parser = OneLineErrorParser(prog=prog)
        add_config_arguments(parser, getattr(importlib.import_module(module), cls))
        return parser

    return build


def attribute(module: str, name: str) -> Callable[[], argparse.ArgumentParser]:
    return lambda: getattr(importlib.import_module(module), name)()


def subcommand(module: str, name: str, command: str) -> Callable[[], argparse.ArgumentParser]:
    """The parser of one subcommand of an argparse parser with subparsers."""

    def build() -> argparse.ArgumentParser:
        parser = getattr(importlib.import_module(module), name)()
        (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        return commands.choices[command]

    return build


def autoscaler_decide_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    for flag in ("--spec", "--current", "--metrics"):
        parser.add_argument(flag)
    return parser


CLIS = [
    Cli(
        "exporter",
        "exporter.cli:main",
        config_parser("exporter.config", "ExporterConfig", "autoglm-exporter"),
        starts=("exporter.cli.ExporterService", "exporter.cli._pod_watcher"),
        codes=frozenset({0, 1, 2}),  # 1: no NVIDIA driver for --source auto/nvml, as documented
    ),
    Cli(
        "batcher",
        "batcher.cli:main",
        config_parser("batcher.config", "BatcherConfig", "autoglm-batcher"),
        starts=("batcher.cli.start_model",),
    ),
    Cli(
        "predictor serve",
        "predictor.cli:main",
        config_parser("predictor.config", "PredictorConfig", "autoglm-predictor"),
        starts=("predictor.service.PredictorService",),
    ),
    Cli(
        "predictor backtest",
        "predictor.cli:main",
        attribute("predictor.cli", "_backtest_parser"),
        prefix=("backtest",),
        starts=("predictor.selection.select_model",),
        extra_values=(str(EXCERPT), "TIMESTAMP", "1min", "15s", "0s", "-1h"),
    ),
    Cli(
        "autoscaler run",
        "autoscaler.cli:main",
        config_parser("autoscaler.config", "AutoscalerConfig", "autoglm-autoscaler"),
        prefix=("run",),
        starts=("autoscaler.cli._run",),
    ),
    Cli(
        "autoscaler simulate",
        "autoscaler.cli:main",
        config_parser("autoscaler.simulator.cli", "SimulateSettings", "simulate"),
        prefix=("simulate",),
        starts=("autoscaler.simulator.cli.simulate",),
        extra_values=(str(EXCERPT), "TIMESTAMP"),
    ),
    Cli(
        "autoscaler decide",
        "autoscaler.cli:main",
        autoscaler_decide_parser,
        prefix=("decide",),
        extra_values=(
            str(ROOT / "autoscaler" / "crd" / "example.yaml"),
            '{"gpu_util": {"pods": {"a": 90}}}',
            '{"queue": {"value": NaN}}',
            '{"gpu_util": {"pods": {"a": null}}, "queue": {"pods": {}, "forecast": -1}}',
        ),
    ),
    Cli(
        "up",
        "stack.cli:main",
        config_parser("stack.config", "UpConfig", "autoglm up"),
        starts=("stack.stack.Stack",),
    ),
    Cli(
        "job run",
        "jobs.cli:main",
        config_parser("jobs.config", "JobConfig", "autoglm job run"),
        prefix=("run",),
        starts=("jobs.cli.run_job", "jobs.cli.HTTPServer"),
    ),
    Cli(
        "datasets verify",
        "autoglm.datasets.cli:main",
        subcommand("autoglm.datasets.cli", "_parser", "verify"),
        prefix=("verify",),
        codes=frozenset({0, 1, 2}),  # 1: a named trace is not fetched, as documented
    ),
    Cli(
        "dashboards",
        "dashboards.cli:main",
        config_parser("dashboards.cli", "GeneratorConfig", "python -m dashboards"),
        starts=("dashboards.output.write_all", "dashboards.output.compare_all"),
    ),
]

TROUBLE = (
    "0",
    "1",
    "-1",
    "0.5",
    "1.5",
    "-0.0",
    "nan",
    "inf",
    "-inf",
    "1e999",
    "99999999999999999999",
    "",
    " ",
    "abc",
    "true",
    "{}",
    "[]",
    "null",
    ".",
    "missing-file.yaml",
    "/dev/null",
    ":0",
    "127.0.0.1:0",
    "host:99999",
    "[::1]:0",
    "1d",
    "15min",
    "0s",
    "10%",
    "é",
)

# Arbitrary text as one argv word: no NUL (no exec can pass one), relative paths only (the
# commands run in a temporary folder, so whatever they create stays there).
WORDS = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
).filter(lambda s: not s.startswith(("/", "~")))

YAML_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=True, allow_infinity=True)
    | WORDS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(WORDS, inner, max_size=2),
    max_leaves=4,
)


@dataclass(frozen=True)
class Option:
    flag: str
    takes_value: bool
    choices: tuple[str, ...] = field(default=())


def options_of(parser: argparse.ArgumentParser) -> list[Option]:
    found = []
    for action in parser._actions:
        flags = [s for s in action.option_strings if s.startswith("--")]
        if not flags or flags[0] in ("--help", "--version", "--config"):
            continue
        choices = tuple(str(c) for c in action.choices or ())
        found.append(Option(flags[0], action.nargs != 0, choices))
    return found


@st.composite
def command_lines(draw: st.DrawFn, cli: Cli) -> tuple[list[str], dict | None]:
    options = options_of(cli.parser())
    names = [f.lstrip("-").replace("-", "_") for f in (o.flag for o in options)]
    values = st.sampled_from(TROUBLE + cli.extra_values) | WORDS
    argv: list[str] = []
    for option in draw(st.lists(st.sampled_from(options), max_size=5)):
        if not option.takes_value:
            argv.append(option.flag)
            continue
        pool = st.sampled_from(option.choices) | values if option.choices else values
        argv.append(f"{option.flag}={draw(pool)}")
    config = None
    if draw(st.booleans()):
        config = draw(st.dictionaries(st.sampled_from(names) | WORDS, YAML_VALUES, max_size=3))
        argv.append(f"--config={CONFIG_FILE}")
    return argv, config


@contextlib.contextmanager
def captured() -> Iterator[io.StringIO]:
    """stdout and stderr of the call, with the logging set-up it may change put back after."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            yield out
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def problems(code: int, output: str, cli: Cli) -> list[str]:
    found = []
    if code not in cli.codes:
        found.append(f"exit code {code}, expected one of {sorted(cli.codes)}")
    if "Traceback" in output:
        found.append("a traceback")
    if code == 2:
        errors = [line for line in output.splitlines() if ": error: " in line]
        if len(errors) != 1:
            found.append(f"{len(errors)} error lines instead of one")
    return found


@pytest.fixture
def in_tmp(tmp_path: Path) -> Iterator[Path]:
    before = os.getcwd()
    os.chdir(tmp_path)
    try:
        yield tmp_path
    finally:
        os.chdir(before)


@pytest.fixture(autouse=True)
def torch_threads() -> Iterator[None]:
    """The predictor sets torch's thread count from its flags; the next test gets it back."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.parametrize("cli", CLIS, ids=[c.name for c in CLIS])
def test_no_flags_produce_a_traceback(cli: Cli, in_tmp: Path) -> None:
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=HUNT is None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(command_lines(cli))
    def check(drawn: tuple[list[str], dict | None]) -> None:
        argv, config = drawn
        if config is not None:
            (in_tmp / CONFIG_FILE).write_text(yaml.safe_dump(config, allow_unicode=True))
        with captured() as out:
            code = cli.call(argv)
        found = problems(code, out.getvalue(), cli)
        assert not found, f"{cli.name} {argv} config={config}: {found}\n{out.getvalue()[-2000:]}"

    check()


def test_the_fuzzer_sees_each_commands_flags() -> None:
    """A parser read wrongly would fuzz nothing: every command offers flags, some with values."""
    for cli in CLIS:
        options = options_of(cli.parser())
        assert any(o.takes_value for o in options), cli.name


def test_the_checker_catches_a_traceback_and_two_error_lines() -> None:
    cli = CLIS[0]
    assert problems(2, "x: error: one\nTraceback (most recent call last):", cli) == ["a traceback"]
    assert problems(2, "a: error: b\nc: error: d", cli) == ["2 error lines instead of one"]
    assert problems(3, "", cli) == ["exit code 3, expected one of [0, 1, 2]"]
    assert problems(2, '{"level": "info"}\nautoglm-exporter: error: bad --gpus', cli) == []
