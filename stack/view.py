"""What ``autoglm up`` shows while it runs: a live terminal view, or structured log lines.

Both views get the same calls: :meth:`show` once a second with the latest :class:`Sample`, and
:meth:`event` for each scale decision as it happens. The terminal view (rich) draws load,
forecast, replicas, utilization against target and p99 against the SLO, with the last decisions
underneath; ``--no-tui`` logs a ``status`` line when the workers or the readings change and
every ten seconds otherwise, and one ``scaled`` line per event, which is what scripts and tests
read.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import TYPE_CHECKING, Protocol

from stack.report import Sample, ScaleEvent

if TYPE_CHECKING:
    from rich.live import Live

log = logging.getLogger("autoglm.up")


class View(Protocol):
    def start(self) -> None: ...

    def show(self, sample: Sample) -> None: ...

    def event(self, event: ScaleEvent) -> None: ...

    def stop(self) -> None: ...


def _num(value: float | None, fmt: str, unit: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{unit}"


# Seconds between two ``status`` lines while nothing that :func:`_phase` reads changes.
STATUS_EVERY_SECONDS = 10.0


def _phase(sample: Sample) -> tuple[object, ...]:
    """What a reader of the log wants a line for as soon as it changes: the worker counts (a
    scale decision, a worker becoming ready) and whether each reading exists yet (the first
    online work and forecast; the first best-effort line answered)."""
    return (
        sample.workers,
        sample.ready_workers,
        sample.desired_workers,
        sample.online_work is None,
        sample.forecast_upper is None,
        sample.best_effort_done > 0,
    )


class LogView:
    """Structured log lines: ``status`` when the phase changes (:func:`_phase`) and at least
    every ``every_seconds`` of the run otherwise, ``scaled`` on every event.

    The stack samples once a second; a line per sample buried the decisions in a run's log
    (3600 lines an hour) and made scripts page through identical ones.
    """

    def __init__(self, every_seconds: float = STATUS_EVERY_SECONDS) -> None:
        self.every_seconds = every_seconds
        self._last: tuple[float, tuple[object, ...]] | None = None

    def start(self) -> None:
        pass

    def show(self, sample: Sample) -> None:
        phase = _phase(sample)
        if self._last is not None:
            elapsed, last_phase = self._last
            if phase == last_phase and sample.elapsed - elapsed < self.every_seconds:
                return
        self._last = (sample.elapsed, phase)
        log.info(
            "status",
            extra={
                "elapsed_s": round(sample.elapsed, 1),
                "target_rps": round(sample.target_rps, 1),
                "sent_rps": round(sample.sent_rps, 1),
                "workers": sample.workers,
                "ready": sample.ready_workers,
                "desired": sample.desired_workers,
                "online_utilization_pct": _round(sample.online_utilization),
                "online_work_pct": _round(sample.online_work),
                "best_effort_work_pct": _round(sample.best_effort_work),
                "busy_share": _round(sample.busy_share, 3),
                "best_effort_done": sample.best_effort_done,
                "forecast_upper": _round(sample.forecast_upper),
                "p99_s": _round(sample.p99_seconds, 3),
            },
        )

    def event(self, event: ScaleEvent) -> None:
        log.info(
            "scaled",
            extra={
                "elapsed_s": round(event.elapsed, 1),
                "from": event.from_workers,
                "to": event.to_workers,
                "direction": event.direction,
                "driver": event.driver,
                "reason": event.reason,
            },
        )

    def stop(self) -> None:
        pass


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


class TerminalView:
    """A rich live panel, redrawn every sample."""

    def __init__(
        self,
        target_utilization: float,
        slo_seconds: float,
        max_workers: int,
        peak_rps: float,
        notices: list[str],
        sizing: str = "utilization",
    ) -> None:
        from rich.console import Console

        self.target, self.slo, self.max_workers = target_utilization, slo_seconds, max_workers
        self.sizing = sizing
        self.peak_rps = peak_rps
        self.notices = notices
        self.console = Console()
        self._events: deque[ScaleEvent] = deque(maxlen=8)
        self._live: Live | None = None
        self._last: Sample | None = None

    def start(self) -> None:
        from rich.live import Live

        self._live = Live(self._render(), console=self.console, refresh_per_second=2)
        self._live.start()

    def show(self, sample: Sample) -> None:
        self._last = sample
        if self._live is not None:
            self._live.update(self._render())

    def event(self, event: ScaleEvent) -> None:
        self._events.append(event)
        if self._live is not None:
            self._live.update(self._render())

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()

    def _bar(self, value: float, full: float, width: int = 30) -> str:
        filled = 0 if full <= 0 else max(0, min(width, round(width * value / full)))
        return "█" * filled + "·" * (width - filled)

    def _render(self):
        from rich.console import Group
        from rich.panel import Panel
        from rich.table import Table

        s = self._last
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        table.add_column(style="dim")
        if s is None:
            table.add_row("starting", "exporter, workers, predictor, autoscaler ...", "")
        else:
            # The forecast is of what the autoscaler sizes on: the request rate (--sizing slo)
            # or the online work (--sizing utilization).
            rate_forecast = self.sizing == "slo"
            forecast = f"forecast {_num(s.forecast_upper, '.0f')}"
            table.add_row(
                "load",
                f"{s.sent_rps:6.1f} req/s  {self._bar(s.sent_rps, self.peak_rps)}"
                + (f"  {forecast} req/s" if rate_forecast else ""),
                f"profile asks {s.target_rps:.1f} req/s",
            )
            table.add_row(
                "online work",
                f"{_num(s.online_work, '6.0f')} %" + ("" if rate_forecast else f"   {forecast} %"),
                "100 % = one GPU busy; forecast = upper bound at the warm-up horizon",
            )
            table.add_row(
                "best-effort",
                f"{_num(s.best_effort_work, '6.0f')} %   {s.best_effort_done} job requests done",
                "the job's backlog, served on the idle GPU time",
            )
            table.add_row(
                "replicas",
                f"{s.workers} workers ({s.ready_workers} ready)  "
                f"{self._bar(s.workers, self.max_workers, self.max_workers * 3)}",
                f"autoscaler wants {s.desired_workers}",
            )
            util = s.online_utilization
            target = 100 * self.target
            style = "green" if util is not None and util <= target * 1.1 else "yellow"
            table.add_row(
                "utilization",
                f"[{style}]{_num(util, '6.1f')} %[/]  {self._bar(util or 0, 100)}",
                f"online, per ready worker; target {target:g} %",
            )
            busy = None if s.busy_share is None else 100 * s.busy_share
            table.add_row(
                "busy",
                f"{_num(busy, '6.1f')} %  {self._bar(busy or 0, 100)}",
                "of the paid GPUs, online and best-effort together",
            )
            p99 = s.p99_seconds
            style = "green" if p99 is not None and p99 <= self.slo else "red"
            table.add_row(
                "p99 latency",
                f"[{style}]{_num(p99, '6.3f')} s[/]",
                f"online requests; SLO {self.slo:g} s",
            )
        decisions = Table(title="scale decisions", title_justify="left", expand=False)
        for column in ("time", "workers", "driver", "reason"):
            decisions.add_column(column)
        for e in self._events:
            decisions.add_row(
                f"{e.elapsed:.0f} s", f"{e.from_workers} → {e.to_workers}", e.driver, e.reason[:90]
            )
        elapsed = "" if s is None else f" · {s.elapsed:.0f} s"
        parts = [table, decisions, *[f"[dim]{n}[/]" for n in self.notices]]
        return Panel(Group(*parts), title=f"autoglm up{elapsed} · Ctrl-C to stop")
