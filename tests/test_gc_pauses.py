"""GC pauses: collections are timed per generation, and the start-up heap is frozen."""

from __future__ import annotations

import gc

import pytest
from prometheus_client import CollectorRegistry

from autoglm.gc_pauses import GcPauses, freeze_startup_heap


@pytest.fixture
def pauses():
    registry = CollectorRegistry()
    pauses = GcPauses(registry, "test")
    pauses.install()
    yield registry, pauses
    pauses.remove()


def _value(registry: CollectorRegistry, name: str, generation: str | None = None) -> float:
    labels = {"generation": generation} if generation is not None else {}
    return registry.get_sample_value(name, labels) or 0.0


def test_every_generation_is_exported_before_any_collection(pauses) -> None:
    registry, _ = pauses
    for generation in "012":
        assert (
            registry.get_sample_value("test_gc_pause_seconds_count", {"generation": generation})
            is not None
        )


def test_a_full_collection_is_timed_and_its_cycles_counted(pauses) -> None:
    registry, _ = pauses
    before = _value(registry, "test_gc_pause_seconds_count", "2")
    collected_before = _value(registry, "test_gc_collected_objects_total", "2")
    for _ in range(100):  # cycles only the collector can free
        a: list = []
        a.append(a)
    del a
    gc.collect(2)
    assert _value(registry, "test_gc_pause_seconds_count", "2") == before + 1
    assert _value(registry, "test_gc_pause_seconds_sum", "2") > 0
    assert _value(registry, "test_gc_collected_objects_total", "2") >= collected_before + 100


def test_install_twice_times_each_collection_once(pauses) -> None:
    registry, timer = pauses
    timer.install()
    before = _value(registry, "test_gc_pause_seconds_count", "1")
    gc.collect(1)
    assert _value(registry, "test_gc_pause_seconds_count", "1") == before + 1


def test_removed_it_times_nothing(pauses) -> None:
    registry, timer = pauses
    timer.remove()
    before = _value(registry, "test_gc_pause_seconds_count", "2")
    gc.collect()
    assert _value(registry, "test_gc_pause_seconds_count", "2") == before


def test_freezing_exempts_what_lives_now_and_is_exported(pauses) -> None:
    registry, _ = pauses
    survivors = [[i] for i in range(1000)]
    try:
        frozen = freeze_startup_heap()
        # frozen objects still die by reference counting: the count can only fall after
        assert frozen >= 1000 and 0 < gc.get_freeze_count() <= frozen
        assert 0 < _value(registry, "test_gc_frozen_objects") <= frozen
        tracked = {id(o) for o in gc.get_objects()}
        assert not any(id(s) in tracked for s in survivors)  # out of every generation
    finally:
        gc.unfreeze()


def test_freezing_without_collecting_walks_nothing(pauses) -> None:
    registry, _ = pauses
    try:
        before = _value(registry, "test_gc_pause_seconds_count", "2")
        a: list = []
        a.append(a)  # a cycle only a collection would free
        del a
        frozen = freeze_startup_heap(collect=False)
        assert _value(registry, "test_gc_pause_seconds_count", "2") == before  # no walk
        assert 0 < gc.get_freeze_count() <= frozen  # some may have died by reference counting
    finally:
        gc.unfreeze()
