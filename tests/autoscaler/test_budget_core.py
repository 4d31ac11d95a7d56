"""The budget allocation core: properties over random tenants, then worked examples."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from autoscaler.core.budget import (
    CAP,
    FAIR_SHARE,
    OVER_BUDGET,
    PRIORITY,
    RECLAIMING,
    Tenant,
    admit,
    allocate,
)

EPS = 1e-9


@st.composite
def tenants(draw, same_gpus=False, same_priority=False, floors=True, guarantees=True):
    n = draw(st.integers(1, 6))
    gpus = draw(st.sampled_from([1, 2, 4]))
    out = []
    for i in range(n):
        g = gpus if same_gpus else draw(st.sampled_from([0.5, 1, 2, 4]))
        current = draw(st.integers(0, 12))
        out.append(
            Tenant(
                name=f"t{i}",
                gpus_per_replica=g,
                current=current,
                proposal=draw(st.integers(0, 20)),
                floor=draw(st.integers(0, current)) if floors else 0,
                priority=0 if same_priority else draw(st.integers(0, 3)),
                weight=draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])),
                guaranteed_gpus=draw(st.integers(0, 8)) if guarantees else 0,
                cap_gpus=draw(st.one_of(st.none(), st.integers(0, 30))),
                preempt=draw(st.booleans()),
            )
        )
    return out


def used(shares, ts):
    return sum(shares[t.name].allowed * t.gpus_per_replica for t in ts)


@settings(max_examples=300, deadline=None)
@given(tenants(floors=False), st.integers(0, 60))
def test_never_exceeds_the_budget(ts, total):
    shares = allocate(total, ts)
    assert used(shares, ts) <= total + EPS
    for t in ts:
        assert 0 <= shares[t.name].allowed <= t.demand


@settings(max_examples=300, deadline=None)
@given(tenants(), st.integers(0, 60))
def test_with_floors_nobody_grows_while_the_pool_is_over_committed(ts, total):
    shares = allocate(total, ts)
    if used(shares, ts) > total + EPS:
        assert all(shares[t.name].allowed <= t.current for t in ts)
    for t in ts:  # reclaiming keeps what the tenant's behavior or a preemption leaves it
        assert shares[t.name].allowed >= min(t.demand, t.floor, t.current) or (
            shares[t.name].allowed >= min(t.demand, t.guaranteed_replicas)
            and any(o.preempt and o.priority > t.priority for o in ts)
        )


@settings(max_examples=300, deadline=None)
@given(tenants(floors=False), st.integers(0, 60))
def test_guaranteed_shares_are_honoured_when_they_fit(ts, total):
    need = sum(min(t.demand, t.guaranteed_replicas) * t.gpus_per_replica for t in ts)
    shares = allocate(total, ts)
    if need <= total:
        for t in ts:
            assert shares[t.name].allowed >= min(t.demand, t.guaranteed_replicas)


@settings(max_examples=300, deadline=None)
@given(tenants(), st.integers(0, 60), st.data())
def test_raising_a_priority_never_lowers_the_allocation(ts, total, data):
    i = data.draw(st.integers(0, len(ts) - 1))
    raised = list(ts)
    raised[i] = dataclasses.replace(ts[i], priority=ts[i].priority + data.draw(st.integers(1, 4)))
    before = allocate(total, ts)[ts[i].name].allowed
    after = allocate(total, raised)[ts[i].name].allowed
    assert after >= before


@settings(max_examples=300, deadline=None)
@given(
    tenants(same_gpus=True, same_priority=True, floors=False, guarantees=False), st.integers(0, 60)
)
def test_equal_priorities_get_weighted_max_min_fair_shares(ts, total):
    shares = allocate(total, ts)
    left = total - used(shares, ts)
    for i in ts:
        a_i = shares[i.name].allowed
        if a_i >= i.demand:
            continue
        # Work-conserving: an unsatisfied tenant is short only because its next replica does
        # not fit in what is left ...
        assert left < i.gpus_per_replica + EPS
        # ... and no one holds a replica it would not have got before i's last one.
        for j in ts:
            a_j = shares[j.name].allowed
            if a_j > 0:
                assert (a_j - 1) * j.gpus_per_replica / j.weight <= (
                    a_i * i.gpus_per_replica / i.weight + EPS
                )


@settings(max_examples=200, deadline=None)
@given(tenants(), st.integers(0, 60), st.data())
def test_admitted_growth_never_lands_on_gpus_others_still_hold(ts, total, data):
    me = data.draw(st.sampled_from(ts))
    others = sum(t.current * t.gpus_per_replica for t in ts if t.name != me.name)
    share = admit(total, ts, me.name, {})
    if share.allowed > me.current:
        assert others + share.allowed * me.gpus_per_replica <= total + EPS
    assert share.allowed <= allocate(total, ts)[me.name].allowed


def t(name, proposal, *, gpus=1, current=0, **kw):
    return Tenant(name, gpus, current, proposal, **kw)


def test_weights_split_a_contended_priority_two_to_one():
    shares = allocate(9, [t("a", 10, weight=2), t("b", 10, weight=1)])
    assert (shares["a"].allowed, shares["b"].allowed) == (6, 3)
    assert shares["a"].reason == shares["b"].reason == FAIR_SHARE


def test_higher_priority_first_then_best_effort_takes_the_rest():
    shares = allocate(
        10, [t("chat", 7, priority=10), t("search", 5, priority=5), t("backfill", 100)]
    )
    assert [shares[n].allowed for n in ("chat", "search", "backfill")] == [7, 3, 0]
    assert shares["search"].reason == PRIORITY
    assert shares["chat"].reason is None


def test_a_guarantee_beats_priority_and_a_cap_bounds_the_demand():
    shares = allocate(
        8,
        [t("hi", 20, priority=9), t("lo", 6, guaranteed_gpus=3), t("capped", 9, cap_gpus=0)],
    )
    assert (shares["hi"].allowed, shares["lo"].allowed) == (5, 3)
    assert shares["capped"].allowed == 0 and shares["capped"].reason == CAP


def test_reclaiming_waits_for_the_lower_priority_behavior_unless_preempting():
    lo = t("lo", 8, current=8, floor=6)
    waits = allocate(8, [t("hi", 6, priority=9), lo])
    assert (waits["hi"].allowed, waits["lo"].allowed) == (2, 6)  # lo: one GPU a tick
    assert waits["hi"].reason == RECLAIMING
    preempts = allocate(8, [t("hi", 6, priority=9, preempt=True), lo])
    assert (preempts["hi"].allowed, preempts["lo"].allowed) == (6, 2)


def test_a_shrunk_budget_shrinks_the_low_priority_first_and_nobody_grows():
    ts = [t("hi", 6, current=5, floor=0, priority=9), t("lo", 3, current=3, floor=2)]
    shares = allocate(4, ts)
    assert (shares["hi"].allowed, shares["lo"].allowed) == (4, 2)  # lo: as far as it may
    assert shares["hi"].reason == shares["lo"].reason == OVER_BUDGET


def test_gpu_free_targets_are_not_governed_and_gpu_sizes_mix():
    shares = allocate(5, [t("cpu", 7, gpus=0), t("big", 2, gpus=4), t("small", 9, gpus=0.5)])
    assert shares["cpu"].allowed == 7 and shares["cpu"].reason is None
    assert shares["big"].allowed * 4 + shares["small"].allowed * 0.5 <= 5


def test_admit_holds_growth_until_the_others_have_shrunk():
    ts = [t("hi", 6, priority=9, current=2), t("lo", 2, current=6, floor=2)]
    assert allocate(8, ts)["hi"].allowed == 6
    now = admit(8, ts, "hi", {})
    assert now.allowed == 2 and now.reason == RECLAIMING
    assert admit(8, ts, "hi", {"lo": 2}).allowed == 6
