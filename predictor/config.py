"""Settings of the predictor: where series come from (targets, Prometheus) and how it serves.

Targets are a list in the YAML file (``--config``); each names a series, the PromQL that yields
it, its step, lookback, horizons (in steps), quantile and seasons. Everything else also has a
flag. Durations accept seconds or Prometheus-style units ("30s", "15m", "1h", "7d", "1w").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from autoglm.config import ConfigError, parse_listen, yaml_path
from autoglm.prometheus_api import PrometheusAccessConfig
from autoglm.schema_errors import first_error_line

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(value: Any, what: str) -> float:
    """Seconds from a number or a string like "15m"; ConfigError naming ``what`` otherwise."""
    if isinstance(value, bool):  # as YAML spells it
        raise ConfigError(
            f"{what}: {str(value).lower()} is not a duration; use seconds or e.g. 15m, 1h"
        )
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _DURATION.match(str(value))
        if not match:
            raise ConfigError(f"{what}: {value!r} is not a duration; use seconds or e.g. 15m, 1h")
        seconds = float(match.group(1)) * _UNITS[match.group(2) or "s"]
    if seconds <= 0:
        raise ConfigError(f"{what}: must be > 0, got {value!r}")
    return seconds


@dataclass(frozen=True)
class TargetConfig:
    """One forecast series. ``query`` empty means points arrive only through ``observe()``."""

    name: str
    query: str = ""
    step: float = 60.0
    lookback: float = 14 * 86400.0
    horizons: tuple[int, ...] = (1, 2, 5, 10)
    quantile: float = 0.9
    seasons: tuple[float, ...] = (86400.0, 604800.0)
    aggregate: Literal["mean", "sum", "last"] = "mean"
    counter: bool = False
    models: tuple[str, ...] = ()

    @property
    def max_horizon(self) -> int:
        return max(self.horizons)


def _seconds(value: Any) -> float:
    try:
        return parse_duration(value, "duration")
    except ConfigError as exc:
        raise ValueError(str(exc).removeprefix("duration: ")) from None


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_:.-]*$")

# Seconds, written as a number or as "15m", "1h", "7d".
Duration = Annotated[float, BeforeValidator(_seconds)]


class TargetSettings(BaseModel):
    """One entry of the ``targets:`` list as written in the YAML file.

    A pydantic model, so an entry is checked field by field with errors that name it
    (``targets[0].horizons[0] must be >= 1, got 0``) and the chart's values schema can be tested
    against it; :meth:`to_config` gives the service's :class:`TargetConfig`.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: Annotated[str, Field(pattern=_NAME.pattern)]
    query: str | None = ""
    step: Duration = TargetConfig.step
    seasons: list[Duration] = Field(default_factory=lambda: list(TargetConfig.seasons))
    # After step and seasons: the checks of horizons, lookback and models read them.
    horizons: Annotated[list[Annotated[int, Field(ge=1)]], Field(min_length=1)] = Field(
        default_factory=lambda: list(TargetConfig.horizons)
    )
    lookback: Duration = TargetConfig.lookback
    quantile: Annotated[float, Field(ge=0.5, lt=1)] = TargetConfig.quantile
    aggregate: Literal["mean", "sum", "last"] = "mean"
    counter: bool = False
    models: list[str] = Field(default_factory=list)

    @field_validator("name", mode="before")
    @classmethod
    def _a_word(cls, name: Any) -> Any:
        if isinstance(name, str) and not _NAME.fullmatch(name):
            raise ValueError(f"{name!r} must be a word like 'requests'")
        return name

    @field_validator("lookback")
    @classmethod
    def _long_enough_to_backtest(cls, lookback: float, info: ValidationInfo) -> float:
        from predictor.selection import points_to_refit

        step, horizons = info.data.get("step"), info.data.get("horizons")
        if step is None or not horizons:
            return lookback  # reported on their own fields
        needed = points_to_refit(max(horizons))
        if lookback < needed * step:
            raise ValueError(
                f"covers {int(lookback // step)} steps; horizons up to {max(horizons)} "
                f"need at least {needed} to be fitted and backtested: set lookback to "
                f"{needed * step:g}s or more, or shorten the horizons"
            )
        return lookback

    @field_validator("models")
    @classmethod
    def _known(cls, models: list[str], info: ValidationInfo) -> list[str]:
        # Imported here: the model catalogue loads torch and statsmodels, which --help need not.
        from predictor.model_names import known_models

        known = known_models(tuple(info.data.get("seasons", ())))
        unknown = [m for m in models if m not in known]
        if unknown:
            raise ValueError(f"unknown model {unknown[0]!r}; choose from: {', '.join(known)}")
        return models

    def to_config(self) -> TargetConfig:
        return TargetConfig(
            name=self.name,
            query=self.query or "",
            step=self.step,
            lookback=self.lookback,
            horizons=tuple(sorted(set(self.horizons))),
            quantile=self.quantile,
            seasons=tuple(self.seasons),
            aggregate=self.aggregate,
            counter=self.counter,
            models=tuple(self.models),
        )


def _target(raw: Any, index: int) -> TargetConfig:
    """A ``targets:`` entry (already a :class:`TargetSettings` when loaded from flags and YAML,
    a mapping when the settings are built in code) as the service's type."""
    if isinstance(raw, TargetSettings):
        return raw.to_config()
    try:
        return TargetSettings.model_validate(raw).to_config()
    except ValidationError as exc:
        raise ConfigError(
            first_error_line(
                exc,
                TargetSettings,
                lambda loc: yaml_path(("targets", index, *loc)),
                sentence=True,
            )
        ) from None


@dataclass(frozen=True)
class PredictorConfig(PrometheusAccessConfig):
    """Flags (and the same keys in ``--config FILE``) of ``autoglm-predictor serve``.

    The ``--prometheus-*`` auth and TLS flags come from :class:`PrometheusAccessConfig`.
    """

    listen: str = field(default=":9401", metadata={"help": "HOST:PORT to serve /metrics on"})
    web_config_file: str = field(
        default="", metadata={"help": "exporter-toolkit web config (TLS, basic auth) for /metrics"}
    )
    prometheus_timeout: str = field(
        default="10s", metadata={"help": "timeout of one Prometheus query"}
    )
    refit_interval: str = field(
        default="1h", metadata={"help": "how often to re-run model selection and refit"}
    )
    update_interval: str = field(
        default="", metadata={"help": "how often to fetch new points (default: smallest step)"}
    )
    targets: list[TargetSettings] = field(
        default_factory=list,
        metadata={"help": "series to forecast (config file only, see README)", "cli": False},
    )
    torch_threads: int = field(default=1, metadata={"help": "CPU threads for the torch model"})
    log_level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata={"help": "log level"}
    )
    log_format: Literal["json", "text"] = field(default="json", metadata={"help": "log format"})
    target_configs: tuple[TargetConfig, ...] = field(
        default=(), init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        parse_listen(self.listen)
        if not self.targets:
            raise ConfigError(
                "no targets: give --config FILE with a 'targets:' list "
                "(each with name, query, step, horizons)"
            )
        parsed = tuple(_target(t, i) for i, t in enumerate(self.targets))
        names = [t.name for t in parsed]
        duplicate = next((n for n in names if names.count(n) > 1), None)
        if duplicate:
            raise ConfigError(f"target name {duplicate!r} is used twice; names must be unique")
        parse_duration(self.prometheus_timeout, "--prometheus-timeout")
        parse_duration(self.refit_interval, "--refit-interval")
        if self.update_interval:
            parse_duration(self.update_interval, "--update-interval")
        if self.torch_threads < 1:
            raise ConfigError("--torch-threads must be >= 1")
        object.__setattr__(self, "target_configs", parsed)

    @property
    def timeout_seconds(self) -> float:
        return parse_duration(self.prometheus_timeout, "--prometheus-timeout")

    @property
    def refit_seconds(self) -> float:
        return parse_duration(self.refit_interval, "--refit-interval")

    @property
    def update_seconds(self) -> float:
        if self.update_interval:
            return parse_duration(self.update_interval, "--update-interval")
        return min(t.step for t in self.target_configs)
