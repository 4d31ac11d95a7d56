"""Lease leader election through the real kubernetes client against the fake API server."""

from __future__ import annotations

import pytest

from autoscaler.controller.leader import LeaderElector
from tests.autoscaler.fake_kube import FakeKubeServer


class Clock:
    def __init__(self, now: float = 1_700_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def server():
    srv = FakeKubeServer().start()
    yield srv
    srv.stop()


def _elector(server, identity, clock, **kw) -> LeaderElector:
    return LeaderElector(
        server.api_client(),
        "ops",
        "autoglm-autoscaler",
        identity,
        lease_duration=15,
        renew_deadline=10,
        clock=clock,
        **kw,
    )


def test_first_candidate_creates_the_lease_and_leads(server):
    clock = Clock()
    a = _elector(server, "a", clock)
    assert a.tick()
    lease = server.fake.get("leases", "ops", "autoglm-autoscaler")
    assert lease["spec"]["holderIdentity"] == "a"
    assert lease["spec"]["leaseDurationSeconds"] == 15
    assert lease["spec"]["leaseTransitions"] == 0
    assert lease["spec"]["renewTime"].startswith("2023-11-14T22:13:20")


def test_only_the_holder_leads_and_the_other_takes_over_after_expiry(server):
    clock = Clock()
    changes: list[tuple[str, bool]] = []
    a = _elector(server, "a", clock, on_change=lambda v: changes.append(("a", v)))
    b = _elector(server, "b", clock, on_change=lambda v: changes.append(("b", v)))
    assert a.tick()
    assert not b.tick()
    # a keeps renewing: b never leads, however long it waits
    for _ in range(10):
        clock.advance(5)
        assert a.tick()
        assert not b.tick()
        assert a.is_leader() and not b.is_leader()
    # a stops renewing (crashed or cut off); b must wait the full lease duration
    clock.advance(9)
    assert a.is_leader()  # still within its renew deadline
    assert not b.tick()
    clock.advance(2)
    assert not a.is_leader()  # past its renew deadline: a stops acting first ...
    assert not b.tick()  # ... while the lease has not yet expired for b
    clock.advance(5)
    assert b.tick()  # 16 s after b last saw the record change
    lease = server.fake.get("leases", "ops", "autoglm-autoscaler")
    assert lease["spec"]["holderIdentity"] == "b"
    assert lease["spec"]["leaseTransitions"] == 1
    # a comes back: it sees b's fresh record and does not lead
    assert not a.tick()
    # a learns it lost leadership on its own next tick (is_leader() said so already)
    assert changes == [("a", True), ("b", True), ("a", False)]


def test_at_no_moment_do_two_candidates_lead(server):
    clock = Clock()
    electors = [_elector(server, name, clock) for name in ("a", "b", "c")]
    leaders_seen: set[str] = set()
    for step in range(60):
        clock.advance(3)
        for i, e in enumerate(electors):
            # each candidate in turn pauses for 8 ticks (24 s), longer than the lease
            if not (i * 20 <= step < i * 20 + 8):
                e.tick()
            assert sum(x.is_leader() for x in electors) <= 1
            leaders_seen.update(x.identity for x in electors if x.is_leader())
    assert leaders_seen == {"a", "b", "c"}  # leadership moved every time its holder paused


def test_release_hands_over_without_waiting(server):
    clock = Clock()
    a, b = _elector(server, "a", clock), _elector(server, "b", clock)
    assert a.tick()
    assert not b.tick()
    a.release()
    assert not a.is_leader()
    clock.advance(1)
    assert b.tick()


def test_a_racing_write_loses_with_conflict(server):
    clock = Clock()
    a, b = _elector(server, "a", clock), _elector(server, "b", clock)
    assert a.tick()
    clock.advance(30)  # a is gone
    assert not b.tick()  # b first observes the record
    clock.advance(16)
    # another candidate writes the lease between b's read and write
    server.fake.inject("PUT", r"/leases/autoglm-autoscaler$", 409, "Conflict")
    assert not b.tick()
    assert server.fake.get("leases", "ops", "autoglm-autoscaler")["spec"]["holderIdentity"] == "a"


def test_api_errors_keep_the_leader_only_until_its_renew_deadline(server):
    clock = Clock()
    a = _elector(server, "a", clock)
    assert a.tick()
    server.fake.inject("GET", r"/leases/", 500, "InternalError", times=100)
    clock.advance(5)
    assert a.tick()  # one failed renewal: still within the deadline
    clock.advance(6)
    assert not a.tick()


def test_bad_timings_are_refused(server):
    with pytest.raises(ValueError, match="renew_deadline"):
        LeaderElector(server.api_client(), "ops", "x", "a", lease_duration=10, renew_deadline=10)
