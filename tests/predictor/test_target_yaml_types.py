"""A ``targets:`` entry in the predictor's YAML file is held to the checks its top-level
settings get: a YAML boolean where a number goes is refused (pydantic read ``true`` as 1, so
``horizons: [true]`` forecast one step ahead without a word), and every error names the file and
the entry's path."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from autoglm.config import ConfigError, add_config_arguments, build_config, config_from_args
from predictor.config import PredictorConfig

TARGET = "targets:\n  - name: requests\n    query: sum(rate(x[1m]))\n"


def refusal(tmp_path: Path, entry: str) -> tuple[Path, str]:
    config = tmp_path / "predictor.yaml"
    config.write_text(TARGET + entry)
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, PredictorConfig)
    with pytest.raises(ConfigError) as err:
        config_from_args(PredictorConfig, parser.parse_args(["--config", str(config)]))
    return config, str(err.value)


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        (
            "    horizons: [1, true]\n",
            "targets[0].horizons[1]: true is not a whole number; give an integer such as 4",
        ),
        (
            "    quantile: true\n",
            "targets[0].quantile: true is not a number; give a number such as 0.9",
        ),
        (
            "    seasons: [false]\n",
            "targets[0].seasons[0]: false is not a duration; use seconds or e.g. 15m, 1h",
        ),
        (
            "    horizons: [x]\n",
            "targets[0].horizons[0]: 'x' is not a whole number; give an integer such as 4",
        ),
        ("    horizons: [0]\n", "targets[0].horizons[0] must be >= 1, got 0"),
    ],
)
def test_a_bad_target_field_names_the_file_and_its_path(
    tmp_path: Path, entry: str, message: str
) -> None:
    config, line = refusal(tmp_path, entry)
    assert line == f"{config}: {message}"


def test_settings_built_in_code_refuse_a_boolean_horizon_too() -> None:
    with pytest.raises(ConfigError, match=r"^targets\[0\]\.horizons\[0\]: true is not a whole"):
        build_config(PredictorConfig, {"targets": [{"name": "a", "horizons": [True]}]})
