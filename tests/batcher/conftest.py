"""Fixtures for the batcher tests: a virtual-time event loop and real servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import pytest

from batcher.simulation import VirtualTimeLoop

T = TypeVar("T")


@pytest.fixture
def run_virtual() -> Iterator[Callable[[Callable[[], Awaitable[T]]], T]]:
    """Run an async function to completion in virtual time; the loop is closed afterwards."""
    loops: list[VirtualTimeLoop] = []

    def run(main: Callable[[], Awaitable[Any]]) -> Any:
        loop = VirtualTimeLoop()
        loops.append(loop)
        return loop.run_until_complete(main())

    yield run
    for loop in loops:
        loop.close()


class ServerThread:
    """A real :class:`BatcherServer` on 127.0.0.1 with its own event loop in a thread.

    Tests talk to it with real HTTP clients (requests, tritonclient) from the test thread.
    """

    def __init__(self, served: object, web_config: object = None, **settings: object) -> None:
        from batcher.config import BatcherConfig
        from batcher.model import wrap_model

        settings.setdefault("listen", "127.0.0.1:0")
        self.config = BatcherConfig(**settings)
        self.model = wrap_model(served, name=self.config.model_name)
        self.web_config = web_config
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="batcher-test-server")
        self.server = None
        self.batcher = None

    def start(self) -> ServerThread:
        from prometheus_client import CollectorRegistry

        from batcher.engine import from_config
        from batcher.execution import ThreadExecutor
        from batcher.memory import MemoryMonitor
        from batcher.metrics import BatcherMetrics
        from batcher.repository import LoadedModel, ModelRepository
        from batcher.repository_metrics import RepositoryMetrics
        from batcher.server import BatcherServer
        from batcher.warmup import warm_up

        self.thread.start()
        config = self.config
        model_registry = CollectorRegistry()
        metrics = BatcherMetrics(
            model_registry, self.model.name, config.slo_seconds, config.max_batch_size
        )
        memory = MemoryMonitor(self.model.device, config.idle_release_seconds)
        metrics.watch_memory(memory.stats)
        registry = CollectorRegistry()
        repository_metrics = RepositoryMetrics()
        registry.register(repository_metrics)

        async def build() -> BatcherServer:
            executor = ThreadExecutor(self.model.run, self.model.batch_size_for, memory)
            batcher = from_config(
                executor, config, model_device=self.model.device, memory=memory, metrics=metrics
            )
            await warm_up(batcher, self.model, config)
            models = ModelRepository(metrics=repository_metrics, device=batcher.device)
            models.add(LoadedModel(self.model, batcher, model_registry))
            self.batcher = batcher
            server = BatcherServer(
                models,
                registry,
                listen=config.listen,
                web_config=self.web_config,
                max_body_bytes=config.max_body_bytes,
                body_timeout_seconds=config.body_timeout_seconds,
                grpc_listen=config.grpc_listen,
            )
            await server.start()
            return server

        self.server = asyncio.run_coroutine_threadsafe(build(), self.loop).result(timeout=30)
        return self

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.port}"

    def stop(self) -> None:
        if self.server is not None:
            asyncio.run_coroutine_threadsafe(self.server.shutdown(10.0), self.loop).result(30)
            self.server = None
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=30)
        self.loop.close()


@pytest.fixture
def served() -> Iterator[list[Any]]:
    """Server processes a test started (each with a ``stop()``, as ``Served`` of
    test_batcher_workers); every one is stopped at teardown, pass or fail."""
    started: list[Any] = []
    yield started
    for server in started:
        server.stop()


@pytest.fixture
def serve() -> Iterator[Callable[..., ServerThread]]:
    """Start servers for a test; all are shut down (drained) at teardown."""
    started: list[ServerThread] = []

    def start(served: object, web_config: object = None, **settings: object) -> ServerThread:
        server = ServerThread(served, web_config, **settings).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()
