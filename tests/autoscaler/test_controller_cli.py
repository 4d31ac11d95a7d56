"""The autoscaler command line: offline decisions and configuration errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.cli import main

EXAMPLE = str(Path(__file__).resolve().parents[2] / "autoscaler" / "crd" / "example.yaml")


def test_decide_answers_what_if(capsys):
    readings = {
        "gpu_util": {"pods": {"a": 90, "b": 90}},
        "queue": {"pods": {"a": 8, "b": 8}, "forecast": 20},
    }
    code = main(["decide", "--spec", EXAMPLE, "--current", "2", "--metrics", json.dumps(readings)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reactiveProposal"] == 3  # ceil(2 * 90/70)
    assert out["predictiveProposal"] == 5  # ceil(2 * 20/8)
    assert out["desiredReplicas"] == 5
    assert out["driver"] == "metric:queue/predictive"


def test_decide_names_a_bad_reading(capsys):
    code = main(["decide", "--spec", EXAMPLE, "--current", "2", "--metrics", '{"gpu_util": 3}'])
    assert code == 2
    assert "gpu_util must be an object" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["run", "--mode", "local"], "--spec-file"),
        (["--interval", "0"], "interval must be > 0"),
        (["--lease-duration", "5", "--renew-deadline", "5"], "renew_deadline"),
        (["--prometheus-url", "prometheus:9090"], "http://"),
    ],
)
def test_bad_settings_exit_2_with_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert message in err
    assert len(err.strip().splitlines()) == 1
