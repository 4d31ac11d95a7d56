"""Running batches for real: OOM handling on a thread, the torch adapter, memory, config."""

from __future__ import annotations

import asyncio
import gc
import os
import pickle
import weakref

import numpy as np
import pytest
import torch
from prometheus_client import CollectorRegistry

from autoglm.config import ConfigError, build_config, load_config
from batcher.config import BatcherConfig
from batcher.engine import Batcher
from batcher.errors import OutOfMemory
from batcher.execution import ThreadExecutor, run_guarded
from batcher.memory import (
    EXPANDABLE,
    MemoryMonitor,
    bucket_size,
    configure_allocator,
    is_out_of_memory,
)
from batcher.metrics import BatcherMetrics
from batcher.model import TensorSpec, load_model, wrap_model
from batcher.models.demo import DemoMLP, factory, load_checkpoint


class RecordingMemory(MemoryMonitor):
    """Checks, when recovery starts, that the failed batch's tensor is already gone."""

    def __init__(self) -> None:
        super().__init__("cpu", 0)
        self.tensor_alive_at_recovery: list[bool] = []
        self.watch: weakref.ref | None = None

    def after_out_of_memory(self) -> None:
        gc.collect()
        self.tensor_alive_at_recovery.append(self.watch is not None and self.watch() is not None)


def test_recovery_runs_after_the_exception_and_its_tensors_are_released() -> None:
    memory = RecordingMemory()

    def model(payloads: list[object]) -> list[object]:
        activations = torch.ones(1024, 1024)
        memory.watch = weakref.ref(activations)
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 4.00 MiB")

    outcome = run_guarded(model, [1, 2], memory)
    assert outcome.out_of_memory and "OutOfMemoryError" in outcome.error
    assert memory.tensor_alive_at_recovery == [False]


def test_out_of_memory_is_recognised_from_type_or_message() -> None:
    assert is_out_of_memory(torch.cuda.OutOfMemoryError("x"))
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))
    assert not is_out_of_memory(ValueError("out of memory"))


def test_without_torch_loaded_a_batch_callable_is_served_on_the_cpu(monkeypatch) -> None:
    """What a process whose model is not a torch module sees (``batcher.torch_loaded``): ``auto``
    settles on the CPU without asking torch, an explicit device is kept, memory reads nothing,
    and an out-of-memory error is still told by its message."""
    import batcher.execution
    import batcher.memory
    import batcher.model

    for module in (batcher.model, batcher.memory, batcher.execution):
        monkeypatch.setattr(module, "loaded_torch", lambda: None)
    monkeypatch.setattr(batcher.memory, "initialised_cuda", lambda: None)
    # torch, were it asked, would say there is a GPU: the answer must not come from it
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)

    def echo(payloads: list[dict]) -> list[dict]:
        return [{"output__0": p["input__0"]} for p in payloads]

    assert wrap_model(echo, device="auto").device == "cpu"
    assert wrap_model(echo, device="cuda").device == "cuda"
    served = wrap_model(echo)
    assert served.run([{"input__0": np.ones((1, 2), np.float32)}])[0]["output__0"].shape == (1, 2)
    memory = MemoryMonitor("cuda", idle_release_seconds=1.0)
    assert memory.stats() == {} and memory.headroom_bytes() is None
    assert memory.begin_batch() is None and not memory.release(0.0)
    assert is_out_of_memory(RuntimeError("CUDA error: out of memory"))
    assert not is_out_of_memory(RuntimeError("shape mismatch"))


async def test_thread_executor_splits_on_a_real_torch_oom() -> None:
    def model(batch: list[int]) -> list[int]:
        if len(batch) > 2:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (test)")
        return [x * 10 for x in batch]

    metrics = BatcherMetrics(CollectorRegistry(), "thread", 5.0, 16)
    batcher = Batcher(ThreadExecutor(model), max_batch_size=16, slo_seconds=5.0, metrics=metrics)
    await batcher.start()
    hold = asyncio.Event()

    async def submit(x: int) -> int:
        await hold.wait()
        return await batcher.submit(x)

    tasks = [asyncio.create_task(submit(x)) for x in range(9)]
    hold.set()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    await batcher.drain()
    assert results == [x * 10 for x in range(9)]
    assert metrics.ooms._value.get() >= 1
    assert metrics.splits._value.get() >= 1
    assert metrics.requests.labels("thread", "ok")._value.get() == 9


async def test_worker_thread_uses_the_callers_torch_thread_count() -> None:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        executor = ThreadExecutor(lambda batch: [torch.get_num_threads() for _ in batch])
        outcome = await executor.execute([None])
        executor.close()
    finally:
        torch.set_num_threads(before)
    assert outcome.results == [1]


async def test_a_single_request_that_never_fits_fails_alone() -> None:
    def model(batch: list[int]) -> list[int]:
        if any(x < 0 for x in batch):
            raise RuntimeError("CUDA out of memory (test)")
        return list(batch)

    batcher = Batcher(ThreadExecutor(model), max_batch_size=4, slo_seconds=5.0)
    await batcher.start()
    results = await asyncio.gather(
        *(batcher.submit(x) for x in (1, -1, 2, 3)), return_exceptions=True
    )
    await batcher.drain()
    assert results[0] == 1 and results[2:] == [2, 3]
    assert isinstance(results[1], OutOfMemory)


class TestTorchModuleAdapter:
    def test_pads_to_buckets_and_splits_results_per_request(self) -> None:
        seen: list[int] = []

        class Rows(torch.nn.Module):
            input_specs = (TensorSpec("a", "FP32", (2,)),)
            output_specs = (TensorSpec("s", "FP32", ()),)

            def forward(self, a: torch.Tensor) -> torch.Tensor:
                seen.append(a.shape[0])
                return a.sum(dim=1)

        served = wrap_model(Rows(), buckets=(1, 2, 4, 8))
        payloads = [
            {"a": np.ones((2, 2), np.float32)},
            {"a": np.full((3, 2), 2.0, np.float32)},
        ]
        results = served.run(payloads)
        assert seen == [8]  # 5 rows padded to the bucket of 8
        assert served.batch_size_for(5) == 8
        np.testing.assert_array_equal(results[0]["s"], [2.0, 2.0])
        np.testing.assert_array_equal(results[1]["s"], [4.0, 4.0, 4.0])

    def test_requests_with_different_variable_dims_run_apart(self) -> None:
        class Mean(torch.nn.Module):
            def forward(self, x: torch.Tensor) -> torch.Tensor:
                return x.mean(dim=1, keepdim=True)

        served = wrap_model(Mean())
        results = served.run(
            [{"input__0": np.ones((1, 3), np.float32)}, {"input__0": np.ones((1, 5), np.float32)}]
        )
        assert [r["output__0"].tolist() for r in results] == [[[1.0]], [[1.0]]]

    def test_demo_model_is_deterministic_and_loads_checkpoints_safely(self, tmp_path) -> None:
        x = torch.randn(3, 16)
        with torch.inference_mode():
            assert torch.equal(factory()(x), factory()(x))
        other = DemoMLP(seed=1)
        path = tmp_path / "weights.pt"
        torch.save(other.state_dict(), path)
        with torch.inference_mode():
            assert torch.equal(factory(checkpoint=str(path))(x), other(x))

        class Payload:
            def __reduce__(self):
                return (os.system, ("echo pwned",))

        evil = tmp_path / "evil.pt"
        evil.write_bytes(pickle.dumps({"net.0.weight": Payload()}, protocol=2))
        with pytest.raises(pickle.UnpicklingError):
            load_checkpoint(DemoMLP(), evil)

    def test_load_model_reports_what_to_fix(self) -> None:
        with pytest.raises(ConfigError, match="has no callable 'nope'"):
            load_model("batcher.models.demo:nope")
        with pytest.raises(ConfigError, match="takes no checkpoint= argument"):
            load_model("batcher.models.demo:bench_factory", checkpoint="x.pt")
        served = load_model("batcher.models.demo:factory")
        assert served.name == "demo"
        assert [s.metadata() for s in served.inputs] == [
            {"name": "input", "datatype": "FP32", "shape": [-1, 16]}
        ]


class TestMemory:
    def test_expandable_segments_are_requested_unless_the_operator_chose(self) -> None:
        env: dict[str, str] = {}
        configure_allocator(True, env)
        assert env == {"PYTORCH_CUDA_ALLOC_CONF": EXPANDABLE}
        env = {"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"}
        configure_allocator(True, env)
        assert env["PYTORCH_CUDA_ALLOC_CONF"] == f"max_split_size_mb:128,{EXPANDABLE}"
        env = {"PYTORCH_ALLOC_CONF": "expandable_segments:False"}
        note = configure_allocator(True, env)
        assert env == {"PYTORCH_ALLOC_CONF": "expandable_segments:False"} and "kept" in note
        env = {}
        configure_allocator(False, env)
        assert env == {}

    def test_bucket_sizes(self) -> None:
        buckets = (1, 2, 4, 8, 12)
        assert [bucket_size(n, buckets) for n in (1, 3, 5, 9, 12, 13)] == [1, 4, 8, 12, 12, 13]

    def test_cpu_reports_nothing_and_never_releases(self) -> None:
        monitor = MemoryMonitor("cpu", idle_release_seconds=1.0)
        assert monitor.stats() == {}
        assert monitor.release_due(last_activity=0.0) is None

    def test_cuda_release_is_due_once_per_idle_period(self) -> None:
        monitor = MemoryMonitor("cuda", idle_release_seconds=30.0)
        assert monitor.release_due(last_activity=100.0) == 130.0
        monitor.release(last_activity=100.0)
        assert monitor.release_due(last_activity=100.0) is None
        assert monitor.release_due(last_activity=200.0) == 230.0
        assert MemoryMonitor("cuda", 0).release_due(last_activity=0.0) is None


class TestConfig:
    def test_defaults_are_valid_and_buckets_end_at_the_maximum(self) -> None:
        config = BatcherConfig()
        assert config.listen == ":8000"
        assert BatcherConfig(max_batch_size=24).buckets == (1, 2, 4, 8, 16, 24)
        assert BatcherConfig(max_batch_size=24, pad_buckets=[6, 12]).buckets == (6, 12, 24)

    def test_slo_admission_is_on_by_default_and_off_by_flag_or_yaml(self, tmp_path) -> None:
        assert BatcherConfig().refuse_past_slo
        assert not load_config(BatcherConfig, ["--no-refuse-past-slo"], "t").refuse_past_slo
        path = tmp_path / "batcher.yaml"
        path.write_text("refuse_past_slo: false\n")
        assert not load_config(BatcherConfig, ["--config", str(path)], "t").refuse_past_slo
        with pytest.raises(
            ConfigError,
            match=r"--refuse-past-slo: .sometimes. is not true or false; give true or false",
        ):
            build_config(BatcherConfig, {"refuse_past_slo": "sometimes"})

    @pytest.mark.parametrize(
        ("values", "message"),
        [
            ({"model": "demo"}, "package.module:factory"),
            ({"slo_seconds": 0}, "--slo-seconds must be > 0"),
            ({"max_queue": 4, "max_batch_size": 8}, "--max-queue 4 must be at least"),
            ({"utilization_cap": 1.5}, "--utilization-cap"),
            ({"default_priority": 3, "priority_levels": 2}, "--default-priority"),
            ({"pad_buckets": [64], "max_batch_size": 32}, "--pad-buckets 64"),
            ({"warmup_repeats": -1}, "--warmup-repeats must be >= 0"),
            ({"listen": "nowhere"}, "HOST:PORT"),
        ],
    )
    def test_bad_values_name_the_fix(self, values: dict, message: str) -> None:
        with pytest.raises(ConfigError, match=message):
            build_config(BatcherConfig, values)
