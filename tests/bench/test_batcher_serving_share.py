"""The serving bench's account of how much of a request's server CPU is the model's own."""

from __future__ import annotations

import math

import pytest

from bench.batcher_serving import model_share


def _pass(batch: float, per_cpu_second: float, client_ms: float) -> dict:
    return {
        "rest-json": {
            "mean_batch_items": batch,
            "requests_per_server_cpu_second": per_cpu_second,
            "client_cpu_ms_per_request": client_ms,
        }
    }


def test_share_and_bounds_follow_from_the_model_cost_at_the_served_batch() -> None:
    # 1,000 req per server CPU-s = 1,000 us a request, of which the model's row at batch 16 is 250
    share = model_share([_pass(15.6, 1000.0, 0.25)], ("rest-json",), {16: 250.0}, cpus=2)
    row = share["rest-json"]
    assert row["model_us_per_row"] == 250.0
    assert row["server_us_per_request"] == pytest.approx(1000.0)
    assert row["model_share"] == pytest.approx(0.25)
    assert row["free_path_requests_per_cpu_second"] == pytest.approx(4000.0)
    # two cores for model (250 us) and client (250 us) per request: at most 4,000 req/s
    assert row["free_path_rate_bound"] == pytest.approx(4000.0)


def test_medians_over_passes_and_passes_without_a_held_rate_left_out() -> None:
    passes = [
        _pass(8.0, 500.0, 0.1),
        _pass(math.nan, math.nan, 0.1),  # nothing held in this pass
        _pass(32.0, 2000.0, 0.1),
        _pass(16.0, 1000.0, 0.1),
    ]
    costs = {8: 400.0, 16: 250.0, 32: 200.0}
    row = model_share(passes, ("rest-json",), costs, cpus=2)["rest-json"]
    assert row["batch"] == 16.0 and row["model_us_per_row"] == 250.0
    assert row["model_share"] == pytest.approx(0.25)  # 0.2, 0.25 and 0.4: the middle one


def test_a_way_that_never_held_has_no_row() -> None:
    assert model_share([_pass(math.nan, math.nan, 0.1)], ("rest-json",), {}, cpus=2) == {}
