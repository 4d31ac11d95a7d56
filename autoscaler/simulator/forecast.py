"""Forecasts of the request rate for the predictive policy, replayed causally.

The default forecaster is the predictor itself: a :class:`predictor.api.InProcessPredictor`, fed
samples and run on the simulation's clock, exactly as the controller would consume it in-process.
Every tick the simulator pushes the request rate it just measured; the service bins it into steps,
selects its model per horizon by rolling-origin backtest on the history seen so far (refitting on
a schedule, updating cheaply in between) and publishes point forecasts with calibrated upper
bounds. Nothing from the future is ever shown to it.

The series is the mean of the measured rate over each step, or (``series="peak"``) its peak, as
``max_over_time`` would give: a forecast of the peak covers the minute-level noise that the
reactive metric sees, at the cost of that headroom all the time.

The policy consumes what the controller consumes (:mod:`autoscaler.controller.forecasts`): the
upper bound for the step at the horizon, a new replica's warm-up. Capacity ordered now only
serves from then on, so the steps before it cannot justify an order; the capacity already running
through them is held by the scale-down stabilization window, which remembers the recommendations
made from the forecasts of the last warm-up.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Literal, Protocol

import numpy as np

from predictor.api import InProcessPredictor

TARGET = "request_rate"


class LoadForecaster(Protocol):
    """What the simulator needs from a forecaster."""

    @property
    def name(self) -> str:
        """The model that made the latest answer (or the forecaster's own name)."""

    def observe(self, t: float, rate: float) -> None:
        """Take the request rate measured over the tick that ended at ``t`` (seconds)."""

    def upper(self, now: float, horizon_seconds: float) -> float | None:
        """Upper bound of the rate over ``[now, now + horizon_seconds]``; None without one."""


class PredictorForecaster:
    """The predictor service, fed and asked by the simulator on its own clock.

    ``step_seconds`` is the forecast series' step, ``seasons_seconds`` the seasons its models
    may use (a season needs two cycles of history before a model uses it), ``models`` restricts
    the non-baseline candidates (empty: all the predictor offers) and ``refit_seconds`` is how
    often selection and fitting re-run (the predictor's scheduled refit).
    """

    def __init__(
        self,
        step_seconds: float,
        horizon_seconds: float,
        quantile: float = 0.9,
        seasons_seconds: Sequence[float] = (86400.0, 604800.0),
        models: Sequence[str] = (),
        refit_seconds: float = 86400.0,
        lookback_seconds: float = 14 * 86400.0,
        series: Literal["peak", "mean"] = "mean",
    ) -> None:
        if step_seconds <= 0 or horizon_seconds < 0 or refit_seconds <= 0:
            raise ValueError("step and refit must be > 0 seconds and the horizon >= 0")
        if series not in ("peak", "mean"):
            raise ValueError("series must be 'peak' or 'mean'")
        steps = max(1, math.ceil(horizon_seconds / step_seconds - 1e-9)) + 1
        self.quantile = quantile
        self.step = step_seconds
        self.series = series
        self._bin_peak = -math.inf
        self.horizon = horizon_seconds
        self.refit_seconds = refit_seconds
        self.now = 0.0
        self.predictor = InProcessPredictor(
            TARGET,
            step_seconds=step_seconds,
            lookback_seconds=max(lookback_seconds, 10 * step_seconds),
            horizon_steps=range(1, steps + 1),
            quantile=quantile,
            seasons_seconds=seasons_seconds,
            # "peak": the predictor keeps the last sample of a step, and the sample pushed is the
            # running maximum of the step, so a closed step holds its peak.
            aggregate="last" if series == "peak" else "mean",
            models=models,
            clock=lambda: self.now,
        )
        self.refits = 0
        self.name = "none"
        self._last_refit: float | None = None
        self._last_bin = -1
        self._closed_steps = 0
        self._version = 0  # changes whenever the forecasts can have changed
        # answers at the current (version, step), per horizon and quantile, with their model
        self._cached: dict[tuple[int, int, int, float], tuple[float | None, str]] = {}
        self._cached_position: tuple[int, int] | None = None

    def observe(self, t: float, rate: float) -> None:
        self.now = t
        current_bin = math.floor((t - 1e-6) / self.step)  # the tick's rate belongs to its bin
        if current_bin != self._last_bin:
            self._bin_peak = -math.inf
        self._bin_peak = max(self._bin_peak, rate)
        value = self._bin_peak if self.series == "peak" else rate
        self.predictor.observe(t - 1e-6, value)
        if current_bin == self._last_bin:
            return
        # A step closed: the models were updated with it; a due refit runs now (before the
        # first fit, it is tried at every step once the history can be backtested).
        if self._last_bin >= 0:
            self._closed_steps += 1
        self._last_bin = current_bin
        self._version += 1
        due = self._last_refit is None or t - self._last_refit >= self.refit_seconds
        if due and self._backtestable() and self.predictor.refit():
            self._last_refit = t
            self.refits += 1

    def _backtestable(self) -> bool:
        """Whether the predictor's model selection can run on the steps seen so far.

        The service itself waits for that many points, but asked at every step it would log
        that it waits at every step; the simulator asks only once it can succeed.
        """
        return self._closed_steps >= self.predictor.minimum_history

    def upper(
        self, now: float, horizon_seconds: float, quantile: float | None = None
    ) -> float | None:
        """The upper bound for the step ``horizon_seconds`` ahead, at ``quantile`` (default: the
        configured one), as the controller asks the predictor. Model selection and fits do not
        depend on the quantile (selection scores point accuracy), so one fitted pass answers
        every quantile."""
        self.now = now
        q = self.quantile if quantile is None else quantile
        key = (self._version, math.floor(now / self.step), math.floor(horizon_seconds), q)
        cached = self._cached.get(key)
        if cached is None:
            forecast = self.predictor.forecast(horizon_seconds, q)
            cached = (None, self.name) if forecast is None else (forecast.upper, forecast.model)
            if key[:2] != self._cached_position:
                self._cached.clear()
                self._cached_position = key[:2]
            self._cached[key] = cached
        self.name = cached[1]
        return cached[0]


class SharedForecaster:
    """One forecaster's answers, shared by runs that replay the same load.

    The forecaster sees only the measured request rate, which comes from the trace and not from
    the autoscaler's actions, so runs of one trace that differ only in target or behavior are
    shown the same forecasts. Computing them once makes a sweep over targets cost one forecast
    pass instead of one per run. Each run replays from the start: a tick already seen is answered
    from the record (its rate must be the one recorded, or the runs do not share a load), and a
    tick past the record is passed on to the wrapped forecaster, which carries on from there.
    """

    def __init__(self, inner: LoadForecaster, quantiles: Sequence[float] = ()) -> None:
        self.inner = inner
        self.name = inner.name
        self.quantiles = tuple(quantiles)
        self._rates: dict[float, float] = {}
        self._last: float = -math.inf
        self._uppers: dict[tuple[float, float, float | None], tuple[float | None, str]] = {}

    def observe(self, t: float, rate: float) -> None:
        if t in self._rates:
            if not math.isclose(self._rates[t], rate, rel_tol=1e-12, abs_tol=1e-12):
                raise ValueError(
                    f"rate {rate} at t={t} differs from the recorded {self._rates[t]}: a shared "
                    "forecaster serves only runs of the same trace, tick and metric window"
                )
            return
        if t < self._last:
            raise ValueError(
                f"t={t} was never observed and precedes t={self._last}: runs sharing a "
                "forecaster must use the same tick"
            )
        self.inner.observe(t, rate)
        self._rates[t] = rate
        self._last = t

    def upper(
        self, now: float, horizon_seconds: float, quantile: float | None = None
    ) -> float | None:
        """The recorded bound at ``now``; ``quantile`` (None: the inner forecaster's own) needs
        an inner forecaster that takes one, and the first run to reach ``now`` records the default
        and every quantile in ``quantiles`` too, since later runs replay a time the inner has
        passed (the inner caches per quantile, so the default costs nothing extra)."""
        key = (now, horizon_seconds, quantile)
        if key not in self._uppers:
            if now != self._last:
                raise ValueError(f"no recorded forecast at t={now}; observe t first")
            wanted = (quantile, None, *self.quantiles) if self.quantiles else (quantile,)
            for q in dict.fromkeys(wanted):
                value = (
                    self.inner.upper(now, horizon_seconds)
                    if q is None
                    else self.inner.upper(now, horizon_seconds, q)  # type: ignore[call-arg]
                )
                self._uppers[(now, horizon_seconds, q)] = (value, self.inner.name)
        value, self.name = self._uppers[key]
        return value

    def at_quantile(self, quantile: float) -> LoadForecaster:
        """This record seen at one quantile: what a run of the predictive policy configured
        with that quantile consumes. Runs at several quantiles then share one forecast pass,
        provided ``quantile`` is in ``quantiles``."""
        if quantile not in self.quantiles:
            raise ValueError(
                f"quantile {quantile} is not recorded; this forecaster records {self.quantiles}"
            )
        return _AtQuantile(self, quantile)


class _AtQuantile:
    """A :class:`SharedForecaster` answering at a fixed quantile."""

    def __init__(self, shared: SharedForecaster, quantile: float) -> None:
        self.shared = shared
        self.quantile = quantile

    @property
    def name(self) -> str:
        return self.shared.name

    def observe(self, t: float, rate: float) -> None:
        self.shared.observe(t, rate)

    def upper(self, now: float, horizon_seconds: float) -> float | None:
        return self.shared.upper(now, horizon_seconds, self.quantile)


class ClairvoyantForecaster:
    """The rate the autoscaler will measure over the horizon, read from the trace: a bound.

    Not a forecaster anyone can deploy: it answers with the exact highest 1-minute rate of the
    ticks in ``(now, now + horizon]``, so the predictive policy run with it shows what the
    decision rule (the larger of reactive and predictive, then the behavior) could achieve with a
    perfect forecast. Goals that even this misses cannot be reached by a better forecast, only
    by a different metric, target or rule.
    """

    name = "clairvoyant"

    def __init__(self, arrivals: np.ndarray, metric_window: float, tick: float) -> None:
        if metric_window <= 0 or tick <= 0:
            raise ValueError("metric_window and tick must be > 0 seconds")
        self.arrivals = np.asarray(arrivals, float)
        self.window = metric_window
        self.tick = tick

    def observe(self, t: float, rate: float) -> None:
        """Nothing to learn: the future is read from the trace."""

    def upper(self, now: float, horizon_seconds: float) -> float | None:
        ticks = now + self.tick * np.arange(1, max(1, math.floor(horizon_seconds / self.tick)) + 1)
        hi = np.searchsorted(self.arrivals, ticks, side="right")
        lo = np.searchsorted(self.arrivals, ticks - self.window, side="right")
        return float((hi - lo).max()) / self.window
