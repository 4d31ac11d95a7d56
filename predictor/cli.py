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
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from autoglm.config import (
    ConfigError,
    OneLineErrorParser,
    add_config_arguments,
    check_can_listen,
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
    # Every check a setting can fail runs before torch and the models load (seconds), so a
    # busy port, a bad web config or an unreadable token file answers at once.
    from autoglm.webconfig import WebConfig

    try:
        check_can_listen(config.listen)
        web_config = WebConfig.load(config.web_config_file or None)
        source = config.prometheus_client(config.timeout_seconds)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2

    import torch

    from autoglm.web.exposition import registry_route
    from autoglm.web.server import HTTPServer
    from predictor.metrics import PredictorMetrics
    from predictor.service import PredictorService

    torch.set_num_threads(config.torch_threads)
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
    except ConfigError as exc:  # the port was taken after check_can_listen
        source.close()
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
    kind, value = parse_test_size(text)
    if kind == "fraction":
        return int(n_bins * value)
    if kind == "bins":
        return int(value)
    return int(value // step_seconds)


def parse_test_size(text: str) -> tuple[str, float]:
    """``("fraction", 0.2)``, ``("bins", 168)`` or ``("seconds", 604800)`` from --test-size."""
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None and math.isfinite(value):
        if 0 < value < 1:
            return "fraction", value
        if value >= 1 and value.is_integer():
            return "bins", value
    try:
        return "seconds", parse_duration(text, "--test-size")
    except ConfigError:
        raise ConfigError(
            f"--test-size {text!r} is not a test window; give a fraction of the bins (0.2), "
            "a bin count (168) or a duration (7d)"
        ) from None


def check_backtest_args(args: argparse.Namespace) -> float:
    """Check every flag that needs no data; the bin size in seconds. Run before torch loads and
    the CSV is read, so a bad flag answers at once, and before the backtest, so a --json path
    that cannot be written does not lose its result."""
    import pandas as pd

    csv = Path(args.csv)
    if not csv.is_file():
        problem = "is a directory" if csv.is_dir() else "no such file"
        raise ConfigError(f"--csv {args.csv!r}: {problem}; give the path of a CSV file")
    try:
        step = pd.Timedelta(args.freq).total_seconds()
        pd.tseries.frequencies.to_offset(args.freq)  # what resampling takes
    except (ValueError, TypeError, OverflowError):
        raise ConfigError(
            f"--freq {args.freq!r} is not a bin size; use a pandas offset like 10s, 15min, 1h"
        ) from None
    if not step > 0:
        raise ConfigError(f"--freq {args.freq!r}: a bin must be longer than 0; e.g. 10s, 1h")
    if args.horizon < 1:
        raise ConfigError(f"--horizon must be >= 1 bin, got {args.horizon}")
    if not 0 < args.quantile < 1:
        raise ConfigError(f"--quantile must be in (0, 1), got {args.quantile:g}; e.g. 0.9")
    if args.refit_every < 0:
        raise ConfigError(f"--refit-every must be >= 0 (0: never), got {args.refit_every}")
    parse_test_size(args.test_size)
    seasons = backtest_seasons(args.seasons)
    from predictor.model_names import known_models

    known = known_models(seasons)
    unknown = [m for m in backtest_models(args.models) if m not in known]
    if unknown:
        raise ConfigError(
            f"--models: unknown model {unknown[0]!r}; choose from: {', '.join(known)}"
        )
    if args.json:
        check_writable(args.json, "--json")
    return step


def backtest_seasons(text: str) -> list[float]:
    return [parse_duration(s.strip(), "--seasons") for s in text.split(",") if s.strip()]


def backtest_models(text: str) -> list[str]:
    return [m.strip() for m in text.split(",") if m.strip()]


def check_writable(path: str, flag: str) -> None:
    """:class:`ConfigError` naming ``flag`` unless a file can be written at ``path``; makes its
    folder."""
    target = Path(path)
    if target.is_dir():
        raise ConfigError(f"{flag} {path!r} is a directory; give a file path, e.g. {path}/out.json")
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
    except (OSError, ValueError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(f"{flag} {path!r}: cannot make its folder ({reason})") from None
    writable = os.access(target, os.W_OK) if target.exists() else os.access(target.parent, os.W_OK)
    if not writable:
        raise ConfigError(f"{flag} {path!r}: permission denied; give a path you can write")


def backtest_main(argv: Sequence[str]) -> int:
    args = _backtest_parser().parse_args(argv)
    try:
        step = check_backtest_args(args)
    except ConfigError as exc:
        print(f"{PROG} backtest: error: {exc}", file=sys.stderr)
        return 2
    import torch

    torch.set_num_threads(1)
    try:
        report = run_backtest(args, step)
    except (ConfigError, ValueError, KeyError, OSError) as exc:
        print(f"{PROG} backtest: error: {exc}", file=sys.stderr)
        return 2
    selection, results = report
    print(format_table(selection, results))
    if args.json:
        try:
            Path(args.json).write_text(
                json.dumps(backtest_json(selection, results), indent=2) + "\n"
            )
        except OSError as exc:
            print(
                f"{PROG} backtest: error: cannot write --json {args.json!r}: {exc.strerror}",
                file=sys.stderr,
            )
            return 1
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
    except FileNotFoundError as exc:
        raise ConfigError(f"--csv {path!r}: no such file; give the path of a CSV file") from exc
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


def run_backtest(
    args: argparse.Namespace, step: float
) -> tuple[Selection, dict[str, BacktestResult]]:
    """The backtest the flags ask for, once :func:`check_backtest_args` has passed them (and
    given ``step``, the bin size in seconds)."""
    from predictor.backtest import rolling_origin
    from predictor.models import candidate_factories, shortest_cycle
    from predictor.selection import select_model

    series = load_csv_series(
        args.csv, args.time_column, args.freq, args.value_column, args.aggregate
    )
    y = series.to_numpy()
    test = test_size_bins(args.test_size, len(y), step)
    if not 2 * args.horizon <= test < len(y) - 10:
        raise ConfigError(
            f"test window of {test} bins does not fit {len(y)} bins; "
            f"it needs at least 2 x horizon and must leave 10 bins of history"
        )
    seasons = backtest_seasons(args.seasons)
    include = backtest_models(args.models)
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
