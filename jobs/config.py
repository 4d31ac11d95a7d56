"""Settings of a batch inference job, as flags and YAML keys (see :mod:`autoglm.config`).

``autoglm job run --input requests.jsonl`` and ``input: requests.jsonl`` in a ``--config``
file mean the same. Values are checked here, before any line is read (bounds as pydantic
``Field`` constraints, shared with the Helm chart's values schema; the checks that join fields
in ``__post_init__``); checks that need the file
system (the input exists, the output directory is writable) are made by the runner's
:func:`jobs.plan.prepare`, also before any work.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field

from autoglm.config import ConfigError, check_fields, parse_listen

SHARD_INDEX_ENV = "JOB_COMPLETION_INDEX"
BEST_EFFORT = "best-effort"
#: The request classes the batcher takes by name (batcher/best_effort.py PRIORITY_NAMES).
PRIORITY_NAMES = ("online", BEST_EFFORT)


def _valid_priority(value: str) -> bool:
    """Whether ``value`` is what batcher/oip.py ``request_priority`` accepts once jobs/input.py
    has sent it: empty (none sent), a class name, or ASCII digits (an integer >= 0)."""
    return not value or value in PRIORITY_NAMES or (value.isascii() and value.isdigit())


AtLeastOne = Annotated[int, Field(ge=1)]
PositiveSeconds = Annotated[float, Field(gt=0)]


@dataclass(frozen=True)
class JobConfig:
    """Everything a job run can be told."""

    input: str = field(
        default="",
        metadata={"help": "JSONL file of KServe v2 inference requests, one per line"},
    )
    output: str = field(
        default="", metadata={"help": "JSONL file the answers are appended to (created if absent)"}
    )
    errors: str = field(
        default="",
        metadata={
            "help": "JSONL file of lines that got no answer (default: the output with the "
            "suffix .errors.jsonl: answers.jsonl -> answers.errors.jsonl)"
        },
    )
    journal: str = field(
        default="",
        metadata={
            "help": "progress journal that makes a rerun resume (default: the output's name "
            "plus .journal: answers.jsonl.journal)"
        },
    )
    endpoint: str = field(
        default="",
        metadata={
            "help": "base URL of a batcher or of a Service in front of many, e.g. "
            "http://open-autoglm-batcher:8000"
        },
    )
    model: str = field(
        default="", metadata={"help": 'model name for lines that do not give a "model"'}
    )
    order: Literal["input", "completion"] = field(
        default="input",
        metadata={
            "help": "input: answers in the input file's order; completion: as they "
            "arrive, each with its line number and id"
        },
    )
    priority: str = field(
        default=BEST_EFFORT,
        metadata={
            "help": "sent as parameters.priority on every request: best-effort runs on "
            "capacity online traffic leaves idle; an integer is a Triton priority level; "
            "empty sends none"
        },
    )
    initial_concurrency: AtLeastOne = field(
        default=4,
        metadata={"help": "requests in flight at the start (kept within min..max concurrency)"},
    )
    min_concurrency: AtLeastOne = field(default=1, metadata={"help": "fewest requests in flight"})
    max_concurrency: AtLeastOne = field(default=64, metadata={"help": "most requests in flight"})
    max_rate: Annotated[float, Field(ge=0)] = field(
        default=0.0,
        metadata={
            "help": "most requests a second sent to the endpoint, retries included, evenly "
            "spaced: for an endpoint shared with others or billed by request; the batcher "
            "keeps best-effort work off online latency without it (0: no cap)"
        },
    )
    probe_interval_seconds: Annotated[float, Field(ge=0)] = field(
        default=1.0,
        metadata={
            "help": "while every request in flight waits out a refusal's Retry-After, send one "
            "more line this often: behind a Service another replica (a new one, or one whose "
            "throttle lifted) may have idle capacity before the one that refused (0: never)"
        },
    )
    request_timeout_seconds: PositiveSeconds = field(
        default=60.0, metadata={"help": "longest wait for one answer before trying again"}
    )
    max_server_errors: AtLeastOne = field(
        default=5,
        metadata={
            "help": "a line the server fails (5xx other than 503) this many times is "
            "recorded as an error instead of tried again"
        },
    )
    patience_seconds: PositiveSeconds = field(
        default=300.0,
        metadata={
            "help": "stop (exit 3, resumable) when requests keep failing and no line was "
            "answered for this long; refusals (429/503) never count"
        },
    )
    commit_every: AtLeastOne = field(
        default=256, metadata={"help": "make answers durable after this many"}
    )
    commit_interval_seconds: PositiveSeconds = field(
        default=1.0, metadata={"help": "and at least this often"}
    )
    fail_on_invalid: bool = field(
        default=True,
        metadata={
            "help": "exit 1 when some lines ended in the errors file (--no-fail-on-invalid: "
            "exit 0, as a Kubernetes Job index must to count as complete)"
        },
    )
    drain_seconds: PositiveSeconds = field(
        default=10.0,
        metadata={"help": "on SIGTERM/SIGINT, longest wait for requests in flight"},
    )
    shard_index: Annotated[int, Field(ge=-1)] = field(
        default=-1,
        metadata={
            "help": f"this pod's shard: line i (from 0) is its own when i %% shard_count "
            f"== shard_index (default: ${SHARD_INDEX_ENV}, else 0)"
        },
    )
    shard_count: AtLeastOne = field(
        default=1, metadata={"help": "number of shards the input is split into"}
    )
    job_name: str = field(
        default="", metadata={"help": "job_name label of the metrics (default: the input's stem)"}
    )
    metrics_listen: str = field(
        default="",
        metadata={"help": "HOST:PORT to serve /metrics on, e.g. :9500 (default: none)"},
    )
    web_config_file: str = field(
        default="", metadata={"help": "exporter-toolkit web config for /metrics (TLS, auth)"}
    )
    ca_file: str = field(
        default="", metadata={"help": "CA bundle that signs the endpoint's certificate"}
    )
    cert_file: str = field(
        default="", metadata={"help": "client certificate for the endpoint (mutual TLS)"}
    )
    key_file: str = field(default="", metadata={"help": "key of --cert-file"})
    username: str = field(default="", metadata={"help": "basic auth user for the endpoint"})
    password_file: str = field(
        default="", metadata={"help": "file holding the basic auth password"}
    )
    progress: Literal["auto", "bar", "lines", "off"] = field(
        default="auto",
        metadata={
            "help": "auto: a live bar on a terminal, else a log line every "
            "--progress-interval-seconds"
        },
    )
    progress_interval_seconds: PositiveSeconds = field(
        default=10.0, metadata={"help": "seconds between progress log lines"}
    )
    log_level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata={"help": "log level"}
    )
    log_format: Literal["json", "text"] = field(default="json", metadata={"help": "log format"})

    def __post_init__(self) -> None:
        check_fields(self)
        if not self.input:
            raise ConfigError("--input is required: the JSONL file of requests")
        if not self.output:
            raise ConfigError("--output is required: the JSONL file answers go to")
        if not self.endpoint:
            raise ConfigError("--endpoint is required, e.g. --endpoint http://127.0.0.1:8000")
        parts = urlsplit(self.endpoint)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(
                f"--endpoint {self.endpoint!r} must be an http:// or https:// URL with a host, "
                "e.g. http://open-autoglm-batcher:8000"
            )
        try:
            parts.port  # noqa: B018 -- raises on a port out of range
        except ValueError:
            raise ConfigError(f"--endpoint {self.endpoint!r} has an invalid port") from None
        if not _valid_priority(self.priority):
            raise ConfigError(
                f"--priority {self.priority!r} is not a priority the batcher accepts; use "
                '"best-effort", "online", an integer >= 0 (1 is the highest), or "" to send none'
            )
        if self.min_concurrency > self.max_concurrency:
            raise ConfigError(
                "--min-concurrency must be <= --max-concurrency "
                f"(got {self.min_concurrency} and {self.max_concurrency})"
            )
        if self.shard_index >= self.shard_count:
            raise ConfigError(
                f"--shard-index {self.shard_index} must lie within 0..{self.shard_count - 1} "
                "(--shard-count)"
            )
        if self.metrics_listen:
            parse_listen(self.metrics_listen)
        elif self.web_config_file:
            raise ConfigError(
                "--web-config-file secures the job's /metrics, which it serves only with "
                "--metrics-listen: add --metrics-listen HOST:PORT, or drop --web-config-file"
            )
        if parts.scheme == "http" and (self.ca_file or self.cert_file):
            raise ConfigError("--ca-file and --cert-file need an https:// --endpoint")
        if self.key_file and not self.cert_file:
            raise ConfigError("--key-file needs --cert-file")
        if bool(self.username) != bool(self.password_file):
            raise ConfigError("basic auth needs both --username and --password-file")

    def with_environment(self, environ: Mapping[str, str]) -> JobConfig:
        """The shard index from ``$JOB_COMPLETION_INDEX`` (set by an Indexed Job) when not given."""
        if self.shard_index >= 0:
            return self
        raw = environ.get(SHARD_INDEX_ENV, "0")
        if not raw.isdigit():
            raise ConfigError(f"${SHARD_INDEX_ENV} {raw!r} must be a non-negative integer")
        return dataclasses.replace(self, shard_index=int(raw))

    @property
    def sharded_output(self) -> Path:
        """The output file of this shard: ``results-00003-of-00008.jsonl`` when sharded."""
        return _with_shard(Path(self.output), self)

    @property
    def errors_path(self) -> Path:
        if self.errors:
            return _with_shard(Path(self.errors), self)
        out = self.sharded_output
        return out.with_name(out.stem + ".errors.jsonl")

    @property
    def journal_path(self) -> Path:
        if self.journal:
            return _with_shard(Path(self.journal), self)
        out = self.sharded_output
        return out.with_name(out.name + ".journal")

    @property
    def name(self) -> str:
        return self.job_name or Path(self.input).stem


def _with_shard(path: Path, config: JobConfig) -> Path:
    if config.shard_count == 1:
        return path
    index = max(config.shard_index, 0)
    return path.with_name(f"{path.stem}-{index:05d}-of-{config.shard_count:05d}{path.suffix}")
