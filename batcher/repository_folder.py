"""A model repository folder on disk: which models it holds, and each one's settings.

The layout is the one Triton and MLServer read, a folder per model named as the model is served::

    models/
      classifier/config.yaml      # model: pkg.module:factory, max_batch_size: 64, slo_seconds: 0.1
      embedder/config.yaml

``config.yaml`` holds that model's settings under the same keys as the batcher's flags and its
``--config`` file (``model``, ``checkpoint``, ``max_batch_size``, ``slo_seconds``, ``policy``,
``priority_levels``, the best-effort and warm-up settings, ...); what it leaves out comes from
the process's own settings. A relative ``checkpoint`` is read from the model's folder. Settings of
the process as a whole (where it listens, the device, logging, the repository itself) are
refused there with the flag to use instead: one process has one of each.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from autoglm.config import ConfigError, build_config, read_yaml_mapping
from batcher.config import BatcherConfig
from batcher.errors import ModelConfigInvalid, NotInRepository

CONFIG_FILE = "config.yaml"
PROCESS_SETTINGS = frozenset(
    {
        "listen",
        "grpc_listen",
        "workers",
        "model_repository",
        "startup_models",
        "repository_memory_bytes",
        "model_name",
        "device",
        "torch_threads",
        "expandable_segments",
        "idle_release_seconds",
        "max_body_bytes",
        "body_timeout_seconds",
        "drain_timeout_seconds",
        "web_config_file",
        "exit_with_parent",
        "log_level",
        "log_format",
    }
)


def check_folder(folder: str) -> None:
    """:class:`ConfigError` when ``--model-repository`` names no readable folder."""
    path = Path(folder)
    if not path.is_dir():
        raise ConfigError(
            f"--model-repository {folder!r}: no such folder; give a folder holding one "
            f"subfolder per model, each with its {CONFIG_FILE}"
        )


def model_names(folder: str) -> list[str]:
    """The models the folder holds: its subfolders that have a ``config.yaml``, sorted."""
    return sorted(
        entry.name
        for entry in Path(folder).iterdir()
        if entry.is_dir() and (entry / CONFIG_FILE).is_file() and not entry.name.startswith(".")
    )


def model_config(folder: str, name: str, base: BatcherConfig) -> BatcherConfig:
    """The settings of model ``name``: its ``config.yaml`` over the process's ``base``.

    Raises :class:`NotInRepository` when there is no such model and :class:`ModelConfigInvalid`
    naming the file and the fix when its settings are not usable.
    """
    path = Path(folder) / name / CONFIG_FILE
    if not path.is_file():
        held = ", ".join(model_names(folder)) or "none"
        raise NotInRepository(
            f"no model {name!r} in the repository {folder} (it holds: {held}); add "
            f"{name}/{CONFIG_FILE} there"
        )
    try:
        values = read_yaml_mapping(path, BatcherConfig)
    except ConfigError as exc:
        raise ModelConfigInvalid(str(exc)) from None
    misplaced = sorted(set(values) & PROCESS_SETTINGS)
    if misplaced:
        flag = "--" + misplaced[0].replace("_", "-")
        raise ModelConfigInvalid(
            f"{path}: {misplaced[0]!r} is a setting of the whole process, not of one model; "
            f"drop it there and give {flag} to the batcher"
        )
    checkpoint = values.get("checkpoint")
    if isinstance(checkpoint, str) and checkpoint and not Path(checkpoint).is_absolute():
        values["checkpoint"] = str(path.parent / checkpoint)
    merged: dict[str, Any] = {
        f.name: getattr(base, f.name) for f in dataclasses.fields(base) if f.init
    }
    merged.update(values, model_name=name, model_repository="", startup_models=[])
    try:
        return build_config(BatcherConfig, merged, source=str(path), from_file=set(values))
    except ConfigError as exc:
        message = str(exc)
        raise ModelConfigInvalid(
            message if message.startswith(str(path)) else f"{path}: {message}"
        ) from None
