"""``bench/serving_bounds.py``: the bounds' arithmetic, and its smoke run end to end.

The arithmetic is what turns measured floors into "out of reach" verdicts in the issue's notes,
so it is checked against figures worked by hand; the smoke proves that every way into both
servers (the floor and the batcher) is answered and the report has the shape the notes read.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.serving_bounds import beyond_floor, bounds, verdict
from tests.bench.test_bench_smokes import run_bench


def cost(server_us: float, client_us: float = 100.0) -> dict:
    return {"server_us": server_us, "client_us": client_us}


def test_bounds_take_the_cheapest_cost_of_any_floor_and_each_ratio_within_one_floor() -> None:
    floor = {
        "rest-json": {1000.0: cost(450.0), 2000.0: cost(420.0)},
        "rest-binary": {1000.0: cost(300.0), 2000.0: cost(320.0)},
        "grpc": {1000.0: cost(500.0), 2000.0: cost(600.0)},
    }
    held = {
        "rest-json": {1000.0: cost(480.0), 2000.0: cost(400.0)},
        "rest-binary": {1000.0: cost(310.0), 2000.0: cost(305.0)},
        "grpc": {1000.0: cost(700.0), 2000.0: cost(650.0)},
    }
    # Another HTTP stack: the cheapest JSON, no gRPC, and a codec that saves little.
    other = {
        "rest-json": {1000.0: cost(360.0), 2000.0: cost(350.0, client_us=80.0)},
        "rest-binary": {2000.0: cost(330.0)},
    }
    found = bounds(
        {"floor": floor, "held": held, "uvicorn": other},
        model_us=100.0,
        cores=2,
        target_rate=2000.0,
    )
    assert found["floor_us"] == {"rest-json": 350.0, "rest-binary": 300.0, "grpc": 500.0}
    assert found["floor_server"] == {
        "rest-json": "uvicorn",
        "rest-binary": "floor",
        "grpc": "floor",
    }
    assert found["requests_per_cpu_second"]["bound"] == pytest.approx(1e6 / 450)
    assert found["requests_per_cpu_second"]["model_alone_bound"] == pytest.approx(1e4)
    # Each ratio is JSON over the other way within one server, the largest of them: not the
    # cheapest JSON of one stack over the cheapest binary of another (450 / 400).
    assert found["binary_over_json"]["bound"] == pytest.approx(520 / 400)
    assert found["binary_over_json"]["bound_without_model"] == pytest.approx(420 / 300)
    assert found["grpc_over_json"]["bound"] == pytest.approx(520 / 600)
    assert found["grpc_over_json"]["bound_without_model"] == pytest.approx(420 / 500)
    assert found["one_interpreter_rate_bound"] == pytest.approx(1e6 / 350)
    target = found["target_rate"]
    assert target["client_us"] == 80.0  # the client's cost beside the cheapest JSON floor
    assert target["cores_needed_at_least"] == pytest.approx(2000 * (350 + 100 + 80) / 1e6)
    assert target["server_cores_needed_at_least"] == pytest.approx(0.9)
    assert target["one_interpreter_load"] == pytest.approx(0.7)


def test_no_target_rate_no_sizing_and_the_verdict_is_strict_about_the_goal() -> None:
    floor = {mode: {1000.0: cost(400.0)} for mode in ("rest-json", "rest-binary", "grpc")}
    assert "target_rate" not in bounds({"floor": floor}, model_us=0.0, cores=2, target_rate=None)
    assert verdict(2500.0, 2500.0) == "reachable"
    assert verdict(2499.9, 2500.0) == "OUT OF REACH"


def test_beyond_floor_takes_off_the_floor_and_the_model_row_at_the_batch_ran() -> None:
    batcher = {
        "rest-json": {
            1000.0: {"server_us": 900.0, "mean_batch": 31.6},
            2000.0: {"server_us": 700.0, "mean_batch": 64.2},
        },
        "grpc": {1000.0: {"server_us": 800.0, "mean_batch": float("nan")}},
    }
    found = beyond_floor(
        batcher, {"rest-json": 300.0, "grpc": 400.0}, {32: 250.0, 64: 200.0, 128: 150.0}
    )
    assert found == {"rest-json": {1000.0: 350.0, 2000.0: 200.0}, "grpc": {}}


@pytest.mark.timeout(900)
def test_smoke_answers_every_way_into_the_floor_and_the_batcher(tmp_path: Path) -> None:
    out = tmp_path / "bounds.json"
    run = run_bench("bench/serving_bounds.py", out, "--target-rate", "100")
    report = json.loads(out.read_text())
    assert report["smoke"] and report["rounds"] == 1
    measured = report["measured"]
    for server in ("floor", "held", "uvicorn", "batcher"):
        ways = measured[server]
        expected = {"rest-json", "rest-binary"} | ({"grpc"} if server != "uvicorn" else set())
        assert set(ways) == expected
        for rates in ways.values():
            assert [c["failures"] for c in rates.values()] == [0]
    assert report["bounds"]["model_us_per_row"] > 0
    assert report["bounds"]["target_rate"]["rate"] == 100
    assert set(report["batcher_beyond_floor_us"]) == {"rest-json", "rest-binary", "grpc"}
    assert "OUT OF REACH" in run.stdout or "reachable" in run.stdout
