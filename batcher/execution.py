"""Running one batch on the device, and turning what went wrong into a plain value.

The engine never sees a model's exception object. An exception raised while the model runs holds
its traceback, whose frames hold the batch's tensors; recovering from an out-of-memory error while
that object is alive (inside the ``except`` block) keeps the very memory we need back. So
:func:`run_guarded` leaves the ``except`` block with only a message and a flag, and the engine
splits and retries from there.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from batcher.memory import MemoryMonitor, is_out_of_memory
from batcher.torch_loaded import loaded_torch

BatchFn = Callable[[list[Any]], Sequence[Any]]


@dataclass(frozen=True)
class Outcome:
    """Result of executing one batch: per-request results, or why there are none."""

    results: list[Any] = field(default_factory=list)
    out_of_memory: bool = False
    error: str = ""
    seconds: float = 0.0  # time the device spent on the batch
    peak_bytes: float | None = None  # device memory the batch took above its start (CUDA only)
    # time.monotonic() when the device finished the batch: the engine's loop clock, system-wide
    # (so a model process's is comparable), and earlier than the engine sees the outcome
    finished_at: float | None = None

    @property
    def ok(self) -> bool:
        return not self.out_of_memory and not self.error


class BatchExecutor(Protocol):
    """Runs batches one at a time on one device."""

    # False while what runs the batches is being replaced (a model process that died): the
    # model then reports not ready, so load balancers stop sending until it is back.
    up: bool
    # True for a :class:`QueueingExecutor`: a batch may be sent while another runs, and waits
    # its turn in the executor's own queue (a worker thread's, a model process's socket)
    queues_batches: bool

    def batch_size_for(self, items: int) -> int:
        """The size actually executed for ``items`` items (after padding)."""
        ...

    async def execute(self, payloads: list[Any]) -> Outcome: ...

    def close(self) -> None: ...


class QueueingExecutor(BatchExecutor, Protocol):
    """An executor whose ``queues_batches`` is True."""

    def send(self, payloads: list[Any]) -> asyncio.Future[Outcome]:
        """Send the batch now, behind any still running; the future holds its outcome."""
        ...


def describe(exc: BaseException) -> str:
    """A one-line message for a client: the exception type and its text."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_guarded(fn: BatchFn, payloads: list[Any], memory: MemoryMonitor | None) -> Outcome:
    """Call ``fn`` on a batch; exceptions become an :class:`Outcome`, OOM recovery runs after.

    ``fn`` must return one result per payload; anything else fails the batch.
    """
    allocated_before = memory.begin_batch() if memory is not None else None
    start = time.perf_counter()
    out_of_memory = False
    message = ""
    try:
        results = list(fn(payloads))
    except Exception as exc:
        out_of_memory = is_out_of_memory(exc)
        message = describe(exc)
    else:
        seconds, finished_at = time.perf_counter() - start, time.monotonic()
        if len(results) != len(payloads):
            return Outcome(
                error=f"model returned {len(results)} results for {len(payloads)} requests",
                seconds=seconds,
                finished_at=finished_at,
            )
        peak = memory.batch_peak_bytes(allocated_before) if memory is not None else None
        return Outcome(results=results, seconds=seconds, peak_bytes=peak, finished_at=finished_at)
    # Outside the except block: the exception, its traceback and the tensors they held are gone.
    seconds, finished_at = time.perf_counter() - start, time.monotonic()
    if out_of_memory and memory is not None:
        memory.after_out_of_memory()
    return Outcome(
        out_of_memory=out_of_memory, error=message, seconds=seconds, finished_at=finished_at
    )


class ThreadExecutor:
    """Runs a blocking batch function on one worker thread (torch releases the GIL inside ops).

    One hand-off per batch each way, and no more: the batch goes to the thread through a
    ``SimpleQueue`` and its outcome comes back to the loop through one ``call_soon_threadsafe``
    (``run_in_executor`` would add a pool's bookkeeping and a chained concurrent future to every
    batch, which shows in the serving path's profile at small batches).

    torch's intra-op thread count is per OS thread under OpenMP: a new thread starts with the
    machine's default, not what ``torch.set_num_threads`` set in the main thread. The worker is
    given the creator's count; without that a one-thread CPU model ran several times slower
    here, its OpenMP threads spinning against the HTTP server for the same cores. A model that
    is not a torch module leaves torch unloaded, and there is no count to pass on.
    """

    up = True  # a thread in this process: there is nothing to replace
    queues_batches = True

    def __init__(
        self,
        fn: BatchFn,
        batch_size_for: Callable[[int], int] | None = None,
        memory: MemoryMonitor | None = None,
    ) -> None:
        self._fn = fn
        self._size_for = batch_size_for or (lambda items: items)
        self._memory = memory
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        torch = loaded_torch()
        torch_threads = torch.get_num_threads() if torch is not None else None
        self._thread = threading.Thread(
            target=self._work, args=(torch_threads,), name="autoglm-batch", daemon=True
        )
        self._thread.start()

    def batch_size_for(self, items: int) -> int:
        return self._size_for(items)

    async def execute(self, payloads: list[Any]) -> Outcome:
        return await self.send(payloads)

    def send(self, payloads: list[Any]) -> asyncio.Future[Outcome]:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[Outcome] = loop.create_future()
        self._jobs.put(_Job(payloads, loop, done))
        return done

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join()

    def _work(self, torch_threads: int | None) -> None:
        torch = loaded_torch()
        if torch is not None and torch_threads is not None:
            torch.set_num_threads(torch_threads)
        while (job := self._jobs.get()) is not None:
            try:
                outcome = run_guarded(self._fn, job.payloads, self._memory)
            except BaseException as exc:  # run_guarded keeps model errors; this is the rest
                job.loop.call_soon_threadsafe(_settle, job.done, None, exc)
            else:
                job.loop.call_soon_threadsafe(_settle, job.done, outcome, None)
            del job  # the batch's tensors go now, not when the next batch arrives


@dataclass(frozen=True)
class _Job:
    payloads: list[Any]
    loop: asyncio.AbstractEventLoop
    done: asyncio.Future[Outcome]


def _settle(
    done: asyncio.Future[Outcome], outcome: Outcome | None, error: BaseException | None
) -> None:
    if done.cancelled():
        return
    if error is not None:
        done.set_exception(error)
    else:
        assert outcome is not None
        done.set_result(outcome)
