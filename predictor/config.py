"""Settings of the predictor: where series come from (targets, Prometheus) and how it serves.

Targets are a list in the YAML file (``--config``); each names a series, the PromQL that yields
it, its step, lookback, horizons (in steps), quantile and seasons. Everything else also has a
flag. Durations accept seconds or Prometheus-style units ("30s", "15m", "1h", "7d", "1w").
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from autoglm.config import ConfigError, parse_listen
from autoglm.prometheus_api import PrometheusAccessConfig

_UNITS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 604800.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?\s*$")


def parse_duration(value: Any, what: str) -> float:
    """Seconds from a number or a string like "15m"; ConfigError naming ``what`` otherwise."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}: {value!r} is not a duration; use seconds or e.g. 15m, 1h")
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


TARGET_KEYS = {
    "name",
    "query",
    "step",
    "lookback",
    "horizons",
    "quantile",
    "seasons",
    "aggregate",
    "counter",
    "models",
}


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

    @classmethod
    def from_mapping(cls, raw: Any, index: int) -> TargetConfig:
        where = f"targets[{index}]"
        if not isinstance(raw, dict):
            raise ConfigError(f"{where} must be a mapping with at least name and query")
        unknown = sorted(set(raw) - TARGET_KEYS)
        if unknown:
            raise ConfigError(
                f"{where}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(TARGET_KEYS))}"
            )
        name = str(raw.get("name", "")).strip()
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_:.-]*", name):
            raise ConfigError(f"{where}: name {name!r} must be a word like 'requests'")
        horizons = raw.get("horizons", cls.horizons)
        if not isinstance(horizons, (list, tuple)) or not horizons:
            raise ConfigError(f"{where}.horizons must be a list of steps ahead, e.g. [1, 2, 5]")
        try:
            hs = tuple(sorted({int(h) for h in horizons}))
        except (TypeError, ValueError):
            raise ConfigError(f"{where}.horizons must hold whole numbers of steps") from None
        if hs[0] < 1:
            raise ConfigError(f"{where}.horizons must be >= 1 (steps ahead)")
        quantile = raw.get("quantile", cls.quantile)
        if not isinstance(quantile, (int, float)) or not 0.5 <= float(quantile) < 1:
            raise ConfigError(f"{where}.quantile must be in [0.5, 1), e.g. 0.9")
        aggregate = raw.get("aggregate", cls.aggregate)
        if aggregate not in ("mean", "sum", "last"):
            raise ConfigError(f"{where}.aggregate must be mean, sum or last")
        seasons = raw.get("seasons", list(cls.seasons))
        if not isinstance(seasons, (list, tuple)):
            raise ConfigError(f"{where}.seasons must be a list of durations, e.g. [1d, 1w]")
        models = raw.get("models", [])
        if not isinstance(models, (list, tuple)):
            raise ConfigError(f"{where}.models must be a list of model names")
        # Imported here: the model catalogue loads torch and statsmodels, which --help need not.
        from predictor.models.catalog import known_models
        from predictor.selection import minimum_history

        season_seconds = tuple(parse_duration(s, f"{where}.seasons") for s in seasons)
        known = known_models(season_seconds)
        unknown = [str(m) for m in models if str(m) not in known]
        if unknown:
            raise ConfigError(
                f"{where}.models: unknown model {unknown[0]!r}; choose from: {', '.join(known)}"
            )
        step = parse_duration(raw.get("step", cls.step), f"{where}.step")
        lookback = parse_duration(raw.get("lookback", cls.lookback), f"{where}.lookback")
        needed = max(10, minimum_history(max(hs)))
        if lookback < needed * step:
            raise ConfigError(
                f"{where}.lookback covers {int(lookback // step)} steps; horizons up to {max(hs)} "
                f"need at least {needed} to be backtested: set lookback to {needed * step:g}s or "
                "more, or shorten the horizons"
            )
        return cls(
            name=name,
            query=str(raw.get("query", "") or ""),
            step=step,
            lookback=lookback,
            horizons=hs,
            quantile=float(quantile),
            seasons=season_seconds,
            aggregate=aggregate,
            counter=bool(raw.get("counter", False)),
            models=tuple(str(m) for m in models),
        )


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
    targets: list[dict] = field(
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
        parsed = tuple(TargetConfig.from_mapping(t, i) for i, t in enumerate(self.targets))
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
