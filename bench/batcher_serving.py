"""What serving costs: REST JSON, REST binary tensor data and gRPC, side by side in one run.

One ``autoglm-batcher`` process serves the reference MLP (512 -> 2048 -> 2048 -> 512, torch CPU,
one torch thread) on HTTP and gRPC at once. The same closed-loop load (``--concurrency`` requests
always in flight, one row each) is driven through each protocol in turn, interleaved round by
round (JSON, binary, gRPC, JSON, ...) so the machine's drifting load hits all three alike:

* ``rest-json``   -- ``POST /v2/models/NAME/infer`` with JSON ``data``, the answer as JSON;
* ``rest-binary`` -- the same with the binary tensor data extension both ways;
* ``grpc``        -- ``ModelInfer`` with ``raw_input_contents`` (tritonclient's own protobuf
                      messages, not the server's), answered with ``raw_output_contents``.

For each it reports the throughput (requests/s), p50/p99 latency and the server's CPU time per
request, read from ``/proc/PID/stat`` around each measurement: **requests per server CPU-second**
is the serving path's cost, model time included, independent of how many cores the machine
lends. The ratios to REST JSON are per round, then the median. The load generator runs in this
process on the same machine, so a cheaper protocol's client also leaves the server more CPU.

``--profile`` runs the server under cProfile (its event loop thread: parsing, dispatch, encoding;
the model's thread is not profiled) and prints the top functions by own time for one protocol.

    python bench/batcher_serving.py              # 3 rounds of 10 s per protocol
    python bench/batcher_serving.py --profile rest-json
    python bench/batcher_serving.py --smoke      # proves it runs end to end (the tests)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import pstats
import queue
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

if TYPE_CHECKING:  # the server imports torch through the factory; the load generator does not
    from batcher.models.demo import DemoMLP

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results" / "batcher_serving.json"
MODES = ("rest-json", "rest-binary", "grpc")
MODEL_NAME = "reference"
FEATURES = 512
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def reference_mlp() -> DemoMLP:
    """The reference MLP of the serving goals: ``input`` FP32 [-1, 512] -> ``logits`` [-1, 512]."""
    from batcher.models.demo import DemoMLP

    return DemoMLP(features=FEATURES, hidden=2048, layers=2, classes=FEATURES)


class Server:
    """The batcher on 127.0.0.1 (HTTP and gRPC on free ports), optionally under cProfile."""

    def __init__(self, extra: list[str], profile_to: Path | None = None) -> None:
        command = [sys.executable]
        if profile_to is not None:
            command += ["-m", "cProfile", "-o", str(profile_to)]
        command += [
            "-m",
            "batcher.cli",
            "--model",
            "bench.batcher_serving:reference_mlp",
            "--model-name",
            MODEL_NAME,
            "--device",
            "cpu",
            "--torch-threads",
            "1",
            "--listen",
            "127.0.0.1:0",
            "--grpc-listen",
            "127.0.0.1:0",
            "--log-format",
            "json",
            *extra,
        ]
        self.proc = subprocess.Popen(
            command,
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: queue.Queue[dict] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.http_port, self.grpc_port = self._wait_ports()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            try:
                self.lines.put(json.loads(line))
            except json.JSONDecodeError:
                self.lines.put({"msg": line.strip()})

    def _wait_ports(self) -> tuple[int, int]:
        grpc_port = 0
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                record = self.lines.get(timeout=1)
            except queue.Empty:
                if self.proc.poll() is not None:
                    break
                continue
            if record.get("msg") == "serving grpc":
                grpc_port = int(record["port"])
            if record.get("msg") == "serving":
                return int(record["port"]), grpc_port
        raise RuntimeError("batcher did not start")

    def cpu_seconds(self) -> float:
        """User + system CPU time of the server process so far (all its threads)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def payloads(rows: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(1, FEATURES)).astype(np.float32).round(4) for _ in range(rows)]


def json_body(row: np.ndarray) -> bytes:
    document = {
        "inputs": [
            {"name": "input", "shape": [1, FEATURES], "datatype": "FP32", "data": row.tolist()}
        ]
    }
    return json.dumps(document).encode()


def binary_body(row: np.ndarray) -> tuple[bytes, int]:
    raw = row.astype("<f4").tobytes()
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": [1, FEATURES],
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": len(raw)},
                }
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    return header + raw, len(header)


def grpc_request(row: np.ndarray) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=MODEL_NAME)
    request.inputs.add(name="input", datatype="FP32", shape=[1, FEATURES])
    request.raw_input_contents.append(row.astype("<f4").tobytes())
    return request


async def closed_loop(
    mode: str, server: Server, concurrency: int, seconds: float
) -> tuple[list[float], int]:
    """``concurrency`` workers each sending one request after another; (latencies, failures)."""
    rows = payloads()
    latencies: list[float] = []
    failures = 0
    stop_at = time.perf_counter() + seconds
    url = f"http://127.0.0.1:{server.http_port}/v2/models/{MODEL_NAME}/infer"

    async def rest_worker(session: aiohttp.ClientSession, bodies: list, binary: bool) -> None:
        nonlocal failures
        i = 0
        while time.perf_counter() < stop_at:
            body, header_length = bodies[i % len(bodies)]
            headers = {"Inference-Header-Content-Length": str(header_length)} if binary else None
            start = time.perf_counter()
            try:
                async with session.post(url, data=body, headers=headers) as reply:
                    await reply.read()
                    ok = reply.status == 200
            except aiohttp.ClientError:
                ok = False
            if ok:
                latencies.append(time.perf_counter() - start)
            else:
                failures += 1
            i += 1

    async def grpc_worker(stub: service_pb2_grpc.GRPCInferenceServiceStub, requests: list) -> None:
        nonlocal failures
        i = 0
        while time.perf_counter() < stop_at:
            start = time.perf_counter()
            try:
                await stub.ModelInfer(requests[i % len(requests)])
                latencies.append(time.perf_counter() - start)
            except grpc.aio.AioRpcError:
                failures += 1
            i += 1

    if mode == "grpc":
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.grpc_port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            requests = [grpc_request(row) for row in rows]
            await asyncio.gather(*(grpc_worker(stub, requests) for _ in range(concurrency)))
    else:
        binary = mode == "rest-binary"
        bodies = [binary_body(r) for r in rows] if binary else [(json_body(r), 0) for r in rows]
        connector = aiohttp.TCPConnector(limit=concurrency)
        async with aiohttp.ClientSession(connector=connector) as session:
            await asyncio.gather(
                *(rest_worker(session, bodies, binary) for _ in range(concurrency))
            )
    return latencies, failures


def measure(mode: str, server: Server, concurrency: int, seconds: float) -> dict:
    asyncio.run(closed_loop(mode, server, concurrency, min(1.0, seconds / 4)))  # warm the path
    cpu_before, client_before, wall_before = server.cpu_seconds(), time.process_time(), time.time()
    latencies, failures = asyncio.run(closed_loop(mode, server, concurrency, seconds))
    wall = time.time() - wall_before
    server_cpu = server.cpu_seconds() - cpu_before
    client_cpu = time.process_time() - client_before
    done = len(latencies)
    ordered = sorted(latencies) or [float("nan")]
    return {
        "requests": done,
        "failures": failures,
        "rate": done / wall,
        "p50_ms": 1000 * ordered[len(ordered) // 2],
        "p99_ms": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))],
        "server_cpu_seconds": server_cpu,
        "requests_per_server_cpu_second": done / server_cpu if server_cpu > 0 else float("nan"),
        "server_cores_busy": server_cpu / wall,
        "client_cpu_ms_per_request": 1000 * client_cpu / done if done else float("nan"),
    }


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def summary(rounds: list[dict[str, dict]]) -> dict:
    out: dict = {}
    for mode in MODES:
        points = [r[mode] for r in rounds]
        out[mode] = {
            key: statistics.median(p[key] for p in points)
            for key in ("rate", "p50_ms", "p99_ms", "requests_per_server_cpu_second")
        }
        out[mode]["failures"] = sum(p["failures"] for p in points)
    for mode in MODES[1:]:
        for key, name in (("rate", "rate"), ("requests_per_server_cpu_second", "cpu")):
            ratios = [r[mode][key] / r["rest-json"][key] for r in rounds]
            out[mode][f"{name}_ratio_to_rest_json"] = statistics.median(ratios)
            out[mode][f"{name}_ratio_range"] = [min(ratios), max(ratios)]
    return out


def print_table(result: dict) -> None:
    print(
        f"{'protocol':<12} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8} {'req/CPU-s':>10} "
        f"{'rate x':>7} {'cost x':>7}"
    )
    for mode in MODES:
        row = result[mode]
        rate_x = row.get("rate_ratio_to_rest_json", 1.0)
        cost_x = row.get("cpu_ratio_to_rest_json", 1.0)
        print(
            f"{mode:<12} {row['rate']:>8.0f} {row['p50_ms']:>8.1f} {row['p99_ms']:>8.1f} "
            f"{row['requests_per_server_cpu_second']:>10.0f} {rate_x:>7.2f} {cost_x:>7.2f}"
        )
    print("rate x, cost x: per-round ratio to rest-json (requests/s, requests per server CPU-s)")


def profile(mode: str, args: argparse.Namespace, extra: list[str]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        stats_file = Path(tmp) / "server.prof"
        server = Server(extra, profile_to=stats_file)
        try:
            point = measure(mode, server, args.concurrency, args.seconds)
        finally:
            server.stop()
        print(
            f"{mode}: {point['rate']:.0f} req/s, "
            f"{point['requests_per_server_cpu_second']:.0f} req per server CPU-s (profiled)"
        )
        stats = pstats.Stats(str(stats_file))
        stats.sort_stats("tottime").print_stats(args.top)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=10.0, help="per protocol per round")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--slo-seconds", type=float, default=0.1)
    parser.add_argument("--profile", choices=MODES, help="profile the server under one protocol")
    parser.add_argument("--top", type=int, default=25, help="functions shown with --profile")
    parser.add_argument("--smoke", action="store_true", help="1 short round: proves it runs")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if args.smoke:
        args.rounds, args.seconds, args.concurrency = 1, 1.0, 8
    extra = [
        "--max-batch-size",
        str(args.max_batch_size),
        "--max-queue",
        str(max(1024, 4 * args.concurrency)),
        "--slo-seconds",
        str(args.slo_seconds),
        "--warmup-repeats",
        "1" if args.smoke else "3",
    ]
    if args.profile:
        profile(args.profile, args, extra)
        return 0
    load_before = loadavg()
    server = Server(extra)
    rounds: list[dict[str, dict]] = []
    try:
        for index in range(args.rounds):
            points = {mode: measure(mode, server, args.concurrency, args.seconds) for mode in MODES}
            rounds.append(points)
            print(
                f"round {index + 1}: "
                + ", ".join(
                    f"{m} {p['rate']:.0f}/s {p['requests_per_server_cpu_second']:.0f}/CPU-s"
                    for m, p in points.items()
                ),
                flush=True,
            )
    finally:
        server.stop()
    result = summary(rounds)
    print_table(result)
    report = {
        "model": "MLP 512-2048-2048-512, torch CPU, 1 thread",
        "concurrency": args.concurrency,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "smoke": args.smoke,
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "cpus": os.cpu_count(),
        "summary": result,
        "per_round": rounds,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
