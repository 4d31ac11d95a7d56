"""Which model's batch the shared device runs next, and what admission counts as ahead: pure."""

from __future__ import annotations

import math

import pytest

from batcher.dispatch_order import (
    MAX_OTHERS_FRACTION,
    Claim,
    next_claim,
    others_ahead_fraction,
    over_share,
    stretch_for_others,
)


def claim(model: str, *, deadline: float, used: float = 0.0, seq: int = 0, **kw) -> Claim:
    return Claim(model, kw.pop("best_effort", False), deadline, used, seq, **kw)


def test_online_goes_before_best_effort_whatever_the_deadlines() -> None:
    online = claim("a", deadline=9.0, seq=1)
    best_effort = claim("b", deadline=1.0, seq=0, best_effort=True)
    assert next_claim([best_effort, online]) is online


def test_earliest_deadline_first_among_models_within_their_share() -> None:
    early = claim("a", deadline=1.0, used=0.5, seq=1)
    late = claim("b", deadline=2.0, used=0.5, seq=0)
    assert next_claim([late, early]) is early


def test_a_model_over_its_share_waits_for_one_within_it_despite_an_earlier_deadline() -> None:
    # The burst: model a used most of the device lately; b's request is later but goes first.
    bursting = claim("a", deadline=1.0, used=1.8, seq=0)
    quiet = claim("b", deadline=1.5, used=0.1, seq=1)
    assert over_share(bursting, [bursting, quiet])
    assert not over_share(quiet, [bursting, quiet])
    assert next_claim([bursting, quiet]) is quiet


def test_weights_set_the_share() -> None:
    # a used three times b's time but has three times b's weight: both are at their share.
    heavy = claim("a", deadline=2.0, used=0.9, seq=0, weight=3.0)
    light = claim("b", deadline=1.0, used=0.3, seq=1, weight=1.0)
    assert not over_share(heavy, [heavy, light]) and not over_share(light, [heavy, light])
    assert next_claim([heavy, light]) is light  # then by deadline


def test_a_lone_claim_is_never_over_its_share_and_ties_go_to_the_first_claim() -> None:
    alone = claim("a", deadline=1.0, used=5.0)
    assert not over_share(alone, [alone])
    first = claim("a", deadline=1.0, used=0.2, seq=0)
    second = claim("b", deadline=1.0, used=0.2, seq=1)
    assert next_claim([second, first]) is first


def test_best_effort_claims_compare_shares_among_themselves() -> None:
    online = claim("a", deadline=math.inf, used=2.0)
    best_effort = claim("b", deadline=math.inf, used=0.0, best_effort=True)
    assert not over_share(online, [online, best_effort])  # no online rival


def test_admission_counts_as_ahead_only_the_models_served_first() -> None:
    used = {"burst": (1.6, 1.0), "quiet": (0.2, 1.0)}
    # The bursting model's work waits behind the quiet one's 0.2 s of every 2 s ...
    assert others_ahead_fraction("burst", used, 2.0) == pytest.approx(0.1)
    # ... while the quiet model goes first and counts nothing of the burst as ahead.
    assert others_ahead_fraction("quiet", used, 2.0) == 0.0
    assert stretch_for_others(0.1) == pytest.approx(1 / 0.9)
    assert stretch_for_others(0.0) == 1.0


def test_equal_users_each_count_the_other_and_the_stretch_is_bounded() -> None:
    used = {"a": (1.0, 1.0), "b": (1.0, 1.0)}
    assert others_ahead_fraction("a", used, 2.0) == pytest.approx(0.5)
    assert stretch_for_others(0.5) == pytest.approx(2.0)
    hog = {"a": (0.0, 1.0), "b": (5.0, 1.0), "c": (5.0, 1.0)}
    assert others_ahead_fraction("b", hog, 2.0) == MAX_OTHERS_FRACTION
    assert stretch_for_others(1.0) == pytest.approx(1 / (1 - MAX_OTHERS_FRACTION))
    assert others_ahead_fraction("unknown", hog, 2.0) == 0.0
