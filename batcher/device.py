"""One device shared by the engines of several models: who runs the next batch, and when.

Every :class:`~batcher.engine.Batcher` runs its batches through a :class:`SharedDevice`; a
process serving one model has a device of its own that is never contended, so taking it costs a
dictionary lookup. With several models the engines ask for the device with their most urgent
request's deadline, and when it frees, the order of :mod:`batcher.dispatch_order` picks the next
one. A batch once started runs to its end: a device does not preempt, so the longest a model's
request waits for another model is the batch running when it arrived.

Times come from the event loop's clock, as in the engine, so the tests run it in virtual time.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

from batcher.busy_window import BusyWindow
from batcher.dispatch_order import Claim, next_claim, others_ahead_fraction, stretch_for_others

SHARE_WINDOW_SECONDS = 2.0  # recent device time by which the models' shares are compared


@dataclass
class _User:
    weight: float
    window: BusyWindow
    waiting: tuple[bool, float, int, asyncio.Future[None]] | None = field(default=None)


class SharedDevice:
    """Grants the device to one model's batch at a time."""

    def __init__(self, window_seconds: float = SHARE_WINDOW_SECONDS) -> None:
        self.window_seconds = window_seconds
        self.busy_until = 0.0  # predicted end of the batch running now, whichever model's
        self.freed_at: float | None = None  # when the last batch, whichever model's, finished
        self._users: dict[str, _User] = {}
        self._holder: str | None = None
        self._seq = itertools.count()

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(self._users)

    def join(self, model: str, weight: float = 1.0) -> None:
        """Let ``model`` use the device (again), with ``weight`` as its relative share."""
        self._users[model] = _User(weight, BusyWindow(self.window_seconds))

    def leave(self, model: str) -> None:
        """``model`` no longer uses the device (unloaded): forget its use and any claim."""
        user = self._users.pop(model, None)
        if user is not None and user.waiting is not None:
            user.waiting[3].cancel()
        self.release(model)

    def holds(self, model: str) -> bool:
        return self._holder == model

    def try_take(self, model: str) -> bool:
        """Take the device at once if it is free and nobody waits for it (or already held)."""
        if self._holder == model:
            return True
        if self._holder is None and not any(u.waiting for u in self._users.values()):
            self._holder = model
            return True
        return False

    async def take(self, model: str, *, best_effort: bool, deadline: float) -> None:
        """Wait until the device is granted to ``model`` (it then holds it until release)."""
        if self.try_take(model):
            return
        user = self._users[model]
        granted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        user.waiting = (best_effort, deadline, next(self._seq), granted)
        try:
            await granted
        except asyncio.CancelledError:
            if user.waiting is not None and user.waiting[3] is granted:
                user.waiting = None
            if granted.done() and not granted.cancelled():
                self.release(model)  # granted just as the wait was cancelled: pass it on
            raise

    def release(self, model: str) -> None:
        """``model`` is done with the device: grant it to the next claim, if any."""
        if self._holder != model:
            return
        self._holder = None
        now = asyncio.get_running_loop().time()
        claims = [
            Claim(name, w[0], w[1], u.window.busy_seconds(now), w[2], u.weight)
            for name, u in self._users.items()
            if (w := u.waiting) is not None
        ]
        if not claims:
            return
        chosen = next_claim(claims)
        user = self._users[chosen.model]
        assert user.waiting is not None
        granted = user.waiting[3]
        user.waiting = None
        self._holder = chosen.model
        granted.set_result(None)

    def ran(self, model: str, started: float, ended: float) -> None:
        """Record a batch of ``model`` that used the device from ``started`` to ``ended``."""
        user = self._users.get(model)
        if user is not None:
            user.window.add(started, ended)

    def stretch(self, model: str, now: float) -> float:
        """How much longer ``model``'s work takes to get through than the device alone would
        take: the other models served before it use part of the device."""
        if len(self._users) < 2:
            return 1.0
        used = {name: (u.window.busy_seconds(now), u.weight) for name, u in self._users.items()}
        return stretch_for_others(others_ahead_fraction(model, used, self.window_seconds))
