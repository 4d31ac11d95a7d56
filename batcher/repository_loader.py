"""Loading the models of a repository folder: import, size check, device, engine, warm-up.

A load happens while the other models serve, so nothing slow runs on the event loop: the
factory is imported and called on a worker thread, and the warm-up's batches wait their turn on
the shared device behind the other models' online batches. A torch module is built on the CPU
first and its parameters and buffers are counted before it goes to the device, so a model that
would not fit is refused without touching the device the others are using.
"""

from __future__ import annotations

import asyncio
import gc

from prometheus_client import CollectorRegistry

from autoglm.config import ConfigError
from batcher.config import BatcherConfig
from batcher.device import SharedDevice
from batcher.engine import from_config
from batcher.errors import LoadFailed, ModelConfigInvalid
from batcher.memory import MemoryMonitor
from batcher.metrics import BatcherMetrics
from batcher.model import ModuleRunner, ServedModel, load_model, module_bytes, wrap_model
from batcher.model_process import ModelProcess, ModelProcessFailed
from batcher.repository import LoadedModel, MemoryCheck
from batcher.repository_folder import model_config, model_names
from batcher.torch_loaded import set_torch_threads
from batcher.warmup import warm_up


class FolderSource:
    """The models of a ``--model-repository`` folder, built on one device."""

    def __init__(self, folder: str, base: BatcherConfig, device: str, memory: MemoryMonitor):
        self.folder = folder
        self.base = base
        self.device = device
        self.memory = memory

    def names(self) -> list[str]:
        return model_names(self.folder)

    def config(self, name: str) -> BatcherConfig:
        return model_config(self.folder, name, self.base)

    async def load(self, name: str, device: SharedDevice, check: MemoryCheck) -> LoadedModel:
        config = self.config(name)
        build = self._start_process if config.model_process else self._build
        model, parameter_bytes = await asyncio.to_thread(build, config, check)
        set_torch_threads(config.torch_threads)  # here: the executor reads it on this thread
        registry = CollectorRegistry()
        metrics = BatcherMetrics(registry, name, config.slo_seconds, config.max_batch_size)
        executor = model.executor(self.memory, registry)
        batcher = from_config(
            executor,
            config,
            model_device=model.device,
            memory=self.memory,
            metrics=metrics,
            device=device,
        )
        try:
            await warm_up(batcher, model, config)
        except BaseException:
            executor.close()
            raise
        return LoadedModel(model, batcher, registry, parameter_bytes)

    def _start_process(
        self, config: BatcherConfig, check: MemoryCheck
    ) -> tuple[ServedModel, float]:
        """On a worker thread: start the model's own process (``model_process: true``), which
        builds it and counts its parameters; stopped again when the memory check refuses it."""
        if self.device != "cpu":
            raise ModelConfigInvalid(
                f"model {config.model_name!r}: in a model repository model_process runs CPU "
                f"models only for now (the device is {self.device}; the models share one "
                "memory budget read in this process); drop model_process from its config.yaml"
            )
        process = ModelProcess(config, self.device)
        try:
            process.start()
        except ModelProcessFailed as exc:
            raise LoadFailed(f"building model {config.model_name!r} failed: {exc}") from None
        try:
            check(process.parameter_bytes)
        except BaseException:
            process.close()
            raise
        return ServedModel.from_process(process), process.parameter_bytes

    def _build(self, config: BatcherConfig, check: MemoryCheck) -> tuple[ServedModel, float]:
        """On a worker thread: build on the CPU, check the size, then move to the device."""
        try:
            built = load_model(
                config.model, name=config.model_name, checkpoint=config.checkpoint, device="cpu"
            )
        except ConfigError as exc:
            raise ModelConfigInvalid(f"model {config.model_name!r}: {exc}") from None
        except Exception as exc:  # the factory's own failure
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise LoadFailed(
                f"building model {config.model_name!r} with {config.model} failed "
                f"({type(exc).__name__}: {reason})"
            ) from None
        if not isinstance(built.run, ModuleRunner):
            return built, 0.0  # a batch callable manages its own memory: nothing to count
        module = built.run.module
        parameter_bytes = module_bytes(module)
        check(parameter_bytes)
        if self.device == "cpu":
            return built, parameter_bytes
        return wrap_model(module, name=config.model_name, device=self.device), parameter_bytes

    def release(self, loaded: LoadedModel) -> None:
        """Drop the model's tensors and give the allocator's cached blocks back to the device."""
        run = loaded.model.run
        if isinstance(run, ModuleRunner):
            run.module.to("cpu")
        gc.collect()
        self.memory.release(-1.0)

    def headroom_bytes(self) -> float | None:
        return self.memory.headroom_bytes()
