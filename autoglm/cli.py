"""``autoglm``: the umbrella command. ``autoglm <component> ...`` runs that component's CLI."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

from autoglm.pipes import stdout_may_close
from autoglm.version import package_version

COMPONENTS = {
    "up": ("stack.cli", "the whole loop on this machine: GPUs, workers, forecasts, scaling"),
    "exporter": ("exporter.cli", "NVML-backed, dcgm-exporter-compatible Prometheus exporter"),
    "batcher": ("batcher.cli", "dynamic batching runtime for torch models (KServe v2)"),
    "predictor": ("predictor.cli", "forecasts with prediction intervals, selected by backtest"),
    "autoscaler": ("autoscaler.cli", "HPA-exact predictive autoscaler, local mode and simulator"),
    "job": ("jobs.cli", "batch inference job on idle capacity: a JSONL file, resumable"),
    "datasets": ("autoglm.datasets.cli", "public traces: list, fetch into a cache, verify, locate"),
}


@stdout_may_close
def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print("usage: autoglm <component> [args...]\n       autoglm --version\n\ncomponents:")
        for name, (_, summary) in COMPONENTS.items():
            print(f"  {name:<12} {summary}")
        print("\n`autoglm <component> --help` lists a component's flags.")
        return 0 if args else 2
    if args[0] == "--version":
        print(f"autoglm {package_version()}")
        return 0
    name, rest = args[0], args[1:]
    if name not in COMPONENTS:
        print(
            f"autoglm: error: unknown component {name!r}; choose one of: {', '.join(COMPONENTS)}",
            file=sys.stderr,
        )
        return 2
    module = importlib.import_module(COMPONENTS[name][0])
    return module.main(rest) or 0


if __name__ == "__main__":
    raise SystemExit(main())
