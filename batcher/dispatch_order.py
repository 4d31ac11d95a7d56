"""Which model's batch runs next on a device that several models share: pure rules, no clock.

Each model forms its own batches (its own queue, cap and SLO; :mod:`batcher.policy`); when more
than one has a batch ready, the device goes to one of them by these rules, in order:

1. online before best-effort: best-effort work of any model runs only when no model has an online
   batch ready;
2. a model within its fair share of recent device time before one over it. The share is the
   model's weight over the weights of the models asking now, and "over" means it used more device
   time per unit of weight than the models asking do on average. Earliest deadline first alone
   is optimal only while the admitted work is feasible; each model admits against its own
   backlog, so a burst on one model fills the device up to its own SLO, and another model's
   requests, arriving later with later deadlines, would then wait behind all of it and be late.
   Serving the model that has used less first bounds that wait to the batch running now (with
   two models the device already alternates under contention, since a model asks again only
   after its batch; the rule decides among three or more);
3. earliest dispatch deadline first (the most urgent request of each batch);
4. the claim made first.

Admission must agree with the order, or a model would accept work the order then delays: a model
counts as ahead of it the device time of the models that the order serves first (those that used
less per weight), and predicts its own batches stretched by that fraction
(:func:`stretch_for_others`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

MAX_OTHERS_FRACTION = 0.9  # admission never assumes a model keeps less than a tenth of the device


@dataclass(frozen=True)
class Claim:
    """A model with a batch ready, asking for the device."""

    model: str
    best_effort: bool  # the batch is best-effort work
    deadline: float  # dispatch deadline of its most urgent request (inf: none)
    used_seconds: float  # device time the model spent within the recent window
    seq: int  # order in which the claims were made
    weight: float = 1.0  # the model's share of the device relative to the others


def over_share(claim: Claim, claims: Sequence[Claim]) -> bool:
    """Whether ``claim``'s model used more device time per weight than the claimants average."""
    rivals = [c for c in claims if c.best_effort == claim.best_effort]
    total_weight = sum(c.weight for c in rivals)
    if len(rivals) < 2 or total_weight <= 0:
        return False
    mean = sum(c.used_seconds for c in rivals) / total_weight
    return claim.used_seconds / claim.weight > mean


def next_claim(claims: Sequence[Claim]) -> Claim:
    """The claim the device serves next (see the module's rules); ``claims`` must not be empty."""
    return min(claims, key=lambda c: (c.best_effort, over_share(c, claims), c.deadline, c.seq))


def others_ahead_fraction(
    model: str, used: Mapping[str, tuple[float, float]], window: float
) -> float:
    """Fraction of the device that models served before ``model`` used within ``window`` seconds.

    ``used`` maps each model to ``(device seconds in the window, weight)``. The models ahead are
    those that used no more per weight than ``model`` did: the order serves them first.
    """
    if window <= 0 or model not in used:
        return 0.0
    own_seconds, own_weight = used[model]
    own = own_seconds / own_weight
    ahead = sum(
        seconds
        for name, (seconds, weight) in used.items()
        if name != model and seconds / weight <= own
    )
    return min(MAX_OTHERS_FRACTION, ahead / window)


def stretch_for_others(fraction: float) -> float:
    """Factor by which a model's batches take longer to get through when ``fraction`` of the
    device goes to models served before it."""
    return 1.0 / (1.0 - min(fraction, MAX_OTHERS_FRACTION))
