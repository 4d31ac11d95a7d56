"""The running predictor: keeps each target's series, its chosen models and their forecasts.

Points arrive either from Prometheus (a scheduled job queries what is new since the last point)
or pushed in-process with :meth:`PredictorService.observe` (the simulator and the local stack).
A scheduled refit re-runs the backtest selection on the whole history and fits the winners;
between refits every new point only ``update``s them. The refit runs outside the lock, so
forecasts keep being served from the previous models while it works, and points that arrived
meanwhile are replayed into the new models before they are swapped in. When Prometheus fails,
the error is counted and the last forecasts stay, with their age growing; the log says so once
when a target's queries start failing, reminds every :data:`QUERY_REMINDER_SECONDS` while they
keep failing (each failure is a debug line) and says once when they succeed again, after how long.
A refit that finds too few points is the normal wait for history at start, counted apart from
errors (``result="waiting"``); the metrics say how long each target has had no model.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

import numpy as np

from autoglm.prometheus_api import PrometheusClient, PrometheusError
from predictor.config import TargetConfig
from predictor.fitting import fit_chosen
from predictor.forecast import Forecast
from predictor.metrics import PredictorMetrics
from predictor.models import candidate_factories, shortest_cycle
from predictor.prometheus_pull import fetch_grid
from predictor.schedule import Schedule
from predictor.selection import select_model
from predictor.series import fill_gaps
from predictor.target_state import TargetState

log = logging.getLogger(__name__)

QUERY_REMINDER_SECONDS = 600.0
"""While a target's queries keep failing, a warning this often (the first failure's is at once)."""


class TooFewPoints(ValueError):
    """A target has fewer points (a pull-mode target: in its lookback) than a refit needs."""

    def __init__(self, points: int, needed: int, message: str) -> None:
        super().__init__(message)
        self.points = points
        self.needed = needed


class PredictorService:
    """Forecasts for configured targets; implements :class:`predictor.api.ForecastProvider`."""

    def __init__(
        self,
        targets: list[TargetConfig] | tuple[TargetConfig, ...],
        source: PrometheusClient | None = None,
        metrics: PredictorMetrics | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.clock = clock
        created = clock()
        self.targets = {t.name: TargetState(t, created_at=created) for t in targets}
        self.source = source
        self.metrics = metrics or PredictorMetrics()
        self.metrics.attach(self)
        self._schedule = Schedule(self.refit_all, self.poll_all)

    # -- ForecastProvider --------------------------------------------------------------------
    def forecast(
        self, target: str, horizon_seconds: float, quantile: float = 0.9
    ) -> Forecast | None:
        """Best forecast of ``target`` for the step at least ``horizon_seconds`` from now.

        The horizon counts from the last point, so a forecast that aged (source down) looks
        further ahead to still cover the requested time. None when no model is fitted yet or
        the time is beyond the largest configured horizon.
        """
        state = self.targets.get(target)
        if state is None:
            raise KeyError(f"unknown target {target!r}; configured: {', '.join(self.targets)}")
        with state.lock:
            if not state.models or state.last_time is None or state.issued_at is None:
                return None
            step = state.config.step
            ahead = self.clock() + horizon_seconds - state.last_time
            h = max(1, math.ceil(ahead / step - 1e-9))
            return state.forecast_at(h, quantile)

    def forecasts(self, target: str) -> list[Forecast]:
        """Forecasts at every configured horizon (what /metrics publishes)."""
        state = self.targets[target]
        with state.lock:
            if not state.models or state.issued_at is None:
                return []
            out = [state.forecast_at(h, state.config.quantile) for h in state.config.horizons]
        return [f for f in out if f is not None]

    # -- push mode ---------------------------------------------------------------------------
    def observe(self, target: str, timestamp: float, value: float) -> None:
        """Add one sample. Samples fill bins of the target's step (aggregated as configured);
        a bin is closed, appended and fed to the models when a sample of a later bin arrives.
        Samples for an already closed bin are counted as late and ignored."""
        state = self.targets.get(target)
        if state is None:
            raise KeyError(f"unknown target {target!r}; configured: {', '.join(self.targets)}")
        if not math.isfinite(value):
            self.metrics.observations_rejected.labels(target, "not_finite").inc()
            return
        step = state.config.step
        index = math.floor(timestamp / step)
        with state.lock:
            if state.open_bin is None:
                state.open_bin = index
            if index < state.open_bin:
                self.metrics.observations_rejected.labels(target, "late").inc()
                return
            if index > state.open_bin:
                closed = state.close_bin()
                gap = index - state.open_bin - 1
                filler = 0.0 if state.config.aggregate == "sum" else closed
                new = [closed] + [filler] * gap
                self._append_locked(state, new, (state.open_bin + 1 + gap) * step)
                state.open_bin = index
                state.open_samples = []
            state.open_samples.append(float(value))

    def _append_locked(self, state: TargetState, new: list[float], last_time: float) -> None:
        state.values.extend(new)
        state.appended += len(new)
        del state.values[: max(0, len(state.values) - state.capacity)]
        state.last_time = last_time
        if state.models:
            for model in {id(m): m for m in state.models.values()}.values():
                for v in new:
                    model.update(v)
            state.issued_at = self.clock()
            self.metrics.updates.labels(state.config.name).inc(len(new))

    # -- pull mode ---------------------------------------------------------------------------
    def poll(self, target: str) -> None:
        """Fetch points newer than the last one from Prometheus and update the models."""
        state = self.targets[target]
        config = state.config
        if not config.query or self.source is None:
            return
        now_grid = math.floor(self.clock() / config.step) * config.step
        with state.lock:
            last = state.last_time
        if last is None:
            self.refit(target)
            return
        start = last + config.step - (config.step if config.counter else 0.0)
        if start > now_grid:
            return
        try:
            end_time, fresh = self._fetch(state, start, now_grid)
        except PrometheusError as exc:
            self._query_failed(state, exc)
            return
        if config.counter:
            fresh = fresh[1:]
        if len(fresh) == 0 or not np.isfinite(fresh).any():
            return
        with state.lock:
            previous = state.values[-1] if state.values else np.nan
            filled = fill_gaps(np.concatenate([[previous], fresh]))[1:]
            self._append_locked(state, [float(x) for x in filled], end_time)

    def _fetch(self, state: TargetState, start: float, end: float) -> tuple[float, np.ndarray]:
        """The target's points on its grid from ``start`` to ``end``; notes a recovery."""
        assert self.source is not None
        result = fetch_grid(self.source, state.config, start, end)
        self._query_succeeded(state)
        return result

    def _query_failed(self, state: TargetState, exc: Exception) -> None:
        """Count a failed query. Polls find a Prometheus that is down again at every update
        interval: a warning when the target's queries start failing, then one every
        :data:`QUERY_REMINDER_SECONDS` while they keep failing, debug lines between them."""
        target = state.config.name
        self.metrics.query_errors.labels(target).inc()
        now = self.clock()
        with state.lock:
            first = state.query_failing_since is None
            if first:
                state.query_failing_since, state.query_failures = now, 0
            state.query_failures += 1
            logged = state.query_logged_at
            remind = not first and logged is not None and now - logged >= QUERY_REMINDER_SECONDS
            if first or remind:
                state.query_logged_at = now
            failures, since = state.query_failures, state.query_failing_since or now
        extra: dict[str, object] = {"target": target, "error": str(exc)}
        if first:
            log.warning("prometheus query failed", extra=extra)
            return
        extra |= {"failures": failures, "failing_seconds": round(now - since, 1)}
        if remind:
            log.warning("prometheus queries still failing", extra=extra)
        else:
            log.debug("prometheus query failed", extra=extra)

    def _query_succeeded(self, state: TargetState) -> None:
        """After failed queries, one info line saying for how long and how many failed."""
        with state.lock:
            since = state.query_failing_since
            if since is None:
                return
            failures = state.query_failures
            state.query_failing_since, state.query_failures = None, 0
            state.query_logged_at = None
        log.info(
            "prometheus queries recovered",
            extra={
                "target": state.config.name,
                "failures": failures,
                "failed_seconds": round(self.clock() - since, 1),
            },
        )

    # -- refits ------------------------------------------------------------------------------
    def refit(self, target: str) -> bool:
        """Re-select and refit the target's models on its whole history; True on success."""
        state = self.targets[target]
        config = state.config
        with state.lock:
            if state.refit_running:
                return False
            state.refit_running = True
        started = time.perf_counter()
        try:
            with state.lock:
                appended_before = state.appended
            series, end_time = self._history_for_refit(state)
            factories = candidate_factories(
                config.step, config.seasons, config.max_horizon, len(series), config.models
            )
            with state.lock:
                previous = state.selection
            selection = select_model(
                factories,
                series,
                config.horizons,
                config.quantile,
                previous=previous,
                cycle=shortest_cycle(config.step, config.seasons, len(series)),
            )
            fitted = fit_chosen(selection, factories, series)
            with state.lock:
                # Points appended while the refit ran must reach the new models too.
                arrived = state.appended - appended_before
                if end_time is not None:
                    newer = 0
                    if state.last_time is not None and state.last_time > end_time:
                        newer = round((state.last_time - end_time) / config.step)
                    replay = state.values[len(state.values) - newer :] if newer else []
                    state.values = [float(x) for x in series] + replay
                    state.last_time = max(end_time, state.last_time or end_time)
                else:
                    replay = state.values[len(state.values) - arrived :] if arrived else []
                for model in fitted.values():
                    for v in replay:
                        model.update(v)
                state.models = {h: fitted[name] for h, name in selection.per_horizon.items()}
                state.selection = selection
                state.issued_at = self.clock()
                state.waiting_since, state.waiting_warned = None, False
            duration = time.perf_counter() - started
            self.metrics.refits.labels(target, "success").inc()
            self.metrics.refit_duration.labels(target).observe(duration)
            log.info(
                "refit done",
                extra={
                    "target": target,
                    "points": len(series),
                    "selected": selection.overall,
                    "per_horizon": selection.per_horizon,
                    "seconds": round(duration, 3),
                },
            )
            return True
        except PrometheusError as exc:
            self._query_failed(state, exc)
            self.metrics.refits.labels(target, "error").inc()
            return False
        except TooFewPoints as exc:
            # The normal wait for history, not an error: an error-rate alert must not fire at
            # every start. A target that never fits shows in autoglm_predictor_unfitted_seconds.
            self.metrics.refits.labels(target, "waiting").inc()
            self._waiting(state, exc)
            return False
        except ValueError as exc:
            self.metrics.refits.labels(target, "error").inc()
            log.warning("refit failed", extra={"target": target, "error": str(exc)})
            return False
        finally:
            with state.lock:
                state.refit_running = False

    def _waiting(self, state: TargetState, reason: TooFewPoints) -> None:
        """A target with too few points yet. Right after start (this predictor's, or its
        Prometheus') that is the normal wait for history, and (pull mode) a poll every update
        interval finds it again: one info line when the wait starts, and one warning if it
        outlasts the limit at which PredictorTargetNotFitted fires, by when the history should
        be there (a query that matches too little, or a sparse series), instead of a warning a
        poll."""
        now = self.clock()
        with state.lock:
            started = state.waiting_since
            if started is None:
                state.waiting_since = now
            warn = (
                started is not None
                and not state.waiting_warned
                and now - started >= state.not_fitted_limit
            )
            state.waiting_warned |= warn
        extra: dict[str, object] = {
            "target": state.config.name,
            "error": str(reason),
            "points": reason.points,
            "needed": reason.needed,
        }
        if started is None:
            log.info("waiting for points", extra=extra)
        elif warn:
            extra["waited_seconds"] = round(now - started)
            extra["limit_seconds"] = round(state.not_fitted_limit)
            log.warning("still too few points", extra=extra)

    def _history_for_refit(self, state: TargetState) -> tuple[np.ndarray, float | None]:
        """The series to fit on, and (pull mode) the time of its last point; raises
        :class:`TooFewPoints` while there are fewer points than a refit needs."""
        config = state.config
        needed = state.min_points
        if config.query and self.source is not None:
            end = math.floor(self.clock() / config.step) * config.step
            end_time, values = self._fetch(state, end - config.lookback, end)
            if config.counter:
                values = values[1:]
            finite = np.flatnonzero(np.isfinite(values))
            if len(finite) < needed:
                raise TooFewPoints(
                    len(finite),
                    needed,
                    f"only {len(finite)} points in the lookback; need {needed} "
                    "(check the query, or wait for history)",
                )
            return fill_gaps(values[finite[0] :]), end_time
        with state.lock:
            values = np.array(state.values, dtype=float)
        if len(values) < needed:
            raise TooFewPoints(len(values), needed, f"only {len(values)} points; need {needed}")
        return values, None

    def refit_all(self) -> None:
        for name in self.targets:
            self.refit(name)

    def poll_all(self) -> None:
        """The periodic job: pull new points; fit targets that have none yet but now can."""
        for name, state in self.targets.items():
            if state.config.query and self.source is not None:
                self.poll(name)
            elif not state.models and len(state.values) >= state.min_points:
                self.refit(name)

    # -- scheduling --------------------------------------------------------------------------
    def start(self, refit_seconds: float, update_seconds: float) -> None:
        """Run refits and polls in the background; the first refit runs now."""
        self._schedule.start(refit_seconds, update_seconds)

    def stop(self) -> None:
        self._schedule.stop()
