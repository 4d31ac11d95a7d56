"""``autoglm-predictor backtest`` on a small CSV, and its errors."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from predictor.cli import main


@pytest.fixture()
def events_csv(tmp_path):
    rng = np.random.default_rng(0)
    rows = []
    start = pd.Timestamp("2024-03-01")
    for hour in range(24 * 6):
        rate = 20 + 15 * np.sin(2 * np.pi * hour / 24)
        for _ in range(rng.poisson(rate)):
            rows.append(start + pd.Timedelta(hours=hour, seconds=int(rng.integers(0, 3600))))
    path = tmp_path / "events.csv"
    pd.DataFrame({"created": sorted(rows), "other": 1}).to_csv(path, index=False)
    return path


@pytest.mark.timeout(120)
def test_backtest_prints_every_model_and_writes_the_json_shape(events_csv, tmp_path, capsys):
    out = tmp_path / "result.json"
    code = main(
        [
            "backtest",
            "--csv", str(events_csv),
            "--time-column", "created",
            "--freq", "1h",
            "--horizon", "3",
            "--aggregate", "count",
            "--test-size", "1d",
            "--models", "ets_log",
            "--json", str(out),
        ]
    )  # fmt: skip
    assert code == 0
    printed = capsys.readouterr().out
    assert "seasonal_naive_daily" in printed and "selected:" in printed
    data = json.loads(out.read_text())
    assert set(data) >= {"selected", "models"}
    assert set(data["models"]) == {"naive", "seasonal_naive_daily", "ets_log"}
    assert data["selected"] in data["models"]
    for scores in data["models"].values():
        assert set(scores) == {
            "wape",
            "smape",
            "under_rate",
            "coverage",
            "fit_seconds",
            "update_seconds",
        }
        for key in ("wape", "smape", "under_rate", "coverage"):
            assert set(scores[key]) == {"1", "2", "3"}
            assert all(v >= 0 for v in scores[key].values())
    daily = data["models"]["seasonal_naive_daily"]["wape"]["1"]
    naive = data["models"]["naive"]["wape"]["3"]
    assert daily < naive  # a daily cycle: the day-ago copy beats the last value 3 h ahead


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--time-column", "nope"], "check --time-column"),
        (["--time-column", "created", "--test-size", "5000"], "does not fit"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(events_csv, capsys, extra, message):
    code = main(["backtest", "--csv", str(events_csv), "--freq", "1h", "--horizon", "2", *extra])
    assert code == 2
    assert message in capsys.readouterr().err
