"""``autoglm autoscaler``: run the controller, simulate a policy, or ask for one decision.

    autoglm autoscaler run --namespace ml --prometheus-url http://prometheus:9090 [--dry-run]
    autoglm autoscaler run --mode local --spec-file gpuautoscaler.yaml \
        --worker-command autoglm-batcher --worker-command --listen=127.0.0.1:{port} ...
    autoglm autoscaler simulate --trace FILE --policy hpa|predictive|static ...
    autoglm autoscaler decide --spec gpuautoscaler.yaml --current 2 --metrics '{"gpu_util": ...}'

``run`` is the default subcommand, so ``autoglm autoscaler --dry-run`` works too.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import socket
import sys
import time
from collections.abc import Sequence
from typing import Any

from autoglm.config import (
    ConfigError,
    OneLineErrorParser,
    add_config_arguments,
    check_can_listen,
    config_or_exit,
    read_yaml_file,
)
from autoglm.logs import setup_logging
from autoglm.pipes import stdout_may_close
from autoglm.signals import stop_on_signals
from autoglm.version import add_version_argument
from autoglm.web.exchange import Response
from autoglm.web.exposition import registry_route
from autoglm.web.server import HTTPServer
from autoglm.webconfig import WebConfig
from autoscaler.config import AutoscalerConfig
from autoscaler.core import MetricInput, PodSample, ScalingState, decide
from autoscaler.core.decision import SloInput, SloOutcome
from autoscaler.core.replica_calculator import ReadinessTimes
from autoscaler.core.slo_sizing import ServiceModel
from autoscaler.metrics import AutoscalerMetrics
from autoscaler.spec import SpecError, load_spec_file

PROG = "autoglm-autoscaler"
SUBCOMMANDS = ("run", "simulate", "decide")
log = logging.getLogger(__name__)


@stdout_may_close
def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    command = args[0] if args and args[0] in SUBCOMMANDS else "run"
    rest = args[1:] if args and args[0] in SUBCOMMANDS else args
    if command == "simulate":
        from autoscaler.simulator.cli import simulate_main

        return simulate_main(rest)
    if command == "decide":
        return decide_main(rest)
    return run_main(rest)


# --- run ---------------------------------------------------------------------------------------


def run_main(argv: Sequence[str]) -> int:
    parser = OneLineErrorParser(prog=f"{PROG} run", description="run the controller")
    add_config_arguments(parser, AutoscalerConfig)
    cfg = config_or_exit(AutoscalerConfig, parser.parse_args(argv), f"{PROG} run")
    setup_logging("autoscaler", cfg.log_level, cfg.log_format)
    try:
        return _run(cfg)
    except (ConfigError, SpecError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2


def _kube_api_client(cfg: AutoscalerConfig):
    import kubernetes.client
    import kubernetes.config

    configuration = kubernetes.client.Configuration()
    if cfg.kubeconfig:
        _check_kubeconfig(cfg.kubeconfig)
    try:
        if cfg.kubeconfig:
            try:
                kubernetes.config.load_kube_config(
                    cfg.kubeconfig, client_configuration=configuration
                )
            except (kubernetes.config.ConfigException, OSError):
                raise
            except Exception as exc:  # a mapping of the wrong shape (a list where one is due)
                raise ConfigError(
                    f"--kubeconfig {cfg.kubeconfig!r} is not a usable kubeconfig ({exc}); "
                    "give the file kubectl uses (e.g. ~/.kube/config)"
                ) from exc
        else:
            try:
                kubernetes.config.load_incluster_config(client_configuration=configuration)
            except kubernetes.config.ConfigException:
                kubernetes.config.load_kube_config(client_configuration=configuration)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise ConfigError(
            f"no Kubernetes configuration ({exc}); run in a pod or pass --kubeconfig FILE"
        ) from exc
    return kubernetes.client.ApiClient(configuration)


def _check_kubeconfig(path: str) -> None:
    """One line naming --kubeconfig when the file is missing, not text, or not a YAML mapping."""
    try:
        data = read_yaml_file(path, "--kubeconfig file")
    except ConfigError as exc:  # one line already, YAML errors included
        raise ConfigError(f"{exc}; give the file kubectl uses (e.g. ~/.kube/config)") from exc
    if not isinstance(data, dict):
        raise ConfigError(
            f"--kubeconfig file {path!r} is not a kubeconfig (a YAML mapping with clusters, "
            "users and contexts); give the file kubectl uses (e.g. ~/.kube/config)"
        )


def _hpa_flags(cfg: AutoscalerConfig) -> dict[str, Any]:
    """The kube-controller-manager flags the decision core takes, as the reconciler's keywords."""
    return {
        "readiness": ReadinessTimes(cfg.initialization_period, cfg.initial_readiness_delay),
        "downscale_stabilization": cfg.downscale_stabilization,
    }


def _run(cfg: AutoscalerConfig) -> int:
    # The controller's modules (the kubernetes client among them) load here, not for --help.
    from autoscaler.controller.budget import BudgetCoordinator, BudgetMetrics
    from autoscaler.controller.controllers import KubernetesController, LocalController
    from autoscaler.controller.forecasts import PrometheusForecasts
    from autoscaler.controller.kube import KubeAPI
    from autoscaler.controller.leader import LeaderElector
    from autoscaler.controller.loop import ReconcileLoop
    from autoscaler.controller.metrics_source import PrometheusMetricsSource
    from autoscaler.controller.reconciler import Reconciler
    from autoscaler.controller.service_model import PrometheusServiceModels
    from autoscaler.local import LocalProcessGroup

    # A busy --listen port is one line now, not after workers have started (or a lease is held).
    check_can_listen(cfg.listen)
    metrics = AutoscalerMetrics()
    client = cfg.prometheus_client(cfg.prometheus_timeout)
    web_config = WebConfig.load(cfg.web_config_file or None)
    identity = cfg.identity or socket.gethostname()
    elector = None
    group = None
    api_client = None
    if cfg.mode == "kubernetes":
        api_client = _kube_api_client(cfg)
        if cfg.leader_elect:
            elector = LeaderElector(
                api_client,
                cfg.lease_namespace or cfg.namespace,
                cfg.lease_name,
                identity,
                lease_duration=cfg.lease_duration,
                renew_deadline=cfg.renew_deadline,
            )
        may_act = elector.is_leader if elector else (lambda: True)
        reconciler = Reconciler(
            PrometheusMetricsSource(client, cfg.pod_label),
            PrometheusForecasts(client, cfg.forecast_query),
            metrics,
            service_models=PrometheusServiceModels(client),
            dry_run=cfg.dry_run,
            may_act=may_act,
            **_hpa_flags(cfg),
        )
        kube = KubeAPI(api_client, identity=identity)
        controller: Any = KubernetesController(
            kube, reconciler, cfg.namespace, cfg.name or None, may_act=may_act
        )
        # GPUBudgets in the namespace cap the autoscalers they govern (docs/budgets.md).
        budgets = BudgetCoordinator(
            kube, controller, cfg.namespace, BudgetMetrics(metrics.registry), time.time
        )
        reconciler.budget = budgets
        controller = budgets
    else:
        spec = load_spec_file(cfg.spec_file)
        if cfg.worker_base_port and cfg.worker_base_port + spec.max_replicas - 1 > 65535:
            raise ConfigError(
                f"--worker-base-port {cfg.worker_base_port} leaves no port for worker "
                f"{spec.max_replicas} (maxReplicas); give at most {65536 - spec.max_replicas}, "
                "or 0 to pick free ports"
            )
        group = LocalProcessGroup(
            cfg.worker_command,
            base_port=cfg.worker_base_port,
            port_env=cfg.worker_port_env,
            ready_url=cfg.worker_ready_url or None,
        )
        group.set_replicas(spec.min_replicas)
        reconciler = Reconciler(
            PrometheusMetricsSource(client, cfg.pod_label),
            PrometheusForecasts(client, cfg.forecast_query),
            metrics,
            service_models=PrometheusServiceModels(client),
            dry_run=cfg.dry_run,
            **_hpa_flags(cfg),
        )
        controller = LocalController(spec, group, reconciler)

    loop = ReconcileLoop(controller, metrics, cfg.interval, elector)
    server = HTTPServer(
        cfg.listen,
        {
            "/metrics": registry_route(metrics.registry),
            "/healthz": lambda request: Response.text("ok\n"),
            "/status": lambda request: Response.json(getattr(controller, "status", {})),
        },
        web_config=web_config,
        component="autoscaler",
        registry=metrics.registry,
        open_paths=("/healthz",),
    )
    server.start()
    with stop_on_signals() as stop:
        log.info(
            "autoscaler started",
            extra={
                "mode": cfg.mode,
                "dry_run": cfg.dry_run,
                "listen": server.url,
                "identity": identity,
            },
        )
        loop.start()
        try:
            stop.wait()
        finally:
            loop.stop()
            if group is not None:
                group.close()
            server.stop()
            client.close()
            if api_client is not None:
                api_client.close()
    return 0


# --- decide ------------------------------------------------------------------------------------


def decide_main(argv: Sequence[str]) -> int:
    """One decision from a spec and metric values given on the command line (no state, no I/O)."""
    parser = OneLineErrorParser(
        prog=f"{PROG} decide",
        description="what would the autoscaler do with these readings? (no history)",
    )
    add_version_argument(parser)
    parser.add_argument("--spec", required=True, help="GPUAutoscaler YAML (object or spec)")
    parser.add_argument(
        "--current", type=_replicas, required=True, help="current replicas (0 or more)"
    )
    parser.add_argument(
        "--metrics",
        required=True,
        help='JSON: {"NAME": {"pods": {"pod-a": 80, ...}} | {"value": 12}, '
        'optional "forecast": N in the reading\'s units (per pod for Pods metric)}; '
        "a pod value null means no sample",
    )
    parser.add_argument(
        "--slo",
        default=None,
        help='with spec.slo, JSON: {"rate": REQ_PER_S, "forecast": REQ_PER_S (optional), '
        '"serviceModel": {"fixedSeconds": C, "perItemSeconds": A, "maxBatch": B, '
        '"serviceScv": S (optional), "bestEffortQuantumSeconds": Q (optional)}}',
    )
    args = parser.parse_args(argv)
    try:
        spec = load_spec_file(args.spec)
        readings = _json_argument("--metrics", args.metrics)
        if not isinstance(readings, dict):
            raise ValueError("--metrics must be a JSON object keyed by metric name")
        inputs = [_input_from_json(m, readings.get(m.name)) for m in spec.metrics]
        slo = _slo_from_json(_json_argument("--slo", args.slo)) if args.slo is not None else None
    except (SpecError, ValueError) as exc:
        print(f"{PROG} decide: error: {exc}", file=sys.stderr)
        return 2
    now = time.time()
    # Without a Pods metric to list them, the current replicas count as Running and Ready pods
    # (what Value targets multiply).
    listed = next((i.pods for i in inputs if i.pods is not None), None)
    if listed is None:
        listed = tuple(PodSample(f"pod-{i}", None, started_at=0.0) for i in range(args.current))
    decision = decide(spec, args.current, inputs, ScalingState(), now, pods=listed, slo=slo)
    print(
        json.dumps(
            {
                "currentReplicas": decision.current_replicas,
                "desiredReplicas": decision.desired_replicas,
                "reactiveProposal": decision.reactive_proposal,
                "predictiveProposal": decision.predictive_proposal,
                "driver": decision.driver,
                "reason": decision.reason,
                "metrics": [o.__dict__ for o in decision.per_metric],
                "conditions": {k: list(v) for k, v in decision.conditions.items()},
                "slo": _slo_json(decision.slo),
            },
            indent=2,
        )
    )
    return 0


def _replicas(text: str) -> int:
    """argparse ``type=`` for --current: a whole number of replicas, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0 (a replica count), got {value}")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a finite number")


def _json_argument(flag: str, text: str) -> Any:
    """``text`` parsed as JSON; NaN and Infinity (which Python's json accepts) are refused."""
    try:
        return json.loads(text, parse_constant=_reject_constant)
    except ValueError as exc:  # json.JSONDecodeError is one
        raise ValueError(f"{flag} is not valid JSON: {exc}") from None


def _number(raw: Any, where: str, *, minimum: float | None = None) -> float:
    """``raw`` as a finite float (a JSON number, not true/false), at least ``minimum``."""
    if isinstance(raw, bool) or not isinstance(raw, (int, float)):
        raise ValueError(f"{where} must be a number, got {json.dumps(raw)}")
    try:
        value = float(raw)
    except OverflowError:
        value = math.inf
    if not math.isfinite(value):
        raise ValueError(f"{where} must be a finite number, got {raw!r}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{where} must be >= {minimum:g}, got {raw!r}")
    return value


def _whole(raw: Any, where: str, *, minimum: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < minimum:
        raise ValueError(f"{where} must be a whole number >= {minimum}, got {json.dumps(raw)}")
    return raw


def _optional_number(raw: Any, where: str, *, minimum: float | None = None) -> float | None:
    return None if raw is None else _number(raw, where, minimum=minimum)


def _slo_from_json(raw: Any) -> SloInput:
    if not isinstance(raw, dict) or "rate" not in raw:
        raise ValueError('--slo must be a JSON object with "rate" (and "serviceModel")')
    model = raw.get("serviceModel")
    service_model = None
    if model is not None:
        if not isinstance(model, dict):
            raise ValueError("--slo: serviceModel must be an object")
        where = "--slo: serviceModel."
        service_model = ServiceModel(
            _number(model.get("fixedSeconds", 0.0), where + "fixedSeconds", minimum=0),
            _number(model.get("perItemSeconds", 0.0), where + "perItemSeconds", minimum=0),
            _whole(model.get("maxBatch", 1), where + "maxBatch", minimum=1),
            _number(model.get("serviceScv", 0.0), where + "serviceScv", minimum=0),
        )
    quantum = (model or {}).get("bestEffortQuantumSeconds")
    return SloInput(
        _number(raw["rate"], "--slo: rate", minimum=0),
        _optional_number(raw.get("forecast"), "--slo: forecast", minimum=0),
        service_model,
        best_effort_quantum_seconds=_optional_number(
            quantum, "--slo: serviceModel.bestEffortQuantumSeconds", minimum=0
        ),
    )


def _slo_json(outcome: SloOutcome | None) -> dict[str, Any] | None:
    if outcome is None:
        return None
    sizing = outcome.sizing
    return {
        "quantile": outcome.quantile,
        "objective": outcome.objective,
        "sizingQuantile": outcome.sizing_quantile,
        "sizingRate": outcome.sizing_rate,
        "sizedLatencySeconds": outcome.sized_latency_seconds,
        "sizedReplicas": sizing.replicas if sizing else None,
        "modelledP99Seconds": sizing.modelled_p99_seconds if sizing else None,
        "feasible": sizing.feasible if sizing else None,
        "proposal": outcome.proposal,
        "reason": sizing.reason if sizing else outcome.error,
    }


def _input_from_json(metric, raw: Any) -> MetricInput:
    if raw is None:
        return MetricInput(metric, error="no reading given")
    if not isinstance(raw, dict):
        raise ValueError(f"--metrics: {metric.name} must be an object with pods or value")
    forecast = _optional_number(
        raw.get("forecast"), f"--metrics: {metric.name}.forecast", minimum=0
    )
    if metric.source == "Pods":
        pods = raw.get("pods")
        if not isinstance(pods, dict):
            raise ValueError(f"--metrics: {metric.name} is a Pods metric; give 'pods': {{...}}")
        # Pods given here count as started long ago, ready, and requesting one unit of the
        # metric's resource (a Utilization value is then that pod's percent of it).
        samples = tuple(
            PodSample(
                name,
                None
                if v is None
                else _number(v, f"--metrics: {metric.name}.pods.{name}", minimum=0),
                ready=True,
                started_at=0.0,
                containers={"main": {metric.resource: 1.0}},
            )
            for name, v in pods.items()
        )
        return MetricInput(metric, pods=samples, forecast_upper=forecast)
    if "value" not in raw:
        raise ValueError(f"--metrics: {metric.name} is an {metric.source} metric; give 'value'")
    value = _number(raw["value"], f"--metrics: {metric.name}.value")
    return MetricInput(metric, value=value, forecast_upper=forecast)


if __name__ == "__main__":
    raise SystemExit(main())
