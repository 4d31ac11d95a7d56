"""The models one batcher process serves, by name: lookup per request, index, load and unload.

Each model has its own engine (queue, batch policy, SLO, metrics) and all of them share one
device through a :class:`~batcher.device.SharedDevice`, so a burst on one model cannot starve
another's SLO. The servers resolve every request's model here; the Open Inference Protocol's
model repository extension (index, load, unload on HTTP and gRPC) calls :meth:`index`,
:meth:`load` and :meth:`unload`.

* Load while serving: the model is built and warmed up off the event loop and on the device's
  spare time (warm-up batches yield to online work), then starts taking requests.
* Unload drains: the model stops accepting (new requests get the same 503 / UNAVAILABLE as on
  shutdown), everything it accepted is answered, and only then is it dropped.
* Memory: a load is refused, with the sizes in the message, when the models' memory (parameters
  plus the footprint of a full batch, as :class:`~batcher.memory.BatchFootprint` learned it)
  would exceed what the device can give the repository; once more after warm-up, when the new
  model's own footprint is known. Each model's memory is exported as
  ``autoglm_batcher_model_memory_bytes{model}``.

Where the models come from is a :class:`ModelSource` (a folder on disk in production, see
:mod:`batcher.repository_loader`); a process started with ``--model`` serves a repository of one
model and no source, which cannot load or unload.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from prometheus_client import CollectorRegistry

from batcher.device import SharedDevice
from batcher.engine import Batcher
from batcher.errors import (
    LoadFailed,
    LoadRefused,
    NotInRepository,
    RepositoryBusy,
    RepositoryError,
    UnknownModel,
)
from batcher.model import ServedModel
from batcher.repository_metrics import RepositoryMetrics

log = logging.getLogger(__name__)

READY, LOADING, UNLOADING, UNAVAILABLE = "READY", "LOADING", "UNLOADING", "UNAVAILABLE"


@dataclass
class LoadedModel:
    """A model in service: what it computes, its engine, and the memory it holds."""

    model: ServedModel
    batcher: Batcher
    registry: CollectorRegistry  # the engine's own metrics, exported with the process's
    parameter_bytes: float = 0.0  # weights and buffers on the device

    def memory_bytes(self) -> float:
        """Parameters plus the learned footprint of a full batch (0 until one is learned)."""
        line = self.batcher.footprint.line()
        if line is None:
            return self.parameter_bytes
        fixed, per_row = line
        return self.parameter_bytes + fixed + per_row * self.batcher.max_batch_size


@dataclass(frozen=True)
class IndexEntry:
    """One row of the repository index, as the protocol's extension answers it."""

    name: str
    version: str
    state: str
    reason: str


MemoryCheck = Callable[[float], None]


class ModelSource(Protocol):
    """Where the repository's models come from."""

    def names(self) -> list[str]:
        """The models that can be loaded."""
        ...

    async def load(self, name: str, device: SharedDevice, check: MemoryCheck) -> LoadedModel:
        """Build ``name`` on ``device`` and warm it up (its engine not started yet).

        ``check(bytes)`` raises :class:`LoadRefused` when ``bytes`` more would not fit: called
        with the parameters before they go to the device, and with the whole model after.
        Raises :class:`NotInRepository`, :class:`ModelConfigInvalid` or :class:`LoadFailed`.
        """
        ...

    def release(self, loaded: LoadedModel) -> None:
        """Give the device memory of an unloaded (or refused) model back."""
        ...

    def headroom_bytes(self) -> float | None:
        """Device memory this process can still take (None: not known, as on CPU)."""
        ...


def load_refusal(
    name: str, needed_bytes: float, loaded: Mapping[str, float], budget_bytes: float | None
) -> str | None:
    """Why loading ``name`` (needing ``needed_bytes``) must be refused, or None when it fits.

    ``loaded`` is the memory of every other loaded model; ``budget_bytes`` what all of them may
    take together (None: no limit known).
    """
    if budget_bytes is None:
        return None
    held = sum(loaded.values())
    if held + needed_bytes <= budget_bytes:
        return None
    return (
        f"model {name!r} needs about {needed_bytes / 2**20:.1f} MiB of device memory but only "
        f"{max(0.0, budget_bytes - held) / 2**20:.1f} MiB of the repository's "
        f"{budget_bytes / 2**20:.1f} MiB are left ({len(loaded)} models loaded); unload a "
        "model first, or raise --repository-memory-bytes"
    )


class ModelRepository:
    """The loaded models of one process and the source to load more from."""

    def __init__(
        self,
        source: ModelSource | None = None,
        *,
        device: SharedDevice | None = None,
        metrics: RepositoryMetrics | None = None,
        memory_budget_bytes: float = 0.0,
        drain_timeout_seconds: float = 60.0,
    ) -> None:
        self.source = source
        self.device = device or SharedDevice()
        self.metrics = metrics
        self.memory_budget_bytes = memory_budget_bytes
        self.drain_timeout_seconds = drain_timeout_seconds
        self._loaded: dict[str, LoadedModel] = {}
        self._states: dict[str, tuple[str, str]] = {}  # name -> (state, reason)
        self._draining = False

    # --- requests ----------------------------------------------------------------------------

    def serving(self, name: str, version: str = "1") -> LoadedModel:
        """The model a request names; :class:`UnknownModel` when it is not loaded (every model
        has one version, "1"; an empty version means that one).

        A model being unloaded is still returned: its engine refuses new work as draining.
        """
        loaded = self._loaded.get(name)
        if loaded is not None and version not in ("", "1"):
            raise UnknownModel(
                f"unknown model {name!r} version {version!r}; this server serves {name!r} "
                "version '1'"
            )
        if loaded is None:
            why = ""
            if name in self._states:
                state, reason = self._states[name]
                why = f" ({state.lower()}: {reason})"
            elif self.source is not None and name in self.source.names():
                why = " (unavailable: not loaded; load it through the repository API)"
            raise UnknownModel(
                f"unknown model {name!r}{why}; this server serves {self._served_names()}"
            )
        return loaded

    def _served_names(self) -> str:
        return ", ".join(repr(n) for n in sorted(self._loaded)) or "no model now"

    @property
    def names(self) -> list[str]:
        """The loaded models' names."""
        return sorted(self._loaded)

    @property
    def accepting(self) -> bool:
        """Ready for inference: not draining, and every model in service accepts requests."""
        return (
            not self._draining
            and bool(self._loaded)
            and all(
                m.batcher.accepting
                for name, m in self._loaded.items()
                if self._states[name][0] == READY
            )
        )

    def knows(self, name: str) -> bool:
        """Whether ``name`` is a model of the repository, loaded or not."""
        return name in self._states or (self.source is not None and name in self.source.names())

    def ready(self, name: str) -> bool:
        loaded = self._loaded.get(name)
        return loaded is not None and self._states[name][0] == READY and loaded.batcher.accepting

    # --- the repository extension --------------------------------------------------------------

    def index(self, ready_only: bool = False) -> list[IndexEntry]:
        """Every model the repository holds or serves, with its state (sorted by name)."""
        names = set(self._states) | set(self.source.names() if self.source else ())
        entries = []
        for name in sorted(names):
            state, reason = self._states.get(name, (UNAVAILABLE, "not loaded"))
            if ready_only and state != READY:
                continue
            entries.append(IndexEntry(name, "1" if name in self._loaded else "", state, reason))
        return entries

    def add(self, loaded: LoadedModel) -> None:
        """Serve a model built elsewhere (the single ``--model`` of a process without a source)."""
        name = loaded.model.name
        if name not in self.device.models:
            self.device.join(name)
        self._loaded[name] = loaded
        self._states[name] = (READY, "")
        if self.metrics is not None:
            self.metrics.add(name, loaded)

    async def load(self, name: str) -> None:
        """Load ``name`` from the source and start serving it; already loaded: nothing to do.

        Raises a :class:`RepositoryError` saying why not.
        """
        source = self._source_for("load")
        state, _ = self._states.get(name, (UNAVAILABLE, ""))
        if state == READY:
            return
        if name not in source.names():
            self._states.pop(name, None)  # its folder is gone: no longer in the index
            raise NotInRepository(
                f"no model {name!r} in the repository (it holds: "
                f"{', '.join(source.names()) or 'none'})"
            )
        if state in (LOADING, UNLOADING):
            raise RepositoryBusy(f"model {name!r} is {state.lower()}; retry once it is done")
        if self._draining:
            raise RepositoryBusy("the server is shutting down; load the model elsewhere")
        self._states[name] = (LOADING, "")
        self.device.join(name)
        loaded: LoadedModel | None = None
        try:
            loaded = await source.load(name, self.device, lambda b: self._check_fits(name, b))
            self._check_fits(name, loaded.memory_bytes())  # with its own footprint now learned
            await loaded.batcher.start()
        except (RepositoryError, asyncio.CancelledError) as exc:
            self._forget(name, loaded, str(exc) or "load cancelled")
            raise
        except Exception as exc:  # the factory's own failure: one line for the client
            self._forget(name, loaded, f"{type(exc).__name__}: {exc}")
            log.warning("model load failed", extra={"model": name}, exc_info=True)
            raise LoadFailed(
                f"loading model {name!r} failed ({type(exc).__name__}: {exc})"
            ) from None
        self.add(loaded)
        log.info(
            "model loaded",
            extra={"model": name, "memory_bytes": round(loaded.memory_bytes())},
        )

    def _forget(self, name: str, loaded: LoadedModel | None, reason: str) -> None:
        self.device.leave(name)
        self._states[name] = (UNAVAILABLE, reason)
        if loaded is not None and self.source is not None:
            loaded.batcher.executor.close()
            self.source.release(loaded)

    async def unload(self, name: str) -> None:
        """Stop serving ``name`` once every request it accepted is answered.

        Not loaded (but in the repository): nothing to do. Raises a :class:`RepositoryError`.
        """
        source = self._source_for("unload")
        state, _ = self._states.get(name, (UNAVAILABLE, ""))
        if state in (LOADING, UNLOADING):
            raise RepositoryBusy(f"model {name!r} is {state.lower()}; retry once it is done")
        loaded = self._loaded.get(name)
        if loaded is None:
            if name not in self._states and name not in source.names():
                raise NotInRepository(
                    f"no model {name!r} in the repository (it holds: "
                    f"{', '.join(source.names()) or 'none'})"
                )
            return
        self._states[name] = (UNLOADING, "draining accepted requests")
        finished = await loaded.batcher.drain(
            self.drain_timeout_seconds, why=f"model {name!r} is being unloaded"
        )
        del self._loaded[name]
        if self.metrics is not None:
            self.metrics.remove(name)
        self.device.leave(name)
        source.release(loaded)
        self._states[name] = (UNAVAILABLE, "unloaded")
        log.info("model unloaded", extra={"model": name, "drained": finished})

    def _source_for(self, action: str) -> ModelSource:
        if self.source is None:
            raise RepositoryError(
                f"this server serves its --model only and cannot {action} models; start it "
                "with --model-repository to load and unload"
            )
        return self.source

    def _check_fits(self, name: str, needed_bytes: float) -> None:
        others = {n: m.memory_bytes() for n, m in self._loaded.items() if n != name}
        refusal = load_refusal(name, needed_bytes, others, self._budget(others))
        if refusal is not None:
            raise LoadRefused(refusal)

    def _budget(self, others: Mapping[str, float]) -> float | None:
        """What the loaded models may take together: the configured budget, else what they
        hold plus what the device can still give (None: no limit known)."""
        if self.memory_budget_bytes > 0:
            return self.memory_budget_bytes
        headroom = self.source.headroom_bytes() if self.source is not None else None
        return None if headroom is None else sum(others.values()) + headroom

    # --- lifecycle -----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the engines of the models added before the server listens."""
        for loaded in self._loaded.values():
            if not loaded.batcher.started:
                await loaded.batcher.start()

    async def drain(self, timeout: float | None) -> bool:
        """Stop admission everywhere and answer everything accepted; True when all finished."""
        self._draining = True
        results = await asyncio.gather(
            *(m.batcher.drain(timeout) for m in list(self._loaded.values()))
        )
        return all(results)

    @property
    def queued_items(self) -> int:
        return sum(m.batcher.queued_items for m in self._loaded.values())

    @property
    def batches(self) -> int:
        return sum(m.batcher.batches for m in self._loaded.values())
