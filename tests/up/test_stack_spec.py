"""What the local stack asks of the autoscaler and the predictor: the GPUAutoscaler it runs, its
PromQL, the predictor's horizons, and the same reading from the embedded window."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest
from prometheus_client import CollectorRegistry, Counter, generate_latest

from autoglm.config import ConfigError, load_config
from autoscaler.local import LocalProcessGroup
from batcher.config import BatcherConfig
from batcher.metrics import BatcherMetrics
from predictor.selection import minimum_history
from stack.config import UpConfig, check_worker_model
from stack.profiles import RAMP_SHAPE
from stack.stack import (
    BEST_EFFORT_WINDOW_SECONDS,
    DEMO_WARMUP_REPEATS,
    PREDICTOR_STEP_SECONDS,
    RoutedGroup,
    Stack,
    Stopped,
    batcher_slo_queries,
    build_spec,
    class_percent,
    forecast_metric,
    online_busy_query,
    online_percent,
    open_gpus,
    predictor_horizons,
    request_rate_query,
)
from stack.window import MetricsWindow, Scrape, parse_exposition


def test_the_spec_scales_on_online_work_per_worker_with_the_fleet_forecast() -> None:
    spec = build_spec(UpConfig(target_utilization=0.6, warmup_seconds=9.0, max_workers=5))
    (metric,) = spec.metrics
    assert (metric.name, metric.source) == ("online_busy", "Pods")
    assert metric.target_type == "Utilization"
    assert metric.target_value == pytest.approx(60.0)  # the ratio flag, as the HPA's percent
    assert metric.query == online_busy_query(by_pod=True)
    assert 'class="online"' in metric.query and '"pod", "$1", "instance"' in metric.query
    assert metric.prediction is not None
    assert metric.prediction_query == online_busy_query(by_pod=False)
    assert metric.prediction.effective_horizon_seconds == pytest.approx(9.0)
    assert (spec.min_replicas, spec.max_replicas) == (1, 5)
    assert build_spec(UpConfig(prediction=False)).metrics[0].prediction is None


def test_slo_sizing_sizes_on_the_forecast_request_rate_and_falls_back_on_online_work() -> None:
    spec = build_spec(UpConfig(sizing="slo", slo_seconds=0.3, warmup_seconds=9.0))
    assert spec.slo is not None
    assert spec.slo.latency_seconds == pytest.approx(0.3) and spec.slo.quantile == 0.99
    assert spec.slo.rate_query == request_rate_query()
    assert 'job="autoglm-batcher"' in spec.slo.fixed_seconds_query  # the stack's workers
    # The forecast belongs to the rate; the online metric is the HPA rule it falls back on.
    rate = forecast_metric(spec)
    assert rate.name == spec.slo.rate_name and rate.prediction is not None
    assert rate.prediction_query == request_rate_query()
    assert rate.prediction.effective_horizon_seconds == pytest.approx(9.0)
    (fallback,) = spec.metrics
    assert fallback.name == "online_busy" and fallback.prediction is None
    assert forecast_metric(build_spec(UpConfig())).name == "online_busy"


@pytest.mark.parametrize(("warmup", "interval"), [(8.0, 2.0), (12.0, 2.0), (1.0, 5.0)])
def test_predictor_horizons_reach_past_the_horizon_the_autoscaler_asks(
    warmup: float, interval: float
) -> None:
    steps = predictor_horizons(warmup, interval)
    assert steps == tuple(sorted(set(steps))) and steps[0] == 1
    assert steps[-1] * PREDICTOR_STEP_SECONDS >= max(warmup, interval) + PREDICTOR_STEP_SECONDS


def test_the_first_forecast_can_come_before_the_default_ramp() -> None:
    cfg = UpConfig()
    history = minimum_history(max(predictor_horizons(cfg.warmup_seconds, cfg.interval)))
    assert history * PREDICTOR_STEP_SECONDS < RAMP_SHAPE[0] * cfg.day_seconds


def busy_scrape(t: float, online: float, best_effort: float) -> Scrape:
    registry = CollectorRegistry()
    counter = Counter(
        "autoglm_batcher_class_busy_seconds", "busy", ["model", "class"], registry=registry
    )
    counter.labels("demo", "online").inc(online)
    counter.labels("demo", "best_effort").inc(best_effort)
    return Scrape(t, True, parse_exposition(generate_latest(registry).decode()))


def test_the_window_reads_each_class_of_a_workers_busy_time() -> None:
    window = MetricsWindow()
    window.add("w1", busy_scrape(100.0, 0.0, 0.0))
    window.add("w1", busy_scrape(102.0, 1.2, 0.6))  # 60 % online, 30 % best-effort
    assert online_percent(window, "w1", 102.0) == pytest.approx(60.0)
    assert class_percent(window, "w1", "best_effort", 102.0) == pytest.approx(30.0)
    assert online_percent(window, "w2", 102.0) is None  # no worker, no reading


def test_demo_workers_take_the_largest_batch_inside_the_slo() -> None:
    """The demo kernel is 4 ms + 20 ms per item: at a 0.25 s SLO, 8 items (0.164 s) fit and 16
    (0.324 s) would not; another model keeps the batcher's own default."""
    command = Stack(UpConfig(slo_seconds=0.25), no_view)._worker_command()
    assert command[command.index("--max-batch-size") + 1] == "8"
    other = Stack(UpConfig(worker_model="batcher.models.demo:factory"), no_view)
    assert "--max-batch-size" not in other._worker_command()


def test_every_worker_is_given_one_torch_thread() -> None:
    """A torch worker model runs on one thread; the numpy demo model is given the flag too,
    and never loads torch for it (tests/batcher/test_batcher_cli.py)."""
    for model in (UpConfig().worker_model, "batcher.models.demo:factory"):
        command = Stack(UpConfig(worker_model=model), no_view)._worker_command()
        assert command[command.index("--torch-threads") + 1] == "1"


def no_view(_: list[str]) -> None:
    return None


@pytest.mark.parametrize(
    ("model", "words"),
    [
        ("no.such:factory", "no module 'no.such' can be found"),
        ("batcher.models.nope:factory", "no module 'batcher.models.nope' can be found"),
        ("stack.model", "must be package.module:factory"),
        ("stack.model:", "must be package.module:factory"),
        ("stack.model:not-a-name", "must be package.module:factory"),
        (":factory", "must be package.module:factory"),
        ("stack..model:factory", "no module 'stack..model'"),
    ],
)
def test_a_worker_model_that_cannot_be_found_is_a_config_error(model: str, words: str) -> None:
    with pytest.raises(ConfigError, match=words) as info:
        UpConfig(worker_model=model)
    assert "\n" not in str(info.value)


def test_worker_models_are_looked_up_without_importing_them() -> None:
    """A model module (or its package) could load torch: finding it must run none of it."""
    code = (
        "import sys; from stack.config import check_worker_model; "
        "check_worker_model('batcher.models.demo:factory'); "
        "check_worker_model('stack.model:factory'); check_worker_model('json:loads'); "
        "print(sorted(m for m in sys.modules if m.startswith(('batcher', 'stack.model'))))"
    )
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert run.stdout.strip() == "[]", run.stdout + run.stderr
    check_worker_model(UpConfig().worker_model)


def test_waiting_for_workers_stops_as_soon_as_every_worker_has_exited() -> None:
    """A worker that cannot load its model exits at once: ``up`` says so with its status
    instead of waiting the whole ready timeout for a worker that no longer exists."""
    stack = Stack(UpConfig(report_dir="rep"), no_view)
    group = LocalProcessGroup([sys.executable, "-c", "raise SystemExit(3)"], ready_url=None)
    stack.routed = RoutedGroup(group, lambda _: None)
    group.set_replicas(2)
    try:
        for worker in group._workers:
            worker.process.wait(timeout=60)
        with pytest.raises(RuntimeError, match="exit status 3") as info:
            stack._wait_for_workers(threading.Event())
    finally:
        group.close()
    assert "--log-level debug" in str(info.value) and "autoglm-up.log" in str(info.value)


def test_a_live_worker_is_waited_for() -> None:
    stack = Stack(UpConfig(), no_view)
    group = LocalProcessGroup([sys.executable, "-c", "import time; time.sleep(60)"], ready_url=None)
    stack.routed = RoutedGroup(group, lambda _: None)
    group.set_replicas(1)
    try:
        assert stack.routed.all_exited() is None
        stop = threading.Event()
        stop.set()
        with pytest.raises(Stopped):
            stack._wait_for_workers(stop)
    finally:
        group.close()
    assert group.get_scale().replicas == 0 and stack.routed.all_exited() is None


@pytest.mark.parametrize("slo", [0.25, 1.0, 0.3333333])
def test_the_batchers_slo_count_reads_the_bucket_the_batcher_exports_at_the_slo(slo: float) -> None:
    """The SLO is a bucket bound of the batcher's latency histogram; the query must name that
    bucket's ``le`` exactly as the batcher writes it, or it counts nothing."""
    metrics = BatcherMetrics(CollectorRegistry(), "demo", slo, 8)
    exposition = generate_latest(metrics.registry).decode()
    within, answered, refused = batcher_slo_queries(slo, 120.4)
    le = within.split('le="')[1].split('"')[0]
    assert f'autoglm_batcher_request_latency_seconds_bucket{{le="{le}",model="demo"}}' in exposition
    assert "[121s]" in within and 'outcome="ok"' in answered and "rejections_total" in refused


def test_the_worker_command_is_one_the_batcher_accepts() -> None:
    """Every flag the stack gives its workers parses as the batcher's own settings: the
    shorter best-effort window and the demo's shorter warm-up among them."""
    command = Stack(UpConfig(slo_seconds=0.25), no_view)._worker_command()
    args = [a.replace("{port}", "8000") for a in command[command.index("batcher.cli") + 1 :]]
    settings = load_config(BatcherConfig, args, prog="autoglm-batcher")
    assert settings.best_effort_window_seconds == BEST_EFFORT_WINDOW_SECONDS
    assert settings.warmup_repeats == DEMO_WARMUP_REPEATS < BatcherConfig.warmup_repeats
    assert settings.max_batch_size == 8


def test_without_a_driver_the_stack_logs_nvmls_reason_and_simulates(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The log line gives NVML's own reason, not the exporter's advice (`--source simulated`,
    a flag `autoglm up` does not have): the stack simulates the GPUs by itself."""
    from exporter.sources import NoDriverError, NVMLSource

    def no_driver() -> NVMLSource:
        cause = RuntimeError("NVML Shared Library Not Found")
        raise NoDriverError("no NVIDIA driver was found; use --source simulated") from cause

    monkeypatch.setattr(NVMLSource, "open", staticmethod(no_driver))
    with caplog.at_level("INFO", logger="stack.stack"):
        source, simulated, notice = open_gpus(UpConfig(max_workers=3))
    (record,) = [r for r in caplog.records if r.getMessage() == "no NVIDIA driver"]
    assert record.error == "NVML Shared Library Not Found"
    assert simulated is not None and source is simulated
    assert notice.startswith("no NVIDIA GPU found: simulating 3 ")
