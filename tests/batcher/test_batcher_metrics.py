"""The batch-wise latency histogram exposes what prometheus_client's own histogram would."""

from __future__ import annotations

import math
import random

import pytest
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from batcher.metrics import BatchHistogram

BUCKETS = (0.001, 0.01, 0.1, 0.25, 1.0)


def samples(registry: CollectorRegistry) -> dict[tuple[str, tuple], float]:
    text = generate_latest(registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if not s.name.endswith("_created")
    }


@pytest.mark.parametrize("seed", range(3))
def test_a_batch_histogram_exposes_what_a_histogram_would(seed: int) -> None:
    rng = random.Random(seed)
    # bucket bounds themselves (le is inclusive), zero, and values past the last bound
    values = [rng.choice([*BUCKETS, 0.0, 3.0, rng.uniform(0, 2)]) for _ in range(200)]
    reference, batched = CollectorRegistry(), CollectorRegistry()
    native = Histogram("x_seconds", "Doc.", ["model"], buckets=BUCKETS, registry=reference)
    for value in values:
        native.labels("m").observe(value)
    ours = BatchHistogram("x_seconds", "Doc.", "m", BUCKETS, batched)
    ours.observe_many(values[:1])
    for start in range(1, len(values), 7):  # batches of up to seven
        ours.observe_many(values[start : start + 7])
    got, want = samples(batched), samples(reference)
    assert got.keys() == want.keys()
    for key, value in want.items():
        assert math.isclose(got[key], value, rel_tol=1e-12), key


def test_a_batch_histogram_is_exported_before_its_first_observation() -> None:
    registry = CollectorRegistry()
    BatchHistogram("x_seconds", "Doc.", "m", BUCKETS, registry)
    assert registry.get_sample_value("x_seconds_count", {"model": "m"}) == 0.0
    assert registry.get_sample_value("x_seconds_bucket", {"model": "m", "le": "+Inf"}) == 0.0


@pytest.mark.parametrize("operator_setting", ["", "expandable_segments:True"])
def test_a_model_on_the_cpu_says_nothing_about_the_cuda_allocator(
    operator_setting: str, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The CUDA allocator's setting means nothing on a CPU: like its statistics (absent on CPU,
    never zero), the start-up line leaves it out."""
    from batcher.cli import load_served_model
    from batcher.config import BatcherConfig

    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", operator_setting)
    with caplog.at_level("DEBUG"):
        model = load_served_model(BatcherConfig(model="batcher.models.demo:factory"), "cpu")
    assert model.device == "cpu"
    (loaded,) = [r for r in caplog.records if r.getMessage() == "model loaded"]
    assert (loaded.__dict__["model"], loaded.__dict__["device"]) == ("demo", "cpu")
    assert "allocator" not in loaded.__dict__
    for record in caplog.records:
        text = f"{record.getMessage()} {record.__dict__}"
        assert "ALLOC_CONF" not in text and "expandable" not in text, text
