"""``autoglm-predictor backtest`` on a small CSV, and its errors."""

from __future__ import annotations

import json
import socket
import sys

import numpy as np
import pandas as pd
import pytest

import predictor.cli
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


@pytest.fixture()
def no_torch(monkeypatch):
    """``import torch`` fails: a check that passes through it (seconds at start-up) is too late."""
    monkeypatch.setitem(sys.modules, "torch", None)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--freq", "0s"], "--freq '0s': a bin must be longer than 0"),
        (["--freq=-1h"], "--freq '-1h': a bin must be longer than 0"),
        (["--freq", "soon"], "--freq 'soon' is not a bin size"),
        (["--horizon", "0"], "--horizon must be >= 1"),
        (["--quantile", "1.5"], "--quantile must be in (0, 1)"),
        (["--seasons", "1d,often"], "--seasons: 'often' is not a duration"),
        (["--models", "ets_log,crystal_ball"], "--models: unknown model 'crystal_ball'"),
        (["--test-size", "-3"], "--test-size '-3' is not a test window"),
        (["--refit-every", "-1"], "--refit-every must be >= 0"),
        (["--csv", "/nonexistent/events.csv"], "--csv '/nonexistent/events.csv': no such file"),
        (["--json", "DIR"], "is a directory"),
    ],
)
def test_bad_flags_answer_before_torch_and_the_csv(
    events_csv, tmp_path, capsys, monkeypatch, no_torch, extra, message
):
    def no_csv(*args, **kwargs):
        raise AssertionError("the CSV was read before the flags were checked")

    monkeypatch.setattr(predictor.cli, "load_csv_series", no_csv)
    extra = [str(tmp_path) if a == "DIR" else a for a in extra]
    argv = ["backtest", "--csv", str(events_csv), "--time-column", "created"]
    argv += ["--freq", "1h", "--horizon", "2", *extra]
    assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("autoglm-predictor backtest: error: ")
    assert message in line


def test_an_unknown_backtest_flag_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["backtest", "--bogus"])
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "see --help" in line


def test_a_json_folder_is_made_before_the_backtest(events_csv, tmp_path, capsys, no_torch):
    out = tmp_path / "new" / "deeper" / "result.json"
    argv = ["backtest", "--csv", str(events_csv), "--time-column", "created", "--freq", "1h"]
    with pytest.raises(ImportError):  # past the checks, at the import of torch
        main([*argv, "--horizon", "2", "--json", str(out)])
    assert out.parent.is_dir()


@pytest.fixture()
def targets_file(tmp_path):
    path = tmp_path / "predictor.yaml"
    path.write_text("targets:\n  - {name: r, query: vector(1), step: 1m, horizons: [1]}\n")
    return path


def _busy_port():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    return sock


@pytest.mark.parametrize("problem", ["busy port", "web config", "token file"])
def test_serve_checks_its_settings_before_torch(targets_file, tmp_path, capsys, no_torch, problem):
    argv = ["serve", "--config", str(targets_file), "--listen", "127.0.0.1:0"]
    with _busy_port() as busy:
        if problem == "busy port":
            argv += ["--listen", f"127.0.0.1:{busy.getsockname()[1]}"]
            message = "cannot listen there"
        elif problem == "web config":
            argv += ["--web-config-file", str(tmp_path / "web.yml")]
            message = "web.yml"
        else:
            argv += ["--prometheus-bearer-token-file", str(tmp_path / "token")]
            message = "cannot read bearer token file"
        assert main(argv) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("autoglm-predictor: error: ")
    assert message in line
