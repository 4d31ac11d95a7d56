"""``autoglm-predictor``: ``serve`` (default) publishes forecasts; ``backtest`` scores models
on a CSV.

``backtest`` bins the CSV into a regular series, chooses a model the way the service does (a
rolling-origin backtest on the history before the test window), then backtests every model on
the test window and prints WAPE, sMAPE, under-forecast rate and upper-bound coverage per horizon
with fit and update times; ``--json`` writes the same for other tools.

torch, pandas and the models are imported by the command that uses them, so ``--help`` and a bad
flag answer at once.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autoglm.config import (
    ConfigError,
    OneLineErrorParser,
    add_config_arguments,
    config_or_exit,
    finite_float_argument,
)
from autoglm.logs import setup_logging
from autoglm.pipes import stdout_may_close
from autoglm.signals import stop_on_signals
from autoglm.version import add_version_argument
from predictor.config import PredictorConfig, parse_duration

if TYPE_CHECKING:
    import pandas as pd

    from autoglm.prometheus_api import PrometheusClient
    from autoglm.web.server import HTTPServer
    from predictor.backtest import BacktestResult
    from predictor.selection import Selection
    from predictor.series import Aggregate
    from predictor.service import PredictorService

PROG = "autoglm-predictor"
USAGE = f"""%(prog)s [serve] [--config FILE] [flags]
       {PROG} backtest --csv FILE --time-column COLUMN --freq BIN --horizon N [flags]"""
COMMANDS = f"""commands:
  serve     (the default) forecast Prometheus series and publish them on /metrics; flags below
  backtest  score every model on a CSV series with a rolling-origin backtest;
            its flags: {PROG} backtest --help"""
log = logging.getLogger(__name__)


@stdout_may_close
def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "backtest":
        return backtest_main(args[1:])
    if args and args[0] == "serve":
        args = args[1:]
    return serve_main(args)


# -- serve -------------------------------------------------------------------------------------
def serve_main(argv: Sequence[str]) -> int:
    parser = OneLineErrorParser(
        prog=PROG,
        usage=USAGE,
        description=COMMANDS,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_arguments(parser, PredictorConfig)
    config = config_or_exit(PredictorConfig, parser.parse_args(argv), f"{PROG} serve")
    setup_logging("predictor", config.log_level, config.log_format)

    import torch

    from autoglm.web.exposition import registry_route
    from autoglm.web.server import HTTPServer
    from autoglm.webconfig import WebConfig
    from predictor.metrics import PredictorMetrics
    from predictor.service import PredictorService

    torch.set_num_threads(config.torch_threads)
    try:
        web_config = WebConfig.load(config.web_config_file or None)
        source = config.prometheus_client(config.timeout_seconds)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    metrics = PredictorMetrics()
    service = PredictorService(config.target_configs, source=source, metrics=metrics)
    server = HTTPServer(
        config.listen,
        {"/metrics": registry_route(metrics.registry)},
        web_config=web_config,
        component="predictor",
        registry=metrics.registry,
    )
    try:
        server.start()
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    service.start(config.refit_seconds, config.update_seconds)
    log.info("serving", extra={"url": server.url, "targets": len(config.target_configs)})
    with stop_on_signals() as stop:
        stop.wait()
    shut_down(service, source, server)
    return 0


def shut_down(service: PredictorService, source: PrometheusClient, server: HTTPServer) -> None:
    """Stop after SIGTERM or SIGINT, logged as the other components do: ``stopping`` at once,
    ``stopped`` once the jobs (a running refit finishes first), the Prometheus client and the
    HTTP server are closed."""
    log.info("stopping")
    started = time.monotonic()
    service.stop()
    source.close()
    server.stop()
    fitted = sum(1 for state in service.targets.values() if state.models)
    log.info(
        "stopped",
        extra={
            "targets": len(service.targets),
            "fitted": fitted,
            "seconds": round(time.monotonic() - started, 3),
        },
    )


# -- backtest ----------------------------------------------------------------------------------
def _backtest_parser() -> argparse.ArgumentParser:
    p = OneLineErrorParser(
        prog=f"{PROG} backtest",
        description="score every model on a CSV series with a rolling-origin backtest",
    )
    add_version_argument(p)
    p.add_argument("--csv", required=True, help="CSV file (rows of events or of samples)")
    p.add_argument("--time-column", required=True, help="column with timestamps")
    p.add_argument("--value-column", help="column with values (not needed for --aggregate count)")
    p.add_argument("--freq", required=True, help="bin size as a pandas offset: 10s, 15min, 1h")
    p.add_argument("--horizon", type=int, required=True, help="largest horizon, in bins")
    p.add_argument(
        "--aggregate",
        choices=("count", "sum", "mean", "last"),
        default=None,
        help="how rows become bins (default: count without --value-column, else mean)",
    )
    p.add_argument(
        "--quantile",
        type=finite_float_argument("--quantile"),
        default=0.9,
        help="upper-bound quantile (default: 0.9)",
    )
    p.add_argument(
        "--test-size",
        default="0.2",
        help="test window: a fraction of the bins (0.2), a bin count (168) or a duration (7d)",
    )
    p.add_argument("--seasons", default="1d,1w", help="seasons to try, comma-separated")
    p.add_argument("--models", default="", help="only these non-baseline models (comma list)")
    p.add_argument("--refit-every", type=int, default=0, help="refit every N bins (0: never)")
    p.add_argument("--json", help="write the results as JSON to this path")
    return p


def test_size_bins(text: str, n_bins: int, step_seconds: float) -> int:
    """Bins in the test window from a fraction, a count or a duration."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None and 0 < value < 1:
        bins = int(n_bins * value)
    elif value is not None and value >= 1 and value.is_integer():
        bins = int(value)
    else:
        bins = int(parse_duration(text, "--test-size") // step_seconds)
    return bins


def backtest_main(argv: Sequence[str]) -> int:
    args = _backtest_parser().parse_args(argv)
    import torch

    torch.set_num_threads(1)
    try:
        report = run_backtest(args)
    except (ConfigError, ValueError, KeyError, OSError) as exc:
        print(f"{PROG} backtest: error: {exc}", file=sys.stderr)
        return 2
    selection, results = report
    print(format_table(selection, results))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(backtest_json(selection, results), indent=2) + "\n")
    return 0


def load_csv_series(
    path: str,
    time_column: str,
    freq: str,
    value_column: str | None = None,
    aggregate: Aggregate | None = None,
) -> pd.Series:
    """Read a CSV and bin it into a regular, gap-free series."""
    import pandas as pd

    from predictor.series import bin_events, fill_gaps

    columns = [time_column] + ([value_column] if value_column else [])
    try:
        frame = pd.read_csv(path, usecols=columns)
    except ValueError as exc:
        raise ConfigError(f"{path}: {exc}; check --time-column/--value-column") from exc
    aggregate = aggregate or ("mean" if value_column else "count")
    times = pd.to_datetime(frame[time_column], errors="coerce")
    if times.isna().all():
        raise ConfigError(f"{path}: column {time_column!r} holds no parseable timestamps")
    keep = times.notna()
    values = frame[value_column][keep] if value_column else None
    binned = bin_events(times[keep], freq, values, aggregate)
    return pd.Series(fill_gaps(binned.to_numpy()), index=binned.index)


def run_backtest(args: argparse.Namespace) -> tuple[Selection, dict[str, BacktestResult]]:
    import pandas as pd

    from predictor.backtest import rolling_origin
    from predictor.models import candidate_factories, shortest_cycle
    from predictor.selection import select_model

    series = load_csv_series(
        args.csv, args.time_column, args.freq, args.value_column, args.aggregate
    )
    step = pd.Timedelta(args.freq).total_seconds()
    y = series.to_numpy()
    test = test_size_bins(args.test_size, len(y), step)
    if args.horizon < 1:
        raise ConfigError("--horizon must be >= 1")
    if not 2 * args.horizon <= test < len(y) - 10:
        raise ConfigError(
            f"test window of {test} bins does not fit {len(y)} bins; "
            f"it needs at least 2 x horizon and must leave 10 bins of history"
        )
    if not 0 < args.quantile < 1:
        raise ConfigError("--quantile must be in (0, 1)")
    seasons = [parse_duration(s, "--seasons") for s in args.seasons.split(",") if s.strip()]
    include = [m.strip() for m in args.models.split(",") if m.strip()]
    horizons = list(range(1, args.horizon + 1))
    test_start = len(y) - test
    history = y[:test_start]
    factories = candidate_factories(step, seasons, args.horizon, len(history), include)
    cycle = shortest_cycle(step, seasons, len(history))
    selection = select_model(factories, history, horizons, args.quantile, cycle=cycle)
    results: dict[str, BacktestResult] = {}
    for name, factory in factories.items():
        try:
            results[name] = rolling_origin(
                factory, y, horizons, test_start, args.quantile, args.refit_every
            )
        except ValueError as exc:
            log.warning("model left out", extra={"model": name, "error": str(exc)})
    return selection, results


def backtest_json(selection: Selection, results: dict[str, BacktestResult]) -> dict:
    return {
        "selected": selection.overall,
        "selected_by_horizon": {str(h): m for h, m in selection.per_horizon.items()},
        "models": {name: r.as_json() for name, r in results.items()},
    }


def format_table(selection: Selection, results: dict[str, BacktestResult]) -> str:
    lines = []
    for name, r in results.items():
        mark = " (selected)" if name == selection.overall else ""
        lines.append(
            f"{name}{mark}: fit {r.fit_seconds:.3f} s, update {r.update_seconds * 1000:.3f} ms"
        )
        lines.append(f"  {'horizon':>8} {'WAPE%':>8} {'sMAPE%':>8} {'under%':>8} {'cover%':>8}")
        for h in r.horizons:
            lines.append(
                f"  {h:>8} {_fmt(r.wape[h])} {_fmt(r.smape[h])} "
                f"{_fmt(r.under_rate[h])} {_fmt(r.coverage[h])}"
            )
    chosen = ", ".join(f"h{h}: {m}" for h, m in selection.per_horizon.items())
    lines.append(f"selected: {selection.overall} (by horizon: {chosen})")
    return "\n".join(lines)


def _fmt(value: float) -> str:
    return f"{value:8.1f}" if math.isfinite(value) else f"{'-':>8}"


if __name__ == "__main__":
    raise SystemExit(main())
