"""Simulated GPUs follow the workers' measured busy time; the exporter labels them with pods."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from exporter.service import ExporterService
from exporter.sources import SimulatedSource, load_profile
from stack.gpu_link import GPULink, slot_loads
from stack.window import MetricsWindow, Scrape, parse_exposition


def busy_scrape(t: float, busy_seconds: float) -> Scrape:
    registry = CollectorRegistry()
    Counter("autoglm_batcher_device_busy_seconds", "busy", ["model"], registry=registry).labels(
        "demo"
    ).inc(busy_seconds)
    return Scrape(t, True, parse_exposition(generate_latest(registry).decode()))


def test_slot_loads_fill_empty_and_unread_slots_with_zero() -> None:
    busy = {"a": 0.5, "b": None}
    assert slot_loads(["a", "b", None], busy.get) == {0: 0.5, 1: 0.0, 2: 0.0}


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_gpus_follow_the_workers_and_carry_their_pods() -> None:
    clock = Clock(1000.0)
    source = SimulatedSource(3, "NVIDIA H100 80GB HBM3", 0, load_profile("constant:0.9"), clock)
    window = MetricsWindow()
    for step in range(4):  # worker a busy 60 % of the time, worker b 20 %
        window.add("a", busy_scrape(1000.0 + step, 0.6 * step))
        window.add("b", busy_scrape(1000.0 + step, 0.2 * step))
    workers = ["a", "b"]
    uuids = [d.uuid for d in source.devices()]
    link = GPULink(source, uuids, window, lambda: workers, rate_seconds=3.0, clock=clock)
    clock.t = 1003.0
    assert link.update(1003.0) == pytest.approx({0: 0.6, 1: 0.2, 2: 0.0})
    assert source.utilization(0, clock.t) == pytest.approx(0.6)
    assert source.utilization(1, clock.t) == pytest.approx(0.2)
    assert source.utilization(2, clock.t) == 0.0  # no worker: idle, not the 0.9 profile
    assert {u: [p.pod for p in pods] for u, pods in link.attribution().items()} == {
        uuids[0]: ["batcher-0"],
        uuids[1]: ["batcher-1"],
    }

    # the exporter renders the linked load and the pod labels
    service = ExporterService(
        source, listen="127.0.0.1:0", pods=link, simulation=source, clock=clock
    )
    service.collector.collect_once()
    text = service.exposition.body("text", clock.t, False).decode()
    util = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    assert any(
        'gpu="0"' in line and 'pod="batcher-0"' in line and line.endswith(" 60") for line in util
    )
    assert any('gpu="2"' in line and "pod=" not in line and line.endswith(" 0") for line in util)

    workers.pop()  # worker b stopped: its GPU goes idle and loses its pod
    assert link.update(1003.0)[1] == 0.0
    assert uuids[1] not in link.attribution()
    service.stop()
    source.close()
