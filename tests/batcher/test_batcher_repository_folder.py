"""Reading a model repository folder: which models it holds and each one's settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoglm.config import ConfigError
from batcher.cli import check_repository
from batcher.config import BatcherConfig
from batcher.errors import ModelConfigInvalid, NotInRepository
from batcher.repository_folder import model_config, model_names


def add(folder: Path, name: str, text: str) -> None:
    (folder / name).mkdir()
    (folder / name / "config.yaml").write_text(text)


def test_models_are_the_subfolders_with_a_config(tmp_path) -> None:
    add(tmp_path, "b", "model: pkg.mod:f\n")
    add(tmp_path, "a", "")
    (tmp_path / "notes").mkdir()  # no config.yaml: not a model
    (tmp_path / "README.md").write_text("hi")
    assert model_names(str(tmp_path)) == ["a", "b"]


def test_a_model_config_overrides_the_process_settings_and_is_named_by_its_folder(
    tmp_path,
) -> None:
    add(
        tmp_path,
        "ranker",
        "model: pkg.mod:f\nmax-batch-size: 8\nslo_seconds: 0.05\ncheckpoint: weights.pt\n",
    )
    base = BatcherConfig(slo_seconds=0.3, max_queue=512, priority_levels=2, model_name="ignored")
    config = model_config(str(tmp_path), "ranker", base)
    assert (config.model, config.max_batch_size, config.slo_seconds) == ("pkg.mod:f", 8, 0.05)
    assert (config.max_queue, config.priority_levels) == (512, 2)  # from the process
    assert config.model_name == "ranker"
    assert config.checkpoint == str(tmp_path / "ranker" / "weights.pt")


def test_a_process_setting_in_a_model_config_is_refused_with_the_flag_to_use(tmp_path) -> None:
    add(tmp_path, "m", "grpc_listen: ':8001'\n")
    with pytest.raises(ModelConfigInvalid, match=r"whole process.* give --grpc-listen"):
        model_config(str(tmp_path), "m", BatcherConfig())


def test_bad_values_name_the_file_and_the_setting(tmp_path) -> None:
    add(tmp_path, "m", "max_batch_size: 0\n")
    with pytest.raises(
        ModelConfigInvalid, match=r"m/config\.yaml: max_batch_size must be >= 1, got 0 \(default: "
    ):
        model_config(str(tmp_path), "m", BatcherConfig())
    add(tmp_path, "n", "no_such_setting: 1\n")
    with pytest.raises(
        ModelConfigInvalid, match=r"config\.yaml: unknown setting 'no_such_setting'"
    ):
        model_config(str(tmp_path), "n", BatcherConfig())
    add(tmp_path, "o", "- a list\n")
    with pytest.raises(ModelConfigInvalid, match="must hold a mapping"):
        model_config(str(tmp_path), "o", BatcherConfig())


def test_a_missing_model_names_what_the_repository_holds(tmp_path) -> None:
    add(tmp_path, "a", "")
    with pytest.raises(NotInRepository, match=r"no model 'z' .* \(it holds: a\)"):
        model_config(str(tmp_path), "z", BatcherConfig())


def test_the_command_line_checks_the_folder_and_the_startup_models(tmp_path) -> None:
    with pytest.raises(ConfigError, match="no such folder"):
        check_repository(BatcherConfig(model_repository=str(tmp_path / "none")))
    with pytest.raises(ConfigError, match="holds no model"):
        check_repository(BatcherConfig(model_repository=str(tmp_path)))
    add(tmp_path, "a", "")
    with pytest.raises(ConfigError, match="--startup-models 'b' is not in"):
        check_repository(BatcherConfig(model_repository=str(tmp_path), startup_models=["b"]))
    check_repository(BatcherConfig(model_repository=str(tmp_path), startup_models=["a"]))
    with pytest.raises(ConfigError, match="give --model-repository too"):
        BatcherConfig(startup_models=["a"])
