"""Choose the model for a series by how it did out of sample over its whole history.

**Backtest.** Everything after the first quarter of the history (at most ``MAX_BLOCKS`` blocks
back) is cut into *blocks* of one cycle of the shortest season (a day, usually; without a season,
four times the deepest horizon). Each candidate is refitted from scratch on everything before a
block and then only updated, as the scheduled refit would do, and its forecasts at every origin
and horizon are kept. Refitting before every block would cost too much on a long history, so
consecutive blocks share a refit, at most ``MAX_REFITS`` of them (an expanding origin). Only
points before the selection are ever used.

**Combinations.** A combination's members are fitted alone, exactly as when they compete on
their own, so a combination is scored from its members' forecasts (:meth:`Combination.
combine_paths`) without fitting anything again. A candidate that fails is left out with its
error, never fatal; one that cannot run on the older blocks (too little history then) is scored
on those it can run on, provided the most recent is one of them.

**Choice.** Each candidate's errors are pooled over its blocks, the recent ones counting more
(a weight that halves every ``half_life`` blocks back). The lowest pooled WAPE is the
*challenger*; it replaces the *incumbent* (the previous selection's choice; the first time, the
median ensemble, a combination of models of different kinds and the a-priori safest choice)
only when a paired test on their per-block WAPE says the lead is real: the recency-weighted
mean of the differences must exceed z standard errors (a one-sided Diebold-Mariano test on
block losses, with the effective number of blocks the weights leave), z at level
``SWITCH_ALPHA`` shared among the rivals the challenger was picked from (Bonferroni: the best of
ten equals usually leads by chance). A lead within the block-to-block noise is no evidence,
and each needless switch picks whichever model was luckier on the last days. With fewer than
two blocks in common the lowest pooled WAPE wins. The same rule picks the overall model on the
mean WAPE over the horizons.

**Intervals.** The forecast errors of this backtest are out of sample for every candidate. The
most recent of them, per horizon, from fits on at least half the history
(``CALIBRATION_HISTORY``: a fit on a few days errs more widely than the live model on weeks
will), become the chosen model's calibration errors (:meth:`Selection.calibrate`): a
split-conformal upper bound whose errors come from fits that never saw their points, instead
of each model's own calibration tail (in sample for a model estimated on all of it, such as
ETS). Those fits are older on average than the service's (a refit every few blocks), so the
errors may run wide; the adaptive conformal step of every model (:meth:`ForecastModel.predict`)
then moves the level of each horizon's bound toward the target coverage as live points arrive.
"""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from statistics import NormalDist

import numpy as np

from predictor.backtest import (
    FAILURES,
    BacktestResult,
    OriginForecasts,
    coverage,
    expanding_origin,
    forecast_targets,
    smape,
    under_rate,
    wape,
)
from predictor.intervals import conformal_quantile
from predictor.models.base import ForecastModel
from predictor.models.ensemble import Combination

log = logging.getLogger(__name__)

MAX_REFITS = 6
MAX_BLOCKS = 28
HALF_LIFE_BLOCKS = 7.0
SWITCH_ALPHA = 0.05
PREFERRED = ("ensemble", "combination")
FIRST_FRACTION = 0.25
CALIBRATION_POINTS = 500
CALIBRATION_HISTORY = 0.5
MIN_REFIT_POINTS = 20

# per candidate: block index -> horizon -> WAPE on that block alone
BlockScores = Mapping[str, Mapping[int, Mapping[int, float]]]


@dataclass
class Selection:
    """The winner per horizon and overall, every candidate's scores and failures, and the
    out-of-sample errors (per candidate and horizon: errors, levels) that calibrate bounds."""

    overall: str
    per_horizon: dict[int, str]
    results: dict[str, BacktestResult]
    failures: dict[str, str] = field(default_factory=dict)
    block_wape: dict[str, dict[int, dict[int, float]]] = field(default_factory=dict)
    calibration: dict[str, dict[int, tuple[np.ndarray, np.ndarray]]] = field(
        default_factory=dict, repr=False
    )

    def calibrate(self, model: ForecastModel) -> None:
        """Give a freshly fitted ``model`` the backtest's out-of-sample errors of the candidate
        of its name as its calibration errors (nothing when there are none)."""
        errors = self.calibration.get(model.name)
        if errors:
            model.recalibrate(errors)


def _finite(value: float) -> float:
    return value if math.isfinite(value) else math.inf


def _keep_or_switch(
    names: list[str],
    pooled: Callable[[str], float],
    per_block: Callable[[str], dict[int, float]],
    incumbent: str | None,
    weights: Mapping[int, float],
) -> str:
    """The lowest pooled score, unless the incumbent's per-block deficit is not significant
    (see the module doc)."""
    best = min(names, key=lambda n: _finite(pooled(n)))
    if incumbent not in names or incumbent == best or not math.isfinite(pooled(incumbent)):
        return best
    best_blocks, incumbent_blocks = per_block(best), per_block(incumbent)
    common = [
        k
        for k in sorted(best_blocks.keys() & incumbent_blocks.keys())
        if math.isfinite(best_blocks[k]) and math.isfinite(incumbent_blocks[k])
    ]
    if len(common) < 2:
        return best
    d = np.array([incumbent_blocks[k] - best_blocks[k] for k in common])
    w = np.array([weights.get(k, 1.0) for k in common])
    return best if significant_lead(d, w, switch_z(len(names))) else incumbent


def switch_z(candidates: int, alpha: float = SWITCH_ALPHA) -> float:
    """The one-sided normal quantile a challenger's lead must pass: the challenger is the best
    of ``candidates - 1`` rivals of the incumbent, so the level is shared among them
    (Bonferroni), or the luckiest of many equals would win most selections."""
    return NormalDist().inv_cdf(1.0 - alpha / max(1, candidates - 1))


def significant_lead(differences: np.ndarray, weights: np.ndarray, z: float = 1.645) -> bool:
    """Whether the recency-weighted mean of paired per-block differences (incumbent minus
    challenger) exceeds ``z`` standard errors, with the effective number of blocks
    ``(sum w)^2 / sum w^2`` (one-sided Diebold-Mariano on block losses)."""
    total = weights.sum()
    mean = float(weights @ differences / total)
    n_eff = total**2 / float(weights @ weights)
    if n_eff <= 1.0:
        return mean > 0
    variance = float(weights @ (differences - mean) ** 2 / total) * n_eff / (n_eff - 1.0)
    return mean > z * math.sqrt(variance / n_eff)


def choose(
    results: Mapping[str, BacktestResult],
    horizons: Sequence[int],
    block_wape: BlockScores | None = None,
    previous: Selection | None = None,
    block_weights: Mapping[int, float] | None = None,
) -> Selection:
    """Pick the model per horizon and overall from ``results`` (in order; ties to the first).

    Without ``block_wape`` (per-block scores) the lowest WAPE wins; with them, the incumbent
    (``previous``'s choice, else a combination) stays unless the challenger's lead is
    significant across blocks (weighted by ``block_weights``, default equal).
    """
    if not results:
        raise ValueError("no backtest results to choose from")
    names = list(results)
    blocks = block_wape or {}
    weights = block_weights or {}

    def block_scores(name: str, h: int | None) -> dict[int, float]:
        by_block = blocks.get(name, {})
        if h is not None:
            return {k: v[h] for k, v in by_block.items()}
        return {k: float(np.mean([v[x] for x in horizons])) for k, v in by_block.items()}

    def incumbent(h: int | None) -> str | None:
        if previous is not None:
            chosen = previous.overall if h is None else previous.per_horizon.get(h)
            if chosen in results:
                return chosen
        return next((n for n in PREFERRED if n in results), None)

    def pooled_wape(name: str, h: int) -> float:
        return results[name].wape[h]

    per_h = {
        h: _keep_or_switch(
            names,
            partial(pooled_wape, h=h),
            partial(block_scores, h=h),
            incumbent(h),
            weights,
        )
        for h in horizons
    }
    overall = _keep_or_switch(
        names,
        lambda n: float(np.mean([results[n].wape[h] for h in horizons])),
        lambda n: block_scores(n, None),
        incumbent(None),
        weights,
    )
    return Selection(
        overall=overall,
        per_horizon=per_h,
        results=dict(results),
        block_wape={n: {k: dict(v) for k, v in f.items()} for n, f in blocks.items()},
    )


def block_length(max_horizon: int, cycle: int = 0) -> int:
    """Points per scoring block: one cycle of the shortest season, so that every block scores
    every hour of the day alike and blocks are comparable; without a season, four times the
    deepest horizon."""
    return max(cycle, 2 * max_horizon) if cycle else 4 * max_horizon


def validation_blocks(n_points: int, max_horizon: int, cycle: int = 0) -> tuple[int, int]:
    """(first validation origin, block length): whole blocks ending at ``n_points`` after the
    first quarter of the history, at least one and at most ``MAX_BLOCKS``."""
    block = block_length(max_horizon, cycle)
    count = (n_points - int(n_points * FIRST_FRACTION)) // block
    count = max(1, min(count, MAX_BLOCKS))
    if n_points - count * block < 2:
        block = max(2 * max_horizon, (n_points - 2) // count)
    return n_points - count * block, block


def minimum_history(max_horizon: int) -> int:
    """The fewest points on which selection can backtest every horizon (a block of four times
    the deepest horizon) and still fit on two."""
    return 4 * max_horizon + 2


def points_to_refit(max_horizon: int) -> int:
    """The fewest points a running target refits on: enough to backtest every horizon, and
    never fewer than ``MIN_REFIT_POINTS``, below which no candidate's fit means much. The
    lookback is checked against it at start, so a target cannot wait for points forever."""
    return max(MIN_REFIT_POINTS, minimum_history(max_horizon))


def refit_starts(first: int, block: int, count: int, max_refits: int = MAX_REFITS) -> list[int]:
    """Where the expanding-origin refits happen: at the start of evenly spread blocks, at most
    ``max_refits`` of them, the first at ``first``."""
    groups = max(1, min(count, max_refits))
    return [first + block * ((count * g) // groups) for g in range(groups)]


def _conformal_upper(point: np.ndarray, actual: np.ndarray, block: int, q: float) -> np.ndarray:
    """Upper bounds for each origin from the errors of the blocks before its own (split
    conformal, at most the last ``CALIBRATION_POINTS`` errors; +inf in the first block)."""
    upper = np.full(point.shape, np.inf)
    errors = actual - point
    for start in range(block, len(point), block):
        for i in range(point.shape[1]):
            seen = errors[: start - i, i]  # targets observed before this block's first origin
            seen = seen[np.isfinite(seen)][-CALIBRATION_POINTS:]
            if len(seen):
                upper[start : start + block, i] = point[start : start + block, i] + max(
                    conformal_quantile(seen, q), 0.0
                )
    return upper


def _score(
    name: str,
    point: np.ndarray,
    actual: np.ndarray,
    horizons: Sequence[int],
    block: int,
    weights: np.ndarray,
    quantile: float,
) -> tuple[BacktestResult, dict[int, dict[int, float]]]:
    """Pooled (recency-weighted) scores over the blocks a candidate ran on, and its WAPE per
    block and horizon."""
    upper = _conformal_upper(point, actual, block, quantile)
    n_blocks = len(point) // block
    ran = [k for k in range(n_blocks) if np.isfinite(point[k * block : (k + 1) * block]).all()]
    per_block: dict[int, dict[int, float]] = {}
    acts, points, uppers, ws = {}, {}, {}, {}
    for h in horizons:
        rows = np.concatenate([np.arange(k * block, (k + 1) * block) for k in ran])
        rows = rows[np.isfinite(actual[rows, h - 1])]
        acts[h], points[h], uppers[h] = (m[rows, h - 1] for m in (actual, point, upper))
        ws[h] = weights[rows // block]
        for k in ran:
            r = slice(k * block, (k + 1) * block)
            ok = np.isfinite(actual[r, h - 1])
            per_block.setdefault(k, {})[h] = wape(actual[r, h - 1][ok], point[r, h - 1][ok])
    covered = {h: uppers[h] < np.inf for h in horizons}
    result = BacktestResult(
        model=name,
        horizons=tuple(horizons),
        wape={h: wape(acts[h], points[h], ws[h]) for h in horizons},
        smape={h: smape(acts[h], points[h], ws[h]) for h in horizons},
        under_rate={h: under_rate(acts[h], points[h], ws[h]) for h in horizons},
        coverage={
            h: coverage(acts[h][covered[h]], uppers[h][covered[h]], ws[h][covered[h]])
            for h in horizons
        },
        fit_seconds=float("nan"),
        update_seconds=float("nan"),
        origins=len(acts[horizons[0]]),
        actual=acts,
        point=points,
        upper=uppers,
    )
    return result, per_block


def _calibration_errors(
    point: np.ndarray, actual: np.ndarray, max_horizon: int, skip: int = 0
) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """The most recent out-of-sample errors per horizon (and the forecasts they were made
    at), from row ``skip`` on."""
    out = {}
    for h in range(1, max_horizon + 1):
        ok = np.isfinite(point[:, h - 1]) & np.isfinite(actual[:, h - 1])
        ok[:skip] = False
        levels = point[ok, h - 1][-CALIBRATION_POINTS:]
        out[h] = (actual[ok, h - 1][-CALIBRATION_POINTS:] - levels, levels)
    return out


def candidate_forecasts(
    factories: Mapping[str, Callable[[], ForecastModel]],
    y: np.ndarray,
    first: int,
    starts: Sequence[int],
    max_horizon: int,
) -> tuple[dict[str, OriginForecasts], dict[str, str], list[str]]:
    """Every candidate's forecasts at every origin from ``first`` on, refitted at ``starts``
    (:func:`~predictor.backtest.expanding_origin`); combinations from their members' (a member
    that is no candidate is backtested too, under its own name). Returns the forecasts, the
    errors of candidates that failed somewhere, and the names of the candidates that could be
    built. A combination that is itself a member of another (a temporal hierarchy in the median
    ensemble) is backtested whole, as a member, so that the outer one has its tails."""
    errors: dict[str, str] = {}
    instances: dict[str, ForecastModel] = {}
    for name, factory in factories.items():
        try:
            instances[name] = factory()
        except FAILURES as exc:
            errors[name] = str(exc)
    composites = {n: m for n, m in instances.items() if isinstance(m, Combination)}
    makers: dict[str, Callable[[], ForecastModel]] = {
        n: factories[n] for n in instances if n not in composites
    }
    # A combination that is a member of another is backtested whole: its own members are not.
    nested = {m.name for c in composites.values() for m in c.members if isinstance(m, Combination)}
    for name, composite in composites.items():
        for member in composite.members if name not in nested else ():
            makers.setdefault(member.name, partial(copy.deepcopy, member))
    forecasts: dict[str, OriginForecasts] = {}
    for name, make in makers.items():
        forecasts[name] = expanding_origin(make, y, first, starts, max_horizon)
        error = forecasts[name].error
        if error:
            errors.setdefault(name, error)
    actual = forecast_targets(y, first, max_horizon)
    for name, composite in composites.items():
        if name in forecasts:
            continue  # a member of another combination: backtested whole, with its tails
        members = composite.member_names()
        point = np.full((len(y) - first, max_horizon), np.nan)
        for start, end in zip(starts, [*starts[1:], len(y)], strict=True):
            if not all(start in forecasts[m].tails for m in members):
                continue
            rows = slice(start - first, end - first)
            paths = {m: forecasts[m].point[rows] for m in members}
            tails = {m: forecasts[m].tails[start] for m in members}
            point[rows] = composite.combine_paths(paths, tails, actual[rows], y[:start])
        forecasts[name] = OriginForecasts(point)
    return forecasts, errors, list(instances)


def select_model(
    factories: Mapping[str, Callable[[], ForecastModel]],
    series: np.ndarray,
    horizons: Sequence[int],
    quantile: float = 0.9,
    previous: Selection | None = None,
    cycle: int = 0,
    half_life: float = HALF_LIFE_BLOCKS,
    max_refits: int = MAX_REFITS,
) -> Selection:
    """Backtest every candidate over the history in blocks of ``cycle`` points (the shortest
    season) with expanding-origin refits, and choose on the recency-weighted pooled WAPE,
    keeping ``previous``'s choice (or a combination) unless a challenger's lead is significant
    (see the module doc)."""
    y = np.asarray(series, dtype=float)
    hs = tuple(sorted({int(h) for h in horizons}))
    max_horizon = max(hs)
    first, block = validation_blocks(len(y), max_horizon, cycle)
    count = (len(y) - first) // block
    starts = refit_starts(first, block, count, max_refits)
    block_weights = 0.5 ** ((count - 1 - np.arange(count)) / half_life)

    backtests, errors, names = candidate_forecasts(factories, y, first, starts, max_horizon)
    actual = forecast_targets(y, first, max_horizon)
    last_rows = slice((count - 1) * block, count * block)
    pooled: dict[str, BacktestResult] = {}
    block_wape: dict[str, dict[int, dict[int, float]]] = {}
    failures: dict[str, str] = {}
    for name in names:
        point = backtests[name].point
        if not np.isfinite(point[last_rows]).all():
            failures[name] = errors.get(name, "not scored on the most recent block")
            log.info("candidate left out", extra={"model": name, "reason": failures[name]})
            continue
        pooled[name], block_wape[name] = _score(
            name, point, actual, hs, block, block_weights, quantile
        )
    for name, error in errors.items():
        if name not in factories or name in pooled:
            continue
        failures.setdefault(name, error)
    if not pooled:
        raise ValueError(f"no model could be backtested: {failures}")
    selection = choose(pooled, hs, block_wape, previous, dict(enumerate(block_weights.tolist())))
    selection.failures = failures
    chosen = {selection.overall, *selection.per_horizon.values()}
    # Errors of fits on much less history than now are wider than the live model's will be
    # (not exchangeable with them): calibrate on those of fits on at least half of it.
    recent = [s for s in starts if s >= len(y) * CALIBRATION_HISTORY] or starts[-1:]
    selection.calibration = {
        name: _calibration_errors(backtests[name].point, actual, max_horizon, recent[0] - first)
        for name in chosen
    }
    return selection
