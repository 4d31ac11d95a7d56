"""``autoglm-batcher``: serve a torch model with adaptive batching over KServe v2 HTTP.

    autoglm-batcher --model package.module:factory --listen HOST:PORT

Start-up order matters: the allocator setting must be in the environment before anything touches
CUDA, so it is applied before the model is imported. SIGTERM (and Ctrl-C) drain: the server stops
being ready, answers everything it accepted, then exits 0 (1 if the drain timed out).
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from collections.abc import Sequence

import torch
from prometheus_client import CollectorRegistry

from autoglm.config import ConfigError, load_config
from autoglm.logs import setup_logging
from autoglm.webconfig import WebConfig
from batcher.config import BatcherConfig
from batcher.engine import from_config
from batcher.execution import ThreadExecutor
from batcher.memory import MemoryMonitor, configure_allocator, resolve_device
from batcher.metrics import BatcherMetrics
from batcher.model import ServedModel, load_model
from batcher.server import BatcherServer
from batcher.warmup import warm_up

PROG = "autoglm-batcher"
log = logging.getLogger(__name__)


def main(argv: Sequence[str] | None = None) -> int:
    config = load_config(
        BatcherConfig,
        argv,
        prog=PROG,
        description="Serve a torch model with adaptive dynamic batching (KServe v2 over HTTP).",
    )
    setup_logging("batcher", config.log_level, config.log_format)
    allocator = configure_allocator(config.expandable_segments, os.environ)
    device = resolve_device(config.device)
    if config.torch_threads:
        torch.set_num_threads(config.torch_threads)
    try:
        web_config = WebConfig.load(config.web_config_file or None)
        model = load_model(
            config.model,
            name=config.model_name,
            checkpoint=config.checkpoint,
            device=device,
        )
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    log.info(
        "model loaded",
        extra={"model": model.name, "device": device, "allocator": allocator},
    )
    return asyncio.run(serve(config, model, web_config))


async def serve(config: BatcherConfig, model: ServedModel, web_config: WebConfig) -> int:
    """Run until SIGTERM or SIGINT, then drain; the exit code says whether the drain finished."""
    registry = CollectorRegistry()
    metrics = BatcherMetrics(registry, model.name, config.slo_seconds, config.max_batch_size)
    memory = MemoryMonitor(model.device, config.idle_release_seconds)
    metrics.watch_memory(memory.stats)
    executor = ThreadExecutor(model.run, model.batch_size_for, memory)
    batcher = from_config(executor, config, memory=memory, metrics=metrics)
    await warm_up(batcher, model, config)
    server = BatcherServer(
        model,
        batcher,
        registry,
        listen=config.listen,
        web_config=web_config,
        max_body_bytes=config.max_body_bytes,
    )
    try:
        await server.start()
    except ConfigError as exc:
        executor.close()
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    watch = asyncio.create_task(_stop_when_orphaned(stop)) if config.exit_with_parent else None
    await stop.wait()
    if watch is not None:
        watch.cancel()
    finished = await server.shutdown(config.drain_timeout_seconds)
    return 0 if finished else 1


async def _stop_when_orphaned(stop: asyncio.Event, every_seconds: float = 1.0) -> None:
    """Set ``stop`` once this process's parent is gone (it is re-parented, so the id changes).

    A supervisor killed with SIGKILL cannot stop its workers; this way they stop themselves.
    """
    parent = os.getppid()
    while os.getppid() == parent:
        await asyncio.sleep(every_seconds)
    log.warning("parent process gone; draining and exiting", extra={"parent_pid": parent})
    stop.set()


if __name__ == "__main__":
    raise SystemExit(main())
