"""The reconcile loop on apscheduler: every ``interval`` seconds, one tick, never two at once.

A tick renews the leader lease (when election is on) and, only while this replica leads,
reconciles every autoscaler. ``max_instances=1`` and ``coalesce`` mean that a slow tick (a hung
Prometheus, a slow API server) delays the next one instead of stacking ticks that would act on
stale readings. An exception in a tick is logged and counted; the loop goes on.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime
from typing import Protocol

from apscheduler.schedulers.background import BackgroundScheduler

from autoscaler.controller.leader import LeaderElector
from autoscaler.metrics import AutoscalerMetrics

log = logging.getLogger(__name__)


class Controller(Protocol):
    def reconcile_all(self) -> dict: ...


class ReconcileLoop:
    """Runs ``controller.reconcile_all`` on a schedule, gated by ``elector`` if given."""

    def __init__(
        self,
        controller: Controller,
        metrics: AutoscalerMetrics,
        interval: float = 15.0,
        elector: LeaderElector | None = None,
    ) -> None:
        self.controller, self.metrics, self.interval = controller, metrics, interval
        self.elector = elector
        self.ticks = 0
        self.tick_done = threading.Event()
        self._scheduler = BackgroundScheduler(
            job_defaults={"max_instances": 1, "coalesce": True, "misfire_grace_time": None}
        )

    def tick(self) -> None:
        try:
            leading = self.elector.tick() if self.elector else True
            self.metrics.leader.set(1 if leading else 0)
            if leading:
                self.controller.reconcile_all()
        except Exception:  # the loop must outlive any single failure
            log.exception("reconcile tick failed")
            self.metrics.errors.labels("", "", "tick").inc()
        finally:
            self.ticks += 1
            self.tick_done.set()

    def start(self) -> None:
        self._scheduler.add_job(
            self.tick, "interval", seconds=self.interval, next_run_time=datetime.now()
        )
        self._scheduler.start()
        log.info("reconcile loop started", extra={"interval_seconds": self.interval})

    def stop(self) -> None:
        """Stop ticking, wait for a running tick, then hand the lease over."""
        if self._scheduler.running:
            self._scheduler.shutdown(wait=True)
        if self.elector:
            self.elector.release()
        self.metrics.leader.set(0)
