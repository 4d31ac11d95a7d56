"""``autoglm up``: the whole loop on one machine, then a summary and an HTML report.

    autoglm up                                  # until Ctrl-C, live terminal view
    autoglm up --duration 300 --no-tui          # five minutes, structured log lines
    autoglm up --profile trace                  # the Alibaba GenAI trace instead of the ramp
    autoglm up --no-job                         # online load only, no best-effort backlog

Exit codes: 0 after a clean run (Ctrl-C included); 2 for a bad flag, a taken port or a report
directory that cannot be written (one line on stderr, nothing started); 1 when the stack failed
to start.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence

from autoglm.config import ConfigError, load_config
from autoglm.logs import setup_logging
from autoglm.signals import stop_on_signals
from stack.config import UpConfig
from stack.port_plan import check_ports
from stack.prometheus import binary_on_path
from stack.report import check_report_dir, summary_lines, write_report
from stack.view import LogView, TerminalView, View

PROG = "autoglm up"
LOG_FILE = "autoglm-up.log"
DESCRIPTION = (
    "Run the exporter, batcher workers, Prometheus, predictor and autoscaler on this machine "
    "under a replayed online load and a best-effort job; show them live, then write a summary "
    "and an HTML report."
)
EXIT_USAGE = 2
EXIT_FAILED = 1

log = logging.getLogger("autoglm.up")


def main(argv: Sequence[str] | None = None) -> int:
    try:
        cfg = load_config(UpConfig, argv, prog=PROG, description=DESCRIPTION)
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    tui = cfg.tui and sys.stdout.isatty()
    try:
        report_dir = check_report_dir(cfg.report_dir)
        # Before the stack's imports take seconds; the stack checks again as it starts.
        check_ports(cfg, with_prometheus=cfg.prometheus and binary_on_path() is not None)
    except ConfigError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    saved_stderr: int | None = None
    if tui:
        # The live view owns the terminal: this process's and the workers' log lines (the
        # workers inherit file descriptor 2) go to a file in the report directory instead.
        log_fd = os.open(report_dir / LOG_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        saved_stderr = os.dup(2)
        os.dup2(log_fd, 2)
        os.close(log_fd)
    setup_logging("up", cfg.log_level, cfg.log_format)

    def make_view(notices: list[str]) -> View:
        if tui:
            return TerminalView(
                cfg.target_utilization,
                cfg.slo_seconds,
                cfg.max_workers,
                cfg.peak_rps,
                notices,
                cfg.sizing,
            )
        return LogView()

    # Imported here: the stack loads torch and the predictor's models, which --help need not.
    from stack.stack import Stack, Stopped

    stack = Stack(cfg, make_view)
    if tui:
        print(
            f"{PROG}: starting the exporter, predictor, autoscaler and {cfg.min_workers} batcher "
            f"worker(s); the live view appears once a worker has loaded its model "
            f"(logs: {report_dir / LOG_FILE})"
        )
    error, code = "", 0
    try:
        # The handlers stay until close() is done, so a second Ctrl-C cannot cut the cleanup.
        with stop_on_signals() as stop:
            try:
                try:
                    stack.start(stop)
                except ConfigError as exc:
                    error, code = f"{PROG}: error: {exc}", EXIT_USAGE
                except Stopped:
                    error = f"{PROG}: stopped before the load started"
                except Exception as exc:
                    log.exception("start failed")
                    error, code = f"{PROG}: error: could not start the stack: {exc}", EXIT_FAILED
                if not error:
                    stack.run(stop)
                    log.info(
                        "stopping", extra={"reason": "signal" if stop.is_set() else "duration"}
                    )
            finally:
                stack.close()
    finally:
        if saved_stderr is not None:
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
    if error:
        print(error, file=sys.stderr)
        return code
    summary = stack.summary()
    report = write_report(report_dir, stack.samples, stack.events, summary)
    print(f"\n{PROG}: summary after {summary.duration_seconds:.0f} s")
    for line in summary_lines(summary):
        print(f"  {line}")
    print(f"  report            {report}")
    if tui:
        print(f"  logs              {report_dir / LOG_FILE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
