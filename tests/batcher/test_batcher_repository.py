"""The model repository in virtual time: index, load while serving, unload drains, memory refusal.

The source builds engines over simulated devices, so loads and batches take exact simulated
times and no torch model is involved; the folder reading and the real servers are tested apart.
"""

from __future__ import annotations

import asyncio

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from batcher.device import SharedDevice
from batcher.engine import Batcher
from batcher.errors import (
    LoadFailed,
    LoadRefused,
    NotInRepository,
    RepositoryBusy,
    RepositoryError,
    ShuttingDown,
    UnknownModel,
)
from batcher.metrics import BatcherMetrics
from batcher.model import DEFAULT_INPUTS, DEFAULT_OUTPUTS, ServedModel
from batcher.models.simulated import SimPayload, SimulatedModel
from batcher.repository import (
    LOADING,
    READY,
    UNAVAILABLE,
    LoadedModel,
    MemoryCheck,
    ModelRepository,
    load_refusal,
)
from batcher.repository_metrics import RepositoryMetrics
from tests.batcher.test_batcher_engine import ask

MIB = 2**20


class SimSource:
    """Models ``name -> parameter bytes``; a load takes ``load_seconds`` of simulated time."""

    def __init__(self, sizes: dict[str, float], load_seconds: float = 0.5) -> None:
        self.sizes = sizes
        self.load_seconds = load_seconds
        self.released: list[str] = []
        self.headroom: float | None = None
        self.broken: set[str] = set()

    def names(self) -> list[str]:
        return sorted(self.sizes)

    async def load(self, name: str, device: SharedDevice, check: MemoryCheck) -> LoadedModel:
        if name not in self.sizes:
            raise NotInRepository(f"no model {name!r}")
        check(self.sizes[name])
        await asyncio.sleep(self.load_seconds)
        if name in self.broken:
            raise RuntimeError("factory exploded")
        registry = CollectorRegistry()
        metrics = BatcherMetrics(registry, name, 0.2, 16)
        executor = SimulatedModel(0.010, 0.001)
        batcher = Batcher(
            executor, max_batch_size=16, slo_seconds=0.2, metrics=metrics, device=device
        )
        model = ServedModel(name, DEFAULT_INPUTS, DEFAULT_OUTPUTS, lambda p: p, lambda n: n, "cpu")
        return LoadedModel(model, batcher, registry, self.sizes[name])

    def release(self, loaded: LoadedModel) -> None:
        self.released.append(loaded.model.name)

    def headroom_bytes(self) -> float | None:
        return self.headroom


def repository(source: SimSource, budget: float = 0.0) -> tuple[ModelRepository, CollectorRegistry]:
    registry = CollectorRegistry()
    metrics = RepositoryMetrics()
    registry.register(metrics)
    return ModelRepository(source, metrics=metrics, memory_budget_bytes=budget), registry


def states(models: ModelRepository) -> dict[str, str]:
    return {e.name: e.state for e in models.index()}


def test_index_lists_every_model_with_its_state_and_load_makes_one_ready(run_virtual) -> None:
    async def main() -> None:
        models, registry = repository(SimSource({"a": MIB, "b": 2 * MIB}))
        assert states(models) == {"a": UNAVAILABLE, "b": UNAVAILABLE}
        assert models.index()[0].reason == "not loaded" and not models.accepting
        loading = asyncio.create_task(models.load("a"))
        await asyncio.sleep(0.1)
        assert states(models)["a"] == LOADING
        with pytest.raises(RepositoryBusy, match="loading"):
            await models.load("a")
        await loading
        assert states(models) == {"a": READY, "b": UNAVAILABLE}
        assert [e.name for e in models.index(ready_only=True)] == ["a"]
        assert models.accepting and models.ready("a") and not models.ready("b")
        await models.load("a")  # loaded already: nothing to do
        answer = await ask(models.serving("a").batcher, SimPayload(3))
        assert answer.result == 3
        text = generate_latest(registry).decode()
        assert 'autoglm_batcher_model_memory_bytes{model="a"} 1.048576e+06' in text
        assert 'autoglm_batcher_requests_total{model="a",outcome="ok"} 1.0' in text
        with pytest.raises(UnknownModel, match=r"'b' \(unavailable: not loaded"):
            models.serving("b")
        with pytest.raises(UnknownModel, match="version '2'"):
            models.serving("a", "2")
        with pytest.raises(NotInRepository, match=r"no model 'zzz' .* holds: a, b"):
            await models.load("zzz")
        assert "zzz" not in states(models)  # a failed look-up leaves the index as it was
        await models.drain(10)

    run_virtual(main)


def test_a_model_loads_while_another_serves_and_its_requests_keep_being_answered(
    run_virtual,
) -> None:
    async def main() -> list:
        models, _ = repository(SimSource({"a": MIB, "b": MIB}, load_seconds=1.0))
        await models.load("a")
        serving = models.serving("a").batcher

        async def traffic() -> list:
            answers = []
            for i in range(40):
                answers.append(asyncio.create_task(ask(serving, SimPayload(i))))
                await asyncio.sleep(0.05)
            return list(await asyncio.gather(*answers))

        answers, _ = await asyncio.gather(traffic(), models.load("b"))
        assert models.ready("b")
        await models.drain(10)
        return answers

    answers = run_virtual(main)
    assert [a.result for a in answers] == list(range(40))
    assert max(a.latency for a in answers) <= 0.2


def test_unload_answers_everything_accepted_before_the_model_goes(run_virtual) -> None:
    async def main() -> None:
        source = SimSource({"a": MIB, "b": MIB})
        models, registry = repository(source)
        await models.load("a")
        await models.load("b")
        batcher = models.serving("a").batcher
        accepted = [asyncio.create_task(ask(batcher, SimPayload(i))) for i in range(50)]
        await asyncio.sleep(0)  # all fifty are queued
        unloading = asyncio.create_task(models.unload("a"))
        await asyncio.sleep(0)
        late = await ask(batcher, SimPayload(99))
        assert isinstance(late.error, ShuttingDown) and "'a' is being unloaded" in str(late.error)
        await unloading
        answers = await asyncio.gather(*accepted)
        assert [a.result for a in answers] == list(range(50))  # nothing accepted was lost
        assert states(models) == {"a": UNAVAILABLE, "b": READY}
        assert source.released == ["a"] and models.device.models == ("b",)
        with pytest.raises(UnknownModel, match="unloaded"):
            models.serving("a")
        text = generate_latest(registry).decode()
        assert 'model="a"' not in text and 'model="b"' in text
        await models.unload("a")  # not loaded: nothing to do
        await models.load("a")  # and back
        assert models.ready("a")
        await models.drain(10)

    run_virtual(main)


def test_a_load_that_would_not_fit_is_refused_and_leaves_the_others_serving(run_virtual) -> None:
    async def main() -> None:
        source = SimSource({"a": 600 * MIB, "b": 500 * MIB, "c": 300 * MIB})
        models, _ = repository(source, budget=1000 * MIB)
        await models.load("a")
        with pytest.raises(LoadRefused, match=r"'b' needs about 500\.0 MiB .* only 400\.0 MiB"):
            await models.load("b")
        assert states(models)["b"] == UNAVAILABLE
        assert "needs about 500.0 MiB" in next(e for e in models.index() if e.name == "b").reason
        await models.load("c")  # 900 of 1000 MiB
        assert models.ready("a") and models.ready("c")
        await models.unload("a")
        await models.load("b")  # fits once a is gone
        await models.drain(10)

    run_virtual(main)


def test_without_a_budget_the_device_headroom_bounds_loads(run_virtual) -> None:
    async def main() -> None:
        source = SimSource({"a": 600 * MIB, "b": 500 * MIB})
        models, _ = repository(source)
        await models.load("a")
        source.headroom = 400 * MIB  # what the device can still give, a already on it
        with pytest.raises(LoadRefused, match=r"only 400\.0 MiB of the repository's 1000\.0"):
            await models.load("b")
        source.headroom = None  # CPU: nothing known, nothing refused
        await models.load("b")
        await models.drain(10)

    run_virtual(main)


def test_a_failing_factory_is_a_load_error_and_the_model_stays_unavailable(run_virtual) -> None:
    async def main() -> None:
        source = SimSource({"a": MIB})
        source.broken.add("a")
        models, _ = repository(source)
        with pytest.raises(LoadFailed, match="RuntimeError: factory exploded"):
            await models.load("a")
        assert states(models) == {"a": UNAVAILABLE}
        assert models.device.models == ()

    run_virtual(main)


def test_a_repository_without_a_source_serves_its_one_model_and_cannot_load(run_virtual) -> None:
    async def main() -> None:
        registry = CollectorRegistry()
        batcher = Batcher(
            SimulatedModel(0.01, 0.001), metrics=BatcherMetrics(registry, "only", 0.2, 32)
        )
        model = ServedModel("only", DEFAULT_INPUTS, DEFAULT_OUTPUTS, list, lambda n: n, "cpu")
        models = ModelRepository(device=batcher.device)
        models.add(LoadedModel(model, batcher, registry))
        await models.start()
        assert models.accepting and models.names == ["only"]
        for action in (models.load, models.unload):
            with pytest.raises(RepositoryError, match="--model-repository"):
                await action("only")
        assert await models.drain(10) and not models.accepting

    run_virtual(main)


def test_load_refusal_rule() -> None:
    assert load_refusal("x", 10, {"a": 50}, None) is None
    assert load_refusal("x", 50, {"a": 50}, 100) is None
    refusal = load_refusal("x", 51 * MIB, {"a": 50 * MIB}, 100 * MIB)
    assert refusal is not None and "--repository-memory-bytes" in refusal
