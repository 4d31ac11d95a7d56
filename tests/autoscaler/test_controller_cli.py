"""The autoscaler command line: offline decisions and configuration errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from autoscaler.cli import main
from autoscaler.core.slo_objective import sizing_quantile_for_objective
from autoscaler.core.slo_sizing import ServiceModel, replicas_for_slo

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


def test_decide_sizes_for_an_slo(tmp_path, capsys):
    spec = tmp_path / "slo.yaml"
    spec.write_text(
        "scaleTargetRef: {kind: Deployment, name: llm}\n"
        "maxReplicas: 20\n"
        "behavior: {scaleUp: {tolerance: 0}}\n"
        "slo: {latencySeconds: 1}\n"
    )
    model = ServiceModel(0.05, 0.01, 8)
    slo = {
        "rate": 100,
        "serviceModel": {"fixedSeconds": 0.05, "perItemSeconds": 0.01, "maxBatch": 8},
    }
    args = ["decide", "--spec", str(spec), "--current", "1", "--metrics", "{}", "--slo"]

    assert main([*args, json.dumps(slo)]) == 0

    out = json.loads(capsys.readouterr().out)
    sized = replicas_for_slo(100, 1.0, model, min_replicas=1, max_replicas=20)
    assert 1 < sized.replicas <= 5  # reachable from 1 in one step of the default policy
    assert out["driver"] == "slo" and out["slo"]["sizedReplicas"] == sized.replicas
    assert out["desiredReplicas"] == sized.replicas and out["reason"] == sized.reason
    assert out["slo"]["sizedLatencySeconds"] == 1.0
    # a best-effort slice given with the model is reserved out of the SLO
    slo["serviceModel"]["bestEffortQuantumSeconds"] = 0.8
    assert main([*args, json.dumps(slo)]) == 0
    out = json.loads(capsys.readouterr().out)
    held = replicas_for_slo(100, 0.2, model, min_replicas=1, max_replicas=20)
    assert out["slo"]["sizedLatencySeconds"] == pytest.approx(0.2)
    assert out["slo"]["sizedReplicas"] == held.replicas > sized.replicas
    assert main([*args, '{"serviceModel": {}}']) == 2
    assert "--slo must be" in capsys.readouterr().err


def test_decide_shows_the_objective_and_the_quantile_it_sized_for(tmp_path, capsys):
    slo = {
        "rate": 2,
        "serviceModel": {"fixedSeconds": 1.5, "perItemSeconds": 0.4, "maxBatch": 8},
    }
    model = ServiceModel(1.5, 0.4, 8)
    sized = {}
    for objective in (None, 0.995):
        spec = tmp_path / "slo.yaml"
        held = "" if objective is None else f", objective: {objective}"
        spec.write_text(
            "scaleTargetRef: {kind: Deployment, name: llm}\n"
            "maxReplicas: 20\n"
            "behavior: {scaleUp: {tolerance: 0}}\n"
            f"slo: {{latencySeconds: 8{held}}}\n"
        )
        args = ["decide", "--spec", str(spec), "--current", "2", "--metrics", "{}"]

        assert main([*args, "--slo", json.dumps(slo)]) == 0

        out = json.loads(capsys.readouterr().out)["slo"]
        assert out["quantile"] == 0.99 and out["objective"] == objective
        expected = 0.99 if objective is None else sizing_quantile_for_objective(2, 0.99, objective)
        assert out["sizingQuantile"] == expected
        sized[objective] = out["sizedReplicas"]
        assert (
            sized[objective]
            == (
                replicas_for_slo(2, 8.0, model, min_replicas=1, max_replicas=20, quantile=expected)
            ).replicas
        )
    # 120 requests a minute: holding 99.5% of minutes' p99 asks for a stricter per-request tail
    assert 0.99 < sizing_quantile_for_objective(2, 0.99, 0.995) < 1
    assert sized[0.995] > sized[None]
