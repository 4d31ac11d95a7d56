"""Bounds from hindsight on what any selection among a set of candidates could score.

A selection rule sees only the past; these pick with the test window's own actuals, so no rule
that chooses among the same candidates on the same schedule can do better. They tell a goal that
better selection could still reach from one that needs better candidates. Absolute errors add up
over points, so the best choice of each block of points is found block by block: the candidate
with the least error (a single pick), or the convex weights with the least error (a linear
programme: stacking or any fixed weighting for that block). Points whose actual is not finite
are left out; scores are WAPE in percent, as :func:`predictor.backtest.wape`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import pairwise

import numpy as np
from scipy import sparse
from scipy.optimize import linprog


def _blocks(
    actual: np.ndarray, points: Mapping[str, np.ndarray], block_starts: Sequence[int]
) -> tuple[list[np.ndarray], list[np.ndarray], float]:
    """Per block (a block starts at each row of ``block_starts``, the first 0): its actuals,
    its forecasts (points x candidates), and the sum of every absolute actual."""
    ok = np.isfinite(actual)
    forecasts = np.column_stack([np.asarray(p, dtype=float) for p in points.values()])
    bounds = [*block_starts, len(actual)]
    rows = [np.arange(a, b)[ok[a:b]] for a, b in pairwise(bounds)]
    rows = [r for r in rows if len(r)]
    return [actual[r] for r in rows], [forecasts[r] for r in rows], float(np.abs(actual[ok]).sum())


def best_pick_wape(
    actual: np.ndarray, points: Mapping[str, np.ndarray], block_starts: Sequence[int]
) -> float:
    """WAPE of the candidate with the least absolute error in each block, picked in hindsight.
    With the blocks of the service's re-selection it bounds any rule that picks one candidate
    per block; with one row per block, any switching among the candidates point by point. A
    candidate that gave no forecast somewhere in a block cannot be picked there."""
    if not points:
        return float("nan")
    actuals, forecasts, total = _blocks(actual, points, block_starts)
    error = 0.0
    for a, f in zip(actuals, forecasts, strict=True):
        per_candidate = np.abs(f - a[:, None]).sum(axis=0)
        error += float(np.min(np.where(np.isfinite(per_candidate), per_candidate, np.inf)))
    return 100.0 * error / total if total > 0 else float("nan")


def best_weights_wape(
    actual: np.ndarray, points: Mapping[str, np.ndarray], block_starts: Sequence[int]
) -> float:
    """WAPE of the convex weights over the candidates with the least absolute error in each
    block, chosen in hindsight: it bounds any rule that sets, per block, one combination of
    them (a single pick, stacking, inverse-error weights; a median of candidates is itself a
    candidate here). Candidates that gave no forecast somewhere in a block are left out of it."""
    if not points:
        return float("nan")
    actuals, forecasts, total = _blocks(actual, points, block_starts)
    error = 0.0
    for a, f in zip(actuals, forecasts, strict=True):
        error += least_absolute_weights(a, f[:, np.isfinite(f).all(axis=0)])[1]
    return 100.0 * error / total if total > 0 else float("nan")


def least_absolute_weights(
    actual: np.ndarray, forecasts: np.ndarray, point_weights: np.ndarray | None = None
) -> tuple[np.ndarray, float]:
    """The convex weights over the columns of ``forecasts`` (points x candidates) whose
    combination has the least (``point_weights``-weighted) sum of absolute errors on
    ``actual``, and that sum: a linear programme, solved by HiGHS. In hindsight it bounds a
    block's combinations; fitted on past errors, it is a combination rule that sees only the
    past. Every value must be finite."""
    n, k = forecasts.shape
    w = np.ones(n) if point_weights is None else np.asarray(point_weights, dtype=float)
    # Variables: k weights, then n over- and n under-forecast parts of the errors.
    cost = np.concatenate([np.zeros(k), w, w])
    # Sparse: the error parts are identities, and a fit on past errors may hold weeks of points.
    identity = sparse.identity(n, format="csr")
    equalities = sparse.vstack(
        [
            sparse.hstack([sparse.csr_matrix(forecasts), identity, -identity]),
            sparse.hstack([np.ones((1, k)), sparse.csr_matrix((1, 2 * n))]),
        ],
        format="csr",
    )
    result = linprog(cost, A_eq=equalities, b_eq=np.append(actual, 1.0), method="highs")
    if not result.success:
        raise ValueError(f"least absolute weights: {result.message}")
    return np.asarray(result.x[:k]), float(result.fun)
