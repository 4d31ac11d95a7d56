"""/metrics latency of the exporter against the prometheus_client floor, side by side.

Two servers run in their own processes on 127.0.0.1, each exposing the same series with the same
labels (8 simulated GPUs, every GPU attributed to a pod, GPU 0 time-sliced by two pods):

* ``exporter``: the real ExporterService (HTTP server, collector, pre-rendered exposition);
* ``floor``: prometheus_client's own ``start_http_server`` serving a registry of plain gauges
  built from the exporter's output (so series, labels and values match);
* ``floor-nodelay``: the same with TCP_NODELAY on its connections. Python's ``http.server`` writes
  the headers and the body in two sends, so without it Nagle's algorithm meets the client's
  delayed ACK and most responses wait ~40 ms; this floor shows what prometheus_client costs
  once that stall is gone, and the goal ratio is taken against it (the stricter of the two).

Four scraper threads, each with its own ``requests`` session, scrape a bounded number of times;
rounds alternate between the servers so drift on a shared machine hits both. Two header sets:
what ``requests`` sends (text, gzip) and what Prometheus sends (OpenMetrics, gzip). A third
process runs the exporter idle for a while to measure the collection loop's CPU seconds per wall
second. Prints a table and writes JSON.

    python bench/exporter.py [--scrapes 300] [--rounds 2] [--json bench/results/exporter.json]
    python bench/exporter.py --smoke   # a few scrapes, one round: proves the bench runs (tests)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

GPUS = 8
KINDS = ("exporter", "floor", "floor-nodelay")
SCRAPERS = 4
HEADERS = {
    "requests default (text)": {"Accept": "*/*", "Accept-Encoding": "gzip, deflate"},
    "prometheus (openmetrics)": {
        "Accept": "application/openmetrics-text;version=1.0.0,application/openmetrics-text;"
        "version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1",
        "Accept-Encoding": "gzip",
    },
}


class StaticPods:
    """Every GPU used by one pod; GPU 0 time-sliced by two."""

    healthy = True
    last_success = time.time()

    def __init__(self, uuids: list[str]) -> None:
        from exporter.podresources import PodRef

        self._map = {u: [PodRef("inference", f"llm-{i}", "server")] for i, u in enumerate(uuids)}
        self._map[uuids[0]].append(PodRef("inference", "llm-shared", "server"))

    def attribution(self) -> dict:
        return self._map


def _exporter_service(interval: float = 1.0):
    from exporter.service import ExporterService
    from exporter.sources import SimulatedSource, load_profile

    source = SimulatedSource(
        gpus=GPUS, model="NVIDIA H100 80GB HBM3", seed=7, profile=load_profile("constant:0.6")
    )
    pods = StaticPods([d.uuid for d in source.devices()])
    service = ExporterService(
        source,
        listen="127.0.0.1:0",
        hostname="bench-node",
        interval=interval,
        deadline=0.8 * interval,
        pods=pods,
    )
    return service, source


def serve_exporter() -> None:
    service, source = _exporter_service()
    service.start()
    while service.exposition is None:
        time.sleep(0.01)
    print(service.server.port, flush=True)
    sys.stdin.read()  # until the parent closes our stdin
    service.stop()
    source.close()


def serve_floor(nodelay: bool) -> None:
    """prometheus_client with plain gauges holding the exporter's series, labels and values."""
    import socketserver

    from prometheus_client import CollectorRegistry, Gauge, start_http_server

    socketserver.StreamRequestHandler.disable_nagle_algorithm = nodelay
    from prometheus_client.parser import text_string_to_metric_families

    service, source = _exporter_service()
    service.start()
    while service.exposition is None:
        time.sleep(0.01)
    text = service.exposition.text.decode()
    service.stop()
    source.close()
    registry = CollectorRegistry()
    by_name: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            by_name.setdefault(sample.name, []).append((family.documentation, sample))
    for name, items in by_name.items():
        labelnames = sorted({k for _, s in items for k in s.labels})
        gauge = Gauge(name, items[0][0] or name, labelnames, registry=registry)
        for _, sample in items:
            values = [sample.labels.get(k, "") for k in labelnames]
            (gauge.labels(*values) if labelnames else gauge).set(sample.value)
    server, thread = start_http_server(0, addr="127.0.0.1", registry=registry)
    print(server.server_port, flush=True)
    sys.stdin.read()
    server.shutdown()
    thread.join()


def measure_collector_cpu(seconds: float) -> dict[str, float]:
    """CPU seconds per wall second of a process that only collects (HTTP idle, no scrapes)."""
    service, source = _exporter_service()
    service.start()
    while service.exposition is None:
        time.sleep(0.01)
    cpu0, wall0 = time.process_time(), time.monotonic()
    first = service.collector.latest
    time.sleep(seconds)
    cpu, wall = time.process_time() - cpu0, time.monotonic() - wall0
    last = service.collector.latest
    service.stop()
    source.close()
    assert first is not None and last is not None
    return {
        "seconds": round(wall, 2),
        "collections": last.collections_total - first.collections_total,
        "cpu_seconds_per_wall_second": cpu / wall,
        "last_collection_duration_seconds": last.duration_seconds,
    }


class Server:
    def __init__(self, kind: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, __file__, "--serve", kind],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO_ROOT,
        )
        assert self.process.stdout is not None
        self.url = f"http://127.0.0.1:{int(self.process.stdout.readline())}/metrics"

    def stop(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def scrape(url: str, headers: dict[str, str], per_thread: int) -> tuple[list[float], int]:
    """Latencies (seconds) of ``SCRAPERS`` threads x ``per_thread`` scrapes; body size."""
    import requests

    latencies: list[float] = []
    sizes: list[int] = []
    lock = threading.Lock()

    def worker() -> None:
        with requests.Session() as session:
            mine = []
            for _ in range(per_thread):
                t0 = time.perf_counter()
                reply = session.get(url, headers=headers, timeout=10)
                _ = reply.content
                mine.append(time.perf_counter() - t0)
                if reply.status_code != 200:
                    raise RuntimeError(f"{url}: HTTP {reply.status_code}")
            with lock:
                latencies.extend(mine)
                sizes.append(int(reply.headers["Content-Length"]))

    threads = [threading.Thread(target=worker) for _ in range(SCRAPERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return latencies, max(sizes)


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=1000, method="inclusive")[int(q * 1000) - 1]


def run(scrapes: int, rounds: int, cpu_seconds: float) -> dict:
    servers = {kind: Server(kind) for kind in KINDS}
    results: dict = {"gpus": GPUS, "scrapers": SCRAPERS, "scrapes_per_scraper": scrapes,
                     "rounds": rounds, "scenarios": {}}  # fmt: skip
    try:
        for name, headers in HEADERS.items():
            lat: dict[str, list[float]] = {kind: [] for kind in KINDS}
            size: dict[str, int] = {}
            for server in servers.values():  # warm up connections and caches
                scrape(server.url, headers, 10)
            for _ in range(rounds):
                for kind, server in servers.items():
                    got, size[kind] = scrape(server.url, headers, scrapes)
                    lat[kind] += got
            row = {}
            for kind in servers:
                row[kind] = {
                    "p50_ms": percentile(lat[kind], 0.5) * 1e3,
                    "p99_ms": percentile(lat[kind], 0.99) * 1e3,
                    "mean_ms": statistics.fmean(lat[kind]) * 1e3,
                    "scrapes": len(lat[kind]),
                    "body_bytes_on_wire": size[kind],
                }
            for floor in KINDS[1:]:
                for q in ("p50", "p99"):
                    ratio = row["exporter"][f"{q}_ms"] / row[floor][f"{q}_ms"]
                    row[f"{q}_ratio_exporter_over_{floor}"] = ratio
            results["scenarios"][name] = row
    finally:
        for server in servers.values():
            server.stop()
    results["collector_cpu"] = measure_collector_cpu(cpu_seconds)
    return results


def print_table(results: dict) -> None:
    scrapes = results["scrapes_per_scraper"] * results["rounds"]
    print(
        f"/metrics latency, {results['gpus']} simulated GPUs with pod labels, "
        f"{results['scrapers']} concurrent scrapers x {scrapes} scrapes per server"
    )
    header = (
        f"{'scenario':<26} {'server':<22} {'p50 ms':>8} {'p99 ms':>8} {'mean ms':>8} {'wire B':>7}"
    )
    print(header)
    print("-" * len(header))
    for name, row in results["scenarios"].items():
        for kind in KINDS:
            r = row[kind]
            print(
                f"{name:<26} {kind:<22} {r['p50_ms']:>8.3f} {r['p99_ms']:>8.3f} "
                f"{r['mean_ms']:>8.3f} {r['body_bytes_on_wire']:>7}"
            )
        for floor in KINDS[1:]:
            p50 = row[f"p50_ratio_exporter_over_{floor}"]
            p99 = row[f"p99_ratio_exporter_over_{floor}"]
            print(f"{'':<26} {'ratio / ' + floor:<22} {p50:>8.2f} {p99:>8.2f}")
    print("ratio = exporter / floor; goal: exporter p99 <= 1.5 x floor p99")
    cpu = results["collector_cpu"]
    print(
        f"collection loop: {cpu['cpu_seconds_per_wall_second']:.4f} CPU s per wall s over "
        f"{cpu['seconds']} s ({cpu['collections']} collections, last took "
        f"{cpu['last_collection_duration_seconds'] * 1e3:.2f} ms)"
    )


SMOKE = {"scrapes": 15, "rounds": 1, "cpu_seconds": 2.0}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=300, help="scrapes per scraper per round")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds per server")
    parser.add_argument("--cpu-seconds", type=float, default=10.0, help="collector CPU window")
    parser.add_argument("--json", default=str(REPO_ROOT / "bench/results/exporter.json"))
    parser.add_argument("--smoke", action="store_true", help="tiny run, figures meaningless")
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.smoke:
        vars(args).update(SMOKE)
    if args.serve == "exporter":
        serve_exporter()
        return
    if args.serve in ("floor", "floor-nodelay"):
        serve_floor(nodelay=args.serve == "floor-nodelay")
        return
    results = run(args.scrapes, args.rounds, args.cpu_seconds)
    print_table(results)
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
