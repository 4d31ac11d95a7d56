"""The local stack's worker model (``stack.model``): the demo MLP's arithmetic in numpy, a
simulated kernel time, and no torch unless a checkpoint is read."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from batcher.models.demo import DemoMLP
from stack.kernel import kernel_seconds
from stack.model import CLASSES, FEATURES, factory

ROOT = Path(__file__).resolve().parents[2]


def test_a_demo_checkpoint_gives_the_demo_models_logits(tmp_path: Path) -> None:
    demo = DemoMLP(seed=3)
    torch.save(demo.state_dict(), tmp_path / "demo.pt")
    model = factory(str(tmp_path / "demo.pt"))
    batch = np.random.default_rng(0).normal(size=(5, FEATURES)).astype(np.float32)
    with torch.inference_mode():
        expected = demo(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(model.logits(batch), expected, rtol=1e-5, atol=1e-6)


def test_a_checkpoint_of_another_shape_is_refused_naming_its_layers(tmp_path: Path) -> None:
    torch.save(DemoMLP(features=8).state_dict(), tmp_path / "other.pt")
    with pytest.raises(ValueError, match=r"not a demo model checkpoint .*\(256, 8\)"):
        factory(str(tmp_path / "other.pt"))


def test_every_request_gets_its_own_rows_after_the_kernel_time() -> None:
    model = factory()
    requests = [
        {"input": np.full((2, FEATURES), 0.5, np.float32)},
        {"input": np.zeros((1, FEATURES), np.float32)},
    ]
    started = time.perf_counter()
    first, second = model(requests)
    held = time.perf_counter() - started
    assert first.shape == (2, CLASSES) and second.shape == (1, CLASSES)
    assert first.dtype == np.float32
    np.testing.assert_allclose(first[0], first[1], rtol=1e-5)  # same input, same row
    alone = model.logits(np.zeros((1, FEATURES), np.float32))[0]
    np.testing.assert_allclose(second[0], alone, rtol=1e-5, atol=1e-7)  # not another's row
    assert held >= kernel_seconds(3)  # a sleep's lower bound, not a timing


def test_every_worker_serves_the_same_function_without_importing_torch() -> None:
    probe = (
        "import sys, numpy as np; from stack.model import factory; "
        "x = np.linspace(-1, 1, 32, dtype=np.float32).reshape(2, 16); "
        "print(factory().logits(x).round(6).tolist()); print('torch' in sys.modules)"
    )
    runs = [
        subprocess.run(
            [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.splitlines()
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert runs[0][1] == "False"
