"""``autoglm-batcher``: serve a torch model with adaptive batching over KServe v2 HTTP.

    autoglm-batcher --model package.module:factory --listen HOST:PORT
    autoglm-batcher --model-repository FOLDER --listen HOST:PORT   # several models, one device
    autoglm-batcher --model package.module:factory --workers 2     # HTTP in 2 more processes

Start-up order matters. Settings that can be checked cheaply (the checkpoint file, the device,
the listen port, the web config) are checked before torch and the model are imported, so a
mistake costs one line at once rather than a failure after the model has loaded and warmed up.
The allocator setting must be in the environment before anything touches CUDA, so it is applied
before the model is imported. SIGTERM (and Ctrl-C) drain: the server stops being ready, answers
everything it accepted, then exits 0 (1 if the drain timed out).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autoglm.config import EXIT_USAGE, ConfigError, check_can_listen, load_config
from autoglm.logs import setup_logging
from autoglm.webconfig import WebConfig
from batcher.config import BatcherConfig
from batcher.torch_loaded import set_torch_threads

if TYPE_CHECKING:  # torch and the model's modules are imported once the settings are known good
    from prometheus_client import CollectorRegistry

    from batcher.model import ServedModel
    from batcher.repository import ModelRepository

PROG = "autoglm-batcher"
log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    parent = os.getppid()  # before anything slow: a supervisor may be killed while we load
    config = load_config(
        BatcherConfig,
        argv,
        prog=PROG,
        description="Serve a torch model with adaptive dynamic batching (KServe v2 over HTTP).",
    )
    setup_logging("batcher", config.log_level, config.log_format)
    try:
        if config.model_repository:
            check_repository(config)
        check_checkpoint_file(config.checkpoint)
        check_can_listen(config.listen)
        if config.grpc_listen:
            check_can_listen(config.grpc_listen, "--grpc-listen")
        web_config = WebConfig.load(config.web_config_file or None)
        if config.grpc_listen:
            from batcher.grpc_face import check_grpc_can_enforce  # grpc, only when asked for

            check_grpc_can_enforce(web_config.tls_material())
        device = usable_device(config.device)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if config.model_repository:
        from batcher.memory import resolve_device

        configure_torch(config)
        # ``auto`` decided now, asking torch: the repository loads its models later, on one device
        device = resolve_device(device)
        return asyncio.run(serve_repository(config, device, web_config, parent))
    model = start_model(config, device)
    if model is None:
        return EXIT_USAGE
    return asyncio.run(serve(config, model, web_config, parent))


def check_repository(config: BatcherConfig) -> None:
    """:class:`ConfigError` when the repository folder or ``--startup-models`` is unusable
    (each model's own settings are checked as it loads)."""
    from batcher.repository_folder import check_folder, model_names

    check_folder(config.model_repository)
    names = model_names(config.model_repository)
    if not names:
        raise ConfigError(
            f"--model-repository {config.model_repository!r} holds no model: add a subfolder "
            "per model with its config.yaml"
        )
    missing = [n for n in config.startup_models if n not in names]
    if missing:
        raise ConfigError(
            f"--startup-models {missing[0]!r} is not in {config.model_repository} (it holds: "
            f"{', '.join(names)})"
        )


def configure_torch(config: BatcherConfig) -> str:
    """The CUDA allocator's setting, before any model is built; returns the allocator's line.
    It is an environment variable (the model process's child inherits it), so torch is not
    imported for it: a model that is not a torch module never loads torch."""
    from batcher.memory import configure_allocator

    return configure_allocator(config.expandable_segments, os.environ)


def check_checkpoint_file(path: str) -> None:
    """:class:`ConfigError` when ``--checkpoint`` names nothing readable (the format is the
    factory's to judge, when it loads the file)."""
    if not path:
        return
    checkpoint = Path(path)
    if not checkpoint.exists():
        raise ConfigError(
            f"--checkpoint {path!r}: no such file; give the path of a checkpoint saved with "
            "torch.save(model.state_dict(), PATH), or drop --checkpoint"
        )
    if not checkpoint.is_file():
        raise ConfigError(f"--checkpoint {path!r} is not a file; give the checkpoint file itself")
    if not os.access(checkpoint, os.R_OK):
        raise ConfigError(f"--checkpoint {path!r} is not readable by this user; fix its mode")


def usable_device(setting: str) -> str:
    """The device to serve on; :class:`ConfigError` for ``cuda`` where torch sees no CUDA device.
    ``auto`` is returned as it is: asking torch would import it, and whether that is worth it
    depends on the model (:func:`batcher.model.wrap_model` settles it, in this process or in the
    model's child; :func:`main` for a model repository)."""
    if setting == "cuda":
        import torch

        if not torch.cuda.is_available():
            build = "this torch is a CPU build" if torch.version.cuda is None else "no driver/GPU"
            raise ConfigError(
                f"--device cuda: torch sees no CUDA device ({build}); use --device cpu, or "
                "--device auto to take a GPU when there is one"
            )
    return setting


def start_model(config: BatcherConfig, device: str) -> ServedModel | None:
    """The model to serve: loaded here, or in a child process with ``--model-process``; None
    (after one line on stderr) on a problem."""
    if not config.model_process:
        return load_or_explain(config, device)
    from batcher.model import ServedModel
    from batcher.model_process import ModelProcess, ModelProcessFailed

    configure_torch(config)  # the allocator's environment is the child's too
    process = ModelProcess(config, device)  # the child settles ``auto`` as it loads the model
    try:
        process.start()
    except ModelProcessFailed as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return None
    return ServedModel.from_process(process)


def load_or_explain(config: BatcherConfig, device: str) -> ServedModel | None:
    """Import torch and the model, and load it; None (after one line on stderr) on a problem."""
    try:
        return load_served_model(config, device)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return None


def load_served_model(config: BatcherConfig, device: str) -> ServedModel:
    """Load the model; :class:`ConfigError` with one line naming the problem and the fix."""
    from batcher.model import load_model

    allocator = configure_torch(config)
    try:
        model = load_model(
            config.model, name=config.model_name, checkpoint=config.checkpoint, device=device
        )
    except ConfigError:
        raise
    except Exception as exc:  # the factory's own failure: one line, the traceback at debug level
        log.debug("building the model failed", exc_info=True)
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        if config.checkpoint:
            problem = (
                f"--checkpoint {config.checkpoint!r} could not be loaded by {config.model} "
                f"({type(exc).__name__}: {reason}); give a checkpoint saved for this model"
            )
        else:
            problem = (
                f"--model {config.model}: building the model failed "
                f"({type(exc).__name__}: {reason})"
            )
        raise ConfigError(f"{problem}; --log-level debug shows the traceback") from None
    set_torch_threads(config.torch_threads)
    loaded = {"model": model.name, "device": model.device}
    if model.device.startswith("cuda"):  # the CUDA allocator's setting says nothing on a CPU
        loaded["allocator"] = allocator
    log.info("model loaded", extra=loaded)
    return model


async def serve(
    config: BatcherConfig, model: ServedModel, web_config: WebConfig, parent: int
) -> int:
    """Serve one model until SIGTERM or SIGINT, then drain; the exit code says whether the drain
    finished."""
    from prometheus_client import CollectorRegistry

    from batcher.engine import from_config
    from batcher.memory import MemoryMonitor
    from batcher.metrics import BatcherMetrics
    from batcher.model_process import ModelProcess, ReportedMemory
    from batcher.repository import LoadedModel, ModelRepository
    from batcher.repository_metrics import RepositoryMetrics
    from batcher.warmup import warm_up

    model_registry = CollectorRegistry()
    metrics = BatcherMetrics(model_registry, model.name, config.slo_seconds, config.max_batch_size)
    memory = (
        ReportedMemory(model.run, model.device, config.idle_release_seconds)
        if isinstance(model.run, ModelProcess)  # the device's memory is the child's to read
        else MemoryMonitor(model.device, config.idle_release_seconds)
    )
    metrics.watch_memory(memory.stats)
    executor = model.executor(memory, model_registry)
    batcher = from_config(
        executor, config, model_device=model.device, memory=memory, metrics=metrics
    )
    await warm_up(batcher, model, config)
    registry = CollectorRegistry()
    repository_metrics = RepositoryMetrics()
    registry.register(repository_metrics)
    models = ModelRepository(metrics=repository_metrics, device=batcher.device)
    models.add(LoadedModel(model, batcher, model_registry, model.parameter_bytes()))
    return await _serve_until_stopped(config, models, registry, web_config, executor.close, parent)


async def serve_repository(
    config: BatcherConfig, device: str, web_config: WebConfig, parent: int
) -> int:
    """Serve the models of ``--model-repository`` on one device until SIGTERM or SIGINT."""
    from prometheus_client import CollectorRegistry

    from batcher.errors import RepositoryError
    from batcher.memory import MemoryMonitor
    from batcher.metrics import allocator_collector
    from batcher.repository import ModelRepository
    from batcher.repository_loader import FolderSource
    from batcher.repository_metrics import RepositoryMetrics

    registry = CollectorRegistry()
    memory = MemoryMonitor(device, config.idle_release_seconds)
    registry.register(allocator_collector("", memory.stats))
    repository_metrics = RepositoryMetrics()
    registry.register(repository_metrics)
    source = FolderSource(config.model_repository, config, device, memory)
    models = ModelRepository(
        source,
        metrics=repository_metrics,
        memory_budget_bytes=config.repository_memory_bytes,
        drain_timeout_seconds=config.drain_timeout_seconds,
    )
    for name in config.startup_models or source.names():
        try:
            await models.load(name)
        except RepositoryError as exc:
            await models.drain(config.drain_timeout_seconds)
            print(f"{PROG}: error: {exc}", file=sys.stderr)
            return EXIT_USAGE
    return await _serve_until_stopped(config, models, registry, web_config, lambda: None, parent)


async def _serve_until_stopped(
    config: BatcherConfig,
    models: ModelRepository,
    registry: CollectorRegistry,
    web_config: WebConfig,
    on_failed_start: Callable[[], None],
    parent: int,
) -> int:
    """Listen, wait for SIGTERM or SIGINT (or an orphaning), then drain; exit code 0 when the
    drain finished, 1 when it timed out, 2 when the server could not listen."""
    from autoglm.gc_pauses import GcPauses, freeze_startup_heap
    from batcher.server import BatcherServer
    from batcher.worker_pool import WorkerSettings

    workers = WorkerSettings(
        count=config.workers,
        web_config_file=config.web_config_file,
        max_body_bytes=config.max_body_bytes,
        body_timeout_seconds=config.body_timeout_seconds,
        drain_timeout_seconds=config.drain_timeout_seconds,
        log_level=config.log_level,
        log_format=config.log_format,
    )
    server = BatcherServer(
        models,
        registry,
        listen=config.listen,
        web_config=web_config,
        max_body_bytes=config.max_body_bytes,
        body_timeout_seconds=config.body_timeout_seconds,
        grpc_listen=config.grpc_listen,
        workers=workers,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (
        signal.SIGTERM,
        signal.SIGINT,
    ):  # before the "serving" line: a signal after it drains
        loop.add_signal_handler(sig, stop.set)
    gc_pauses = GcPauses(registry, "autoglm_batcher")
    gc_pauses.install()
    freeze_startup_heap()  # the long walk, while nothing listens yet
    try:
        await server.start()
    except ConfigError as exc:
        gc_pauses.remove()
        on_failed_start()
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    # what starting the server built joins it, without another walk
    log.info("start-up heap frozen", extra={"objects": freeze_startup_heap(collect=False)})
    watch = (
        asyncio.create_task(stop_when_orphaned(stop, parent)) if config.exit_with_parent else None
    )
    await stop.wait()
    if watch is not None:
        watch.cancel()
    finished = await server.shutdown(config.drain_timeout_seconds)
    gc_pauses.remove()
    return 0 if finished else 1


async def stop_when_orphaned(stop: asyncio.Event, parent: int, every_seconds: float = 1.0) -> None:
    """Set ``stop`` once ``parent`` (this process's parent, recorded when it started) is gone:
    the process is re-parented, so the id changes. Recorded at start, not here, so a parent killed
    while the model loads or the heap is frozen is still noticed.

    A supervisor killed with SIGKILL cannot stop its workers; this way they stop themselves (and
    the front workers of ``--workers`` so stop when their engine is killed).
    """
    while os.getppid() == parent:
        await asyncio.sleep(every_seconds)
    log.warning("parent process gone; draining and exiting", extra={"parent_pid": parent})
    stop.set()


if __name__ == "__main__":
    raise SystemExit(main())
