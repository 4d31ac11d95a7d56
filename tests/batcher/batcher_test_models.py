"""Model factories the HTTP and CLI tests serve (importable as ``batcher_test_models:NAME``)."""

from __future__ import annotations

import threading
import time

import numpy as np

from batcher.model import TensorSpec


class EchoModel:
    """Batch callable: ``y = 2 * x`` per request; counts calls; can be held to keep it busy."""

    input_specs = (TensorSpec("x", "FP32", (3,)), TensorSpec("k", "INT32", (1,)))
    output_specs = (TensorSpec("y", "FP32", (3,)), TensorSpec("k_out", "INT32", (1,)))
    model_name = "echo"

    def __init__(self, delay_seconds: float = 0.0) -> None:
        self.delay_seconds = delay_seconds
        self.calls = 0
        self.items = 0
        self.entered = threading.Event()
        self.release = threading.Event()
        self.release.set()

    def __call__(self, batch: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        self.calls += 1
        self.items += sum(len(p["x"]) for p in batch)
        self.entered.set()
        self.release.wait(timeout=30)
        if self.delay_seconds:
            time.sleep(self.delay_seconds)
        return [{"y": p["x"] * 2, "k_out": p["k"]} for p in batch]


def slow_echo() -> EchoModel:
    """An echo model that takes 0.2 s per batch: work is still queued when a signal arrives."""
    return EchoModel(delay_seconds=0.2)


def echo() -> EchoModel:
    """An echo model that answers at once."""
    return EchoModel()


class WideEchoModel(EchoModel):
    """The echo model with four features instead of three: another signature, same name."""

    input_specs = (TensorSpec("x", "FP32", (4,)), TensorSpec("k", "INT32", (1,)))
    output_specs = (TensorSpec("y", "FP32", (4,)), TensorSpec("k_out", "INT32", (1,)))


def wide_echo() -> WideEchoModel:
    """A wide echo model that answers at once."""
    return WideEchoModel()


class EveryTypeEcho:
    """Batch callable answering each input as it came (``<name>_out``), one per datatype the
    protocol carries; an FP32 value of -1 makes the batch fail, as a broken model would."""

    kinds = (("f", "FP32"), ("i", "INT64"), ("h", "BF16"), ("s", "BYTES"), ("b", "BOOL"))
    input_specs = tuple(TensorSpec(name, datatype, (2,)) for name, datatype in kinds)
    output_specs = tuple(TensorSpec(f"{name}_out", datatype, (2,)) for name, datatype in kinds)
    model_name = "every_type"

    def __call__(self, batch: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        if any((p["f"] == -1).any() for p in batch):
            raise RuntimeError("asked to fail")
        return [{f"{name}_out": p[name] for name, _ in self.kinds} for p in batch]


def every_type_echo() -> EveryTypeEcho:
    return EveryTypeEcho()


def every_type_echo_unless_blocked() -> EveryTypeEcho:
    """:func:`every_type_echo`, which refuses to load while the file that
    ``AUTOGLM_TEST_BLOCK_LOAD`` names exists (a model process's restart meeting a missing disk)."""
    import os
    from pathlib import Path

    blocker = os.environ.get("AUTOGLM_TEST_BLOCK_LOAD", "")
    if blocker and Path(blocker).exists():
        raise RuntimeError("the model's files are not there")
    return EveryTypeEcho()


class TorchThreadsModel:
    """Batch callable that answers each request with the torch intra-op thread count of the
    thread it runs on: what ``--torch-threads`` set, where the model is a torch user."""

    input_specs = (TensorSpec("x", "FP32", (1,)),)
    output_specs = (TensorSpec("threads", "INT32", (1,)),)
    model_name = "threads"

    def __call__(self, batch: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        import torch  # loaded already: the factory imported it

        threads = np.array([torch.get_num_threads()], dtype=np.int32)
        return [{"threads": threads} for _ in batch]


def torch_threads() -> TorchThreadsModel:
    """A model whose module loads torch, as a torch model's does."""
    import torch  # noqa: F401

    return TorchThreadsModel()
