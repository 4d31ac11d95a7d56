"""``autoglm job run`` (also ``autoglm-job run``): a batch inference job on the fleet's idle GPUs.

    autoglm job run --input requests.jsonl --output answers.jsonl \\
        --endpoint http://open-autoglm-batcher:8000 --model demo

Settings are checked before any work (exit 2 with one line). SIGTERM and Ctrl-C stop the run
after a short drain; running the same command again resumes where it stopped. Exit codes are
listed in :mod:`jobs.runner`.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from prometheus_client import CollectorRegistry

from autoglm.config import EXIT_USAGE, ConfigError, load_config
from autoglm.logs import setup_logging
from autoglm.signals import stop_on_signals
from autoglm.version import package_version
from autoglm.web.exposition import registry_route
from autoglm.web.server import HTTPServer
from autoglm.webconfig import WebConfig
from jobs.config import JobConfig
from jobs.runner import run_job

PROG = "autoglm job"
USAGE = f"usage: {PROG} run [flags]   (see {PROG} run --help)"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE + "\n\nrun    drive a JSONL file of v2 requests through a batcher endpoint")
        return 0 if args else EXIT_USAGE
    if args[0] == "--version":
        print(f"{PROG} {package_version()}")
        return 0
    if args[0] != "run":
        print(f"{PROG}: error: unknown command {args[0]!r}; {USAGE}", file=sys.stderr)
        return EXIT_USAGE
    return run(args[1:])


def run(argv: Sequence[str]) -> int:
    prog = f"{PROG} run"
    config = load_config(
        JobConfig,
        argv,
        prog=prog,
        description="Drive a JSONL file of KServe v2 requests through a batcher endpoint as "
        "best-effort traffic, resumably.",
    )
    setup_logging("job", config.log_level, config.log_format)
    registry = CollectorRegistry()
    server = None
    try:
        if config.metrics_listen:
            server = HTTPServer(
                config.metrics_listen,
                {"/metrics": registry_route(registry)},
                web_config=WebConfig.load(config.web_config_file or None),
                component="job",
                registry=registry,
            )
            server.start()
        with stop_on_signals() as stop:
            summary = run_job(config, stop=stop, registry=registry)
    except ConfigError as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if server is not None:
            server.stop()
    return summary.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
