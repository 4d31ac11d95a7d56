"""Settings of the batching runtime, as flags and YAML keys (see :mod:`autoglm.config`).

One dataclass describes every setting the CLI, the HTTP server and the in-process engine read, so
``autoglm-batcher --slo-seconds 0.2`` and ``slo_seconds: 0.2`` in a ``--config`` file mean the same.
Bounds are pydantic ``Field`` constraints, checked by :func:`autoglm.config.check_fields` and
shared with the Helm chart's values schema; the checks that join fields are in ``__post_init__``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import Field

from autoglm.config import ConfigError, check_fields, parse_listen
from autoglm.web.body_timeout import BODY_TIMEOUT_S

MAX_SUPPORTED_BATCH = 4096
MAX_WORKERS = 64

AtLeastZero = Annotated[int, Field(ge=0)]
AtLeastOne = Annotated[int, Field(ge=1)]
Seconds = Annotated[float, Field(ge=0)]
PositiveSeconds = Annotated[float, Field(gt=0)]


@dataclass(frozen=True)
class BatcherConfig:
    """Everything the batching runtime can be told."""

    model: str = field(
        default="batcher.models.demo:factory",
        metadata={"help": "package.module:factory returning a torch module or a batch callable"},
    )
    model_name: str = field(
        default="",
        metadata={"help": "name served under /v2/models/NAME (default: the factory's module)"},
    )
    checkpoint: str = field(
        default="",
        metadata={"help": "checkpoint path passed to the factory as checkpoint=PATH"},
    )
    listen: str = field(default=":8000", metadata={"help": "HOST:PORT to serve HTTP on"})
    grpc_listen: str = field(
        default="",
        metadata={
            "help": "HOST:PORT to also serve KServe v2 gRPC on (inference.GRPCInferenceService, "
            "same model, batches and admission), e.g. :8001; empty: no gRPC"
        },
    )
    workers: Annotated[int, Field(ge=0, le=MAX_WORKERS)] = field(
        default=0,
        metadata={
            "help": "front worker processes that serve --listen beside the engine (HTTP, TLS, "
            "auth and JSON decoding off the process that batches; batches still form across "
            "all of them); 0: one process serves everything"
        },
    )
    model_repository: str = field(
        default="",
        metadata={
            "help": "folder with one subfolder per model, each holding config.yaml (that model's "
            "settings: model, max_batch_size, slo_seconds, ...); serves them all on one device "
            "instead of --model; empty: serve --model alone"
        },
    )
    startup_models: list[str] = field(
        default_factory=list,
        metadata={
            "help": "models of --model-repository loaded at start (default: all of them); the "
            "others load through the repository API"
        },
    )
    repository_memory_bytes: AtLeastZero = field(
        default=0,
        metadata={
            "help": "device memory the loaded models may take together (parameters plus the "
            "learned batch footprint); a load past it is refused (0: what the device has free "
            "on CUDA, no limit on CPU)"
        },
    )
    max_batch_size: Annotated[int, Field(ge=1, le=MAX_SUPPORTED_BATCH)] = field(
        default=32, metadata={"help": "largest batch (in items) the model is ever given"}
    )
    slo_seconds: PositiveSeconds = field(
        default=0.25,
        metadata={"help": "latency target per request (queue + compute); batches are sized to it"},
    )
    policy: Literal["adaptive", "fixed-delay"] = field(
        default="adaptive",
        metadata={
            "help": "adaptive: deadline-aware batches with an online cap; fixed-delay: a "
            "Triton-style baseline (max queue delay + preferred size), for comparison"
        },
    )
    dispatch: Literal["auto", "eager", "fill"] = field(
        default="auto",
        metadata={
            "help": "adaptive policy: eager starts a partial batch while the device keeps up "
            "(lowest latency; the device would idle otherwise), fill lets batches grow within "
            "the SLO (fewer, larger batches: less CPU per request where the model's time is "
            "the server's CPU); auto: fill on CPU, eager on CUDA"
        },
    )
    max_queue_delay_seconds: Seconds = field(
        default=0.0,
        metadata={"help": "fixed-delay policy only: longest wait for a batch to fill"},
    )
    preferred_batch_size: AtLeastZero = field(
        default=0,
        metadata={"help": "fixed-delay policy only: dispatch at once at this size (0: max)"},
    )
    max_queue: int = field(
        default=1024,
        metadata={"help": "items allowed to wait; more are refused at once with HTTP 429"},
    )
    refuse_past_slo: bool = field(
        default=True,
        metadata={
            "help": "refuse at once (HTTP 429) a request predicted to finish past "
            "--slo-seconds, instead of serving it late; requests with their own timeout are "
            "judged by it instead"
        },
    )
    default_timeout_seconds: PositiveSeconds = field(
        default=30.0,
        metadata={"help": "a request not started by then is answered with a timeout"},
    )
    priority_levels: AtLeastOne = field(
        default=1,
        metadata={"help": "priority levels accepted (1 = highest, as in Triton; 0 = default)"},
    )
    default_priority: int = field(
        default=1, metadata={"help": "level of requests that give no priority"}
    )
    best_effort_priority: int = field(
        default=0,
        metadata={
            "help": "integer priority from which a request is best-effort (as tritonclient "
            'sends priority=N; "best-effort" also works); 0: one past --priority-levels'
        },
    )
    best_effort_quantum_seconds: Seconds = field(
        default=0.0,
        metadata={
            "help": "longest predicted run of one best-effort batch, so an arriving online "
            "request waits at most about this long (0: a tenth of --slo-seconds)"
        },
    )
    best_effort_max_queue: AtLeastZero = field(
        default=0,
        metadata={
            "help": "best-effort items allowed to wait; more are refused at once with HTTP 429 "
            "(0: two quantum-sized batches)"
        },
    )
    best_effort_slack_margin: Annotated[float, Field(ge=0, lt=1)] = field(
        default=0.1,
        metadata={
            "help": "best-effort backs off while the online slack (SLO minus recent online p99) "
            "is under this fraction of --slo-seconds, and stops when it is gone"
        },
    )
    best_effort_window_seconds: PositiveSeconds = field(
        default=10.0,
        metadata={"help": "window of recent online latencies whose p99 gives the slack"},
    )
    utilization_cap: Annotated[float, Field(gt=0, le=1)] = field(
        default=1.0,
        metadata={"help": "largest busy fraction of the device, to leave room for co-tenants"},
    )
    device: Literal["auto", "cpu", "cuda"] = field(
        default="auto", metadata={"help": "where a torch module runs (auto: cuda if present)"}
    )
    torch_threads: AtLeastZero = field(
        default=0,
        metadata={"help": "torch.set_num_threads for a torch module on CPU (0: torch's default)"},
    )
    expandable_segments: bool = field(
        default=True,
        metadata={"help": "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before CUDA"},
    )
    padding: Literal["auto", "on", "off"] = field(
        default="auto",
        metadata={
            "help": "pad batches to bucket sizes chosen from the warm-up's timings (auto: on "
            "for cuda; on cpu only the batches near a size that a larger one was measured "
            "cheaper than)"
        },
    )
    pad_buckets: list[AtLeastOne] = field(
        default_factory=list,
        metadata={"help": "bucket sizes for padding, instead of those the warm-up chooses"},
    )
    warmup_repeats: AtLeastZero = field(
        default=5,
        metadata={
            "help": "before serving, time the model this many times at each power-of-two batch "
            "size to seed the cost model and choose pad buckets (0: no warm-up)"
        },
    )
    idle_release_seconds: Seconds = field(
        default=30.0,
        metadata={"help": "release cached device memory after this long idle (0: never)"},
    )
    max_body_bytes: Annotated[int, Field(ge=1024)] = field(
        default=16 << 20, metadata={"help": "largest request body accepted (HTTP 400 above)"}
    )
    body_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = field(
        default=BODY_TIMEOUT_S,
        metadata={
            "help": "longest pause in a request body's arrival; after that long the body must "
            "also average 16 KiB/s; a body that stops gets HTTP 408 and its connection closed"
        },
    )
    drain_timeout_seconds: PositiveSeconds = field(
        default=60.0,
        metadata={"help": "on SIGTERM, longest wait for queued and running work to finish"},
    )
    web_config_file: str = field(
        default="", metadata={"help": "exporter-toolkit web config (TLS, basic auth)"}
    )
    model_process: bool = field(
        default=False,
        metadata={
            "help": "run the model in a child process of its own, out of the server's "
            "interpreter lock (the server's request handling then cannot stall the model "
            "between operators); a child that dies is replaced. In a model repository, each "
            "model with it set runs in a process of its own (CPU models there)"
        },
    )
    exit_with_parent: bool = field(
        default=False,
        metadata={
            "help": "drain and exit when the process that started this one is gone (workers "
            "of a local process group, so none outlives a killed supervisor)"
        },
    )
    log_level: Literal["debug", "info", "warning", "error"] = field(
        default="info", metadata={"help": "log level"}
    )
    log_format: Literal["json", "text"] = field(default="json", metadata={"help": "log format"})

    def __post_init__(self) -> None:
        check_fields(self)
        if ":" not in self.model or self.model.startswith(":") or self.model.endswith(":"):
            raise ConfigError(
                f"--model {self.model!r} must be package.module:factory, "
                "e.g. batcher.models.demo:factory"
            )
        parse_listen(self.listen)
        if self.grpc_listen:
            grpc_address = parse_listen(self.grpc_listen)
            if grpc_address[1] and grpc_address == parse_listen(self.listen):
                raise ConfigError(
                    f"--grpc-listen {self.grpc_listen} is the HTTP --listen address; give gRPC "
                    "its own port, e.g. :8001"
                )
        if self.startup_models and not self.model_repository:
            raise ConfigError(
                "--startup-models names models of a repository; give --model-repository too"
            )
        if self.preferred_batch_size > self.max_batch_size:
            raise ConfigError(
                f"--preferred-batch-size must be within 0..{self.max_batch_size} (max batch size)"
            )
        if self.max_queue < self.max_batch_size:
            raise ConfigError(
                f"--max-queue {self.max_queue} must be at least --max-batch-size "
                f"{self.max_batch_size}, or no batch could ever fill"
            )
        if not 1 <= self.default_priority <= self.priority_levels:
            raise ConfigError(
                f"--default-priority must be within 1..{self.priority_levels} (--priority-levels)"
            )
        if self.best_effort_priority < 0 or 0 < self.best_effort_priority <= self.priority_levels:
            raise ConfigError(
                f"--best-effort-priority must be 0 (one past --priority-levels) or above "
                f"--priority-levels {self.priority_levels}, e.g. {self.priority_levels + 1}"
            )
        bad = [b for b in self.pad_buckets if b > self.max_batch_size]
        if bad:
            raise ConfigError(
                f"--pad-buckets {bad[0]} must be within 1..{self.max_batch_size} (max batch size)"
            )

    @property
    def buckets(self) -> tuple[int, ...]:
        """Padding bucket sizes, ascending, always ending at ``max_batch_size``."""
        if self.pad_buckets:
            chosen = set(self.pad_buckets)
        else:
            chosen = {1 << k for k in range(self.max_batch_size.bit_length())}
        chosen.add(self.max_batch_size)
        return tuple(sorted(b for b in chosen if b <= self.max_batch_size))
