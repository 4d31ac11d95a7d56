"""Online aggregation of forecasters that tracks the best one as it changes (fixed-share Hedge).

Which candidate forecasts a series best changes from day to day (docs/predictor-accuracy.md: the
best candidate per day in hindsight beats any single one kept for the week), and a selection
that switches only on a significant lead across days reacts a day or more late. Hedge (the
exponentially weighted average forecaster) instead re-weights every expert after every point by
``exp(-learning_rate * loss)`` and forecasts with the weighted mean; its cumulative loss exceeds
the best expert's by at most ``ln(N) / learning_rate + learning_rate * T / 8`` on losses in
[0, 1] (Cesa-Bianchi and Lugosi 2006, thm 2.2), so ``learning_rate = sqrt(8 ln N / T)`` bounds
the regret by ``sqrt(T ln N / 2)``. Plain Hedge locks onto whoever led for long and needs as
long to let go; the **fixed share** (Herbster and Warmuth 1998, "Tracking the best expert")
mixes a fraction ``share`` of the prior back in after every update, so no expert's weight falls
below ``share * prior`` and a new leader takes over within about ``ln(1 / share) /
learning_rate`` units of loss: the regret is then against the best *sequence* of experts with a
few switches, not the best single one.

Losses are absolute errors (what WAPE adds up) divided by a scale of the series (its recent mean
level), so one learning rate serves series of any size. Each horizon keeps its own weights: the
expert that leads one step ahead need not lead eight steps ahead. The pure maths here knows
nothing of models; :mod:`predictor.models.tracking` feeds it forecasts and actuals.
"""

from __future__ import annotations

import numpy as np

LEARNING_RATE = 0.3
SHARE = 0.05


class FixedShareHedge:
    """Weights over ``prior``'s experts for each of ``horizons`` rows, updated by
    :meth:`step` (see the module doc)."""

    def __init__(
        self,
        prior: np.ndarray,
        horizons: int,
        learning_rate: float = LEARNING_RATE,
        share: float = SHARE,
    ) -> None:
        prior = np.asarray(prior, dtype=float)
        if prior.ndim != 1 or not len(prior) or (prior <= 0).any() or not np.isfinite(prior).all():
            raise ValueError("the prior needs one positive, finite weight per expert")
        if learning_rate < 0 or not 0 <= share <= 1:
            raise ValueError("learning_rate must be >= 0 and share within [0, 1]")
        self.prior = prior / prior.sum()
        self.learning_rate = learning_rate
        self.share = share
        self.weights = np.tile(self.prior, (horizons, 1))

    def step(self, losses: np.ndarray) -> None:
        """One round: ``losses`` (horizons x experts, scaled) for the forecasts just scored; a
        horizon whose row holds a NaN has nothing scored this round and keeps its weights. An
        expert with an infinite loss loses its weight but for the share."""
        losses = np.asarray(losses, dtype=float)
        scored = ~np.isnan(losses).any(axis=1)
        if not scored.any():
            return
        rows = losses[scored]
        # Relative to the round's least loss: the leader's weight is multiplied by 1, so the
        # sum cannot underflow to zero however large the losses.
        least = np.min(rows, axis=1, keepdims=True)
        least = np.where(np.isfinite(least), least, 0.0)
        updated = self.weights[scored] * np.exp(-self.learning_rate * (rows - least))
        total = updated.sum(axis=1, keepdims=True)
        fallback = ~(np.isfinite(total) & (total > 0))
        updated = np.where(fallback, self.prior, updated / np.where(fallback, 1.0, total))
        self.weights[scored] = (1.0 - self.share) * updated + self.share * self.prior

    def combine(self, forecasts: np.ndarray) -> np.ndarray:
        """The weighted mean of ``forecasts`` (experts x horizons) per horizon."""
        return np.einsum("hn,nh->h", self.weights, forecasts)
