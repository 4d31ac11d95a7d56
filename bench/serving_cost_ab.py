"""What one request costs the server, two source trees side by side: an A/B for the serving path.

Two ``autoglm-batcher`` processes run at once, one from each tree (``--old``: a directory, or a
git revision exported to a temporary one; ``--new``: this checkout by default), serving the same
model (``bench.reference_mlp:identity`` by default: the reference MLP's signature with no work in
it, so what is measured is the serving path alone). Each round sends every way in (REST JSON,
REST binary, gRPC) to each server in turn, one open-loop point at ``--rate`` each, alternating
old and new, so a machine whose load drifts hits both alike; the figure is **server CPU
microseconds per answered request** (user + system of the process, from ``/proc``), per round
and as the median over the rounds, with the per-round new/old ratio.

    python bench/serving_cost_ab.py --old HEAD                 # this tree against its last commit
    python bench/serving_cost_ab.py --old /tmp/a --new /tmp/b --modes grpc --rounds 5
    python bench/serving_cost_ab.py --old HEAD --smoke         # proves it runs (the slow tests)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.batcher_process import BatcherProcess  # noqa: E402
from bench.batcher_serving import (  # noqa: E402
    BATCHER_MODES,
    MODEL_NAME,
    Served,
    Target,
    loadavg,
    targets_for,
    warm_rate,
)
from bench.report_json import write_report  # noqa: E402

IDENTITY = "bench.reference_mlp:identity"
RESULTS = ROOT / "bench" / "results" / "serving_cost_ab.json"


class TreeServer(Served):
    """A batcher run from ``root``'s sources, HTTP and gRPC on free ports."""

    def __init__(self, root: Path, model: str, extra: list[str]) -> None:
        self.name = root.name
        process = BatcherProcess(
            [
                *("--model", model, "--model-name", MODEL_NAME),
                *("--device", "cpu", "--torch-threads", "1"),
                *("--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"),
                *extra,
            ],
            root=root,
        )
        self.proc = process.proc
        self.http_port = process.port
        grpc = process.startup_record("serving grpc")
        self.grpc_port = int(grpc["port"]) if grpc else 0


def export_revision(revision: str, into: Path) -> Path:
    """The tree of ``revision`` (``git archive``) under ``into``; the repository is untouched."""
    folder = into / revision.replace("/", "_")
    folder.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", revision],
        check=True,
        capture_output=True,
    ).stdout
    with tempfile.TemporaryFile() as raw:
        raw.write(archive)
        raw.seek(0)
        with tarfile.open(fileobj=raw) as tar:
            tar.extractall(folder, filter="data")
    return folder


Way = tuple[str, str]  # (server name, mode: one of bench.batcher_serving's ways in)


async def interleaved_rounds(
    servers: Mapping[str, Served],
    ways: Sequence[Way],
    rounds: int,
    rate: float,
    seconds: float,
) -> tuple[dict[Way, list[float]], dict[Way, int]]:
    """Per way, the server CPU microseconds per answered request of each round's open-loop
    point, and the failed requests of all rounds. Connections are opened and every path warmed
    first; the ways take turns in ``ways``' order on odd rounds and reversed on even ones, so a
    machine whose load drifts hits each alike."""
    targets: dict[Way, Target] = {}
    closers = []
    for name, server in servers.items():
        modes = tuple(mode for named, mode in ways if named == name)
        found, close = await targets_for(server, None, modes)  # type: ignore[arg-type]
        closers.append(close)
        targets.update({(name, mode): found[mode] for mode in modes})
    costs: dict[Way, list[float]] = {way: [] for way in ways}
    failed = dict.fromkeys(ways, 0)
    try:
        for target in targets.values():
            await target.point(warm_rate(rate), 1.0, 1.0, seed=0)
        for index in range(1, rounds + 1):
            before = loadavg()
            for way in ways if index % 2 else reversed(ways):
                point = await targets[way].point(rate, seconds, 1.0, seed=index)
                micros = 1e6 * point["server_cpu_seconds"] / max(1, point["answered"])
                costs[way].append(micros)
                failed[way] += point["failures"]
                print(
                    f"  round {index} {way[0]:<18} {way[1]:<12} {micros:7.0f} us/req  "
                    f"p99 {point['p99_ms']:7.1f} ms  failed {point['failures']}",
                    flush=True,
                )
            print(f"round {index}: load average {before} -> {loadavg()}", flush=True)
    finally:
        for close in closers:
            await close()
    return costs, failed


def round_arguments(parser: argparse.ArgumentParser, results: Path) -> None:
    """The options of a bench of :func:`interleaved_rounds` (``--smoke``: see
    :func:`smoke_rounds`)."""
    parser.add_argument("--rate", type=float, default=400.0, help="requests per second per point")
    parser.add_argument("--seconds", type=float, default=4.0, help="per point")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="one short round: proves it runs")
    parser.add_argument("--json", type=Path, default=results)


def smoke_rounds(args: argparse.Namespace) -> None:
    """With ``--smoke``, one short, slow round: the slow tests prove the bench runs."""
    if args.smoke:
        args.rounds, args.seconds, args.rate = 1, 0.5, 50.0


def summary(costs: dict[str, dict[str, list[float]]]) -> dict[str, dict]:
    """Per mode the median cost of each tree and the new/old ratio of each round."""
    out = {}
    for mode, by_tree in costs.items():
        ratios = [n / o for o, n in zip(by_tree["old"], by_tree["new"], strict=True) if o > 0]
        out[mode] = {
            "old_us_per_request": by_tree["old"],
            "new_us_per_request": by_tree["new"],
            "old_median": statistics.median(by_tree["old"]),
            "new_median": statistics.median(by_tree["new"]),
            "new_over_old_per_round": ratios,
            "new_over_old_median": statistics.median(ratios) if ratios else float("nan"),
        }
    return out


def print_summary(result: dict[str, dict]) -> None:
    print(f"{'way in':<12} {'old us/req':>12} {'new us/req':>12} {'new/old per round':>24}")
    for mode, row in result.items():
        ratios = row["new_over_old_per_round"] or [float("nan")]
        print(
            f"{mode:<12} {row['old_median']:>12.0f} {row['new_median']:>12.0f} "
            f"{row['new_over_old_median']:>10.2f} ({min(ratios):.2f}-{max(ratios):.2f})"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--old", required=True, help="a source directory or a git revision")
    parser.add_argument("--new", type=Path, default=ROOT, help="a source directory")
    parser.add_argument("--modes", default=",".join(BATCHER_MODES))
    parser.add_argument("--model", default=IDENTITY)
    parser.add_argument("--max-batch-size", type=int, default=128)
    round_arguments(parser, RESULTS)
    args = parser.parse_args(argv)
    smoke_rounds(args)
    modes = tuple(m for m in args.modes.split(",") if m)
    unknown = [m for m in modes if m not in BATCHER_MODES]
    if unknown or not modes:
        parser.error(f"--modes takes {','.join(BATCHER_MODES)}; got {args.modes!r}")
    extra = [
        *("--max-batch-size", str(args.max_batch_size), "--max-queue", "4096"),
        *("--warmup-repeats", "1"),
    ]
    with tempfile.TemporaryDirectory(prefix="serving-ab-") as scratch:
        old = Path(args.old)
        if not old.is_dir():
            try:
                old = export_revision(args.old, Path(scratch))
            except subprocess.CalledProcessError:
                parser.error(f"--old {args.old!r} is neither a directory nor a git revision")
        trees = {"old": old, "new": args.new.resolve()}
        servers: dict[str, TreeServer] = {}
        try:
            for label, root in trees.items():
                servers[label] = TreeServer(root, args.model, extra)
            print(f"old: {trees['old']}  new: {trees['new']}  model {args.model}, {args.rate}/s")
            load_before = loadavg()
            ways = [(label, mode) for mode in modes for label in servers]
            by_way, _ = asyncio.run(
                interleaved_rounds(servers, ways, args.rounds, args.rate, args.seconds)
            )
        finally:
            for server in servers.values():
                server.stop()
    load_after = loadavg()
    print(f"server CPU per answered request, load average {load_before} -> {load_after}")
    result = summary({m: {t: by_way[t, m] for t in trees} for m in modes})
    print_summary(result)
    report = {
        "old": str(trees["old"]) if Path(args.old).is_dir() else args.old,
        "new": str(trees["new"]),
        "model": args.model,
        "rate": args.rate,
        "seconds_per_point": args.seconds,
        "rounds": args.rounds,
        "smoke": args.smoke,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "modes": result,
    }
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
