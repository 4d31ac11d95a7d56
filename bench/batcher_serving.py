"""What serving costs: the highest rate each protocol holds within the SLO, and its CPU per request.

One ``autoglm-batcher`` process serves the reference MLP (:mod:`bench.reference_mlp`, torch CPU,
one torch thread) on HTTP and gRPC at once; MLServer 1.7.1 (adaptive batching, the same module,
one torch thread) runs beside it when ``bash bench/mlserver-venv`` has made its venv, and its column
is skipped, naming that command, when not. The ways in:

* ``rest-json``     -- ``POST /v2/models/reference/infer`` with JSON ``data``, the answer as JSON;
* ``rest-binary``   -- the same with the binary tensor data extension both ways;
* ``grpc``          -- ``ModelInfer`` with ``raw_input_contents`` (tritonclient's own protobuf
                        messages), answered with ``raw_output_contents``;
* ``mlserver-json`` -- MLServer's REST endpoint with the same JSON body;
* ``minimal-json``  -- the same JSON body into :mod:`bench.minimal_batcher`: greedy batches of
                        the same model and nothing else, the model placed as the batchers'
                        (``--model-process``), the reference for what the batcher's own work
                        costs (``--no-minimal`` leaves it out);
* ``floor-json``    -- the same JSON body into the floor server of :mod:`bench.serving_bounds`:
                        decoded and answered at once, no model, nothing else. No server that
                        must also run the model on these cores holds more: its top rate bounds
                        every rate goal of this machine and stack (``--no-floor`` leaves it out);
* ``rest-json-workers``, ``rest-binary-workers`` -- the two REST ways into a second batcher
                        started with ``--workers N`` (``--workers``, 2 by default; 0 leaves them
                        out): front worker processes decode, the engine process batches.

The load is open loop: one-row requests at Poisson times, latency counted from the scheduled send
time (a lagging client cannot hide queueing). A rate is held when p99 <= ``--slo-seconds`` and at
most 1% of requests failed (a refusal is a failure). Each pass searches every way's highest held
rate: up by ``--step`` (x1.5) from the last pass's result until a rate fails, then bisection until
the bracket is within ``--resolution`` (5%) of its lower end, so the grid around each limit is
finer than 10%. The searches of one pass are interleaved point by point (json, binary, grpc,
mlserver, json, ...), so the machine's drifting load hits all alike, and ``--passes`` (3) are run.

At each way's highest held rate the server's CPU time (user + system of the process and its
children, from ``/proc``, model time included) gives **requests per server CPU-second**. The
summary holds per way the median top rate and CPU cost over the passes, and the per-pass ratios
(binary and gRPC to REST JSON, REST JSON to MLServer), median and range. The client is a lean
asyncio HTTP/1.1 client on keep-alive connections (and grpc.aio), in this process, on the same
machine: report the load average beside any figure.

``--profile MODE`` runs one open-loop point at ``--rate`` with py-spy sampling the server (every
thread): a flame graph (SVG) and the top functions by own samples; with ``--model
bench.reference_mlp:identity`` (same signature, no work) what is left is the serving path alone.

    python bench/batcher_serving.py                   # 3 passes, 4 s per point
    python bench/batcher_serving.py --profile rest-json --rate 800 --flame docs/img/x.svg
    python bench/batcher_serving.py --smoke           # proves it runs end to end (the tests)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Generator
from pathlib import Path

import grpc
import numpy as np
from tritonclient.grpc import service_pb2, service_pb2_grpc

ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this file's folder comes first on sys.path and ``bench/batcher.py`` would
# shadow the ``batcher`` package; import from the repository root instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.batcher_process import BatcherProcess, histogram_totals, stop_process  # noqa: E402
from bench.report_json import write_report  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "batcher_serving.json"
MLSERVER_BIN = ROOT / ".venv-mlserver" / "bin" / "mlserver"
BATCHER_MODES = ("rest-json", "rest-binary", "grpc")
# The same two REST ways into a second batcher started with --workers N (front worker processes).
WORKER_MODES = ("rest-json-workers", "rest-binary-workers")
MLSERVER_MODE = "mlserver-json"
# The same JSON requests into bench/minimal_batcher.py: greedy batches and nothing else.
MINIMAL_MODE = "minimal-json"
# The same JSON requests into bench/serving_bounds.py's floor server: no model, answered at once.
FLOOR_MODE = "floor-json"
# The lower references, not batchers: served JSON alone, with no batch statistics.
REFERENCE_MODES = (MINIMAL_MODE, FLOOR_MODE)
MODEL_NAME = "reference"
FEATURES = 512  # bench.reference_mlp.FEATURES; not imported: that would load torch here
REFERENCE = "bench.reference_mlp:reference_mlp"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
OK = ("200", "OK")  # an answered request, over HTTP and over gRPC
CONNECTIONS = 256  # keep-alive connections per HTTP server; beyond them requests wait here
LEAST_COUNT = 40  # requests a point sends however low its rate


# --- servers -----------------------------------------------------------------------------------


def tree_cpu_seconds(root: int) -> float:
    """User + system CPU time of ``root`` and every live descendant (MLServer forks workers)."""
    parents: dict[int, int] = {}
    times: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0.0)
        todo.extend(child for child, parent in parents.items() if parent == pid)
    return total


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Served:
    """A server process of the bench: its ports, its CPU time, and stopping it."""

    name = ""
    modes: tuple[str, ...] = BATCHER_MODES  # the ways bench/serving_bounds.py measures it by
    proc: subprocess.Popen
    http_port = 0
    grpc_port = 0

    def cpu_seconds(self) -> float:
        return tree_cpu_seconds(self.proc.pid)

    def stop(self) -> None:
        stop_process(self.proc)


class BatcherServer(Served):
    """``autoglm-batcher`` on 127.0.0.1, HTTP and gRPC on free ports."""

    def batched_items(self) -> tuple[float, float]:
        """(items, batches) run so far, from the server's own metrics."""
        return histogram_totals(self.http_port, "autoglm_batcher_batch_size_items")

    name = "batcher"

    def __init__(self, extra: list[str], model: str = REFERENCE, device: str = "cpu") -> None:
        process = BatcherProcess(
            [
                *("--model", model, "--model-name", MODEL_NAME),
                *("--device", device, "--torch-threads", "1"),
                *("--listen", "127.0.0.1:0", "--grpc-listen", "127.0.0.1:0"),
                *extra,
            ]
        )
        self.proc = process.proc
        self.http_port = process.port
        grpc = process.startup_record("serving grpc")
        self.grpc_port = int(grpc["port"]) if grpc else 0


class MLServer(Served):
    """MLServer 1.7.1 from ``.venv-mlserver`` serving :class:`bench.mlserver_reference.ReferenceMLP`
    with adaptive batching (the batcher's maximum batch size, ``max_batch_time`` seconds)."""

    name = "mlserver"

    def __init__(
        self, binary: Path, max_batch_size: int, max_batch_time: float, workers: int
    ) -> None:
        self.folder = Path(tempfile.mkdtemp(prefix="bench-mlserver-"))
        self.http_port = free_port()
        settings = {
            "host": "127.0.0.1",
            "http_port": self.http_port,
            "grpc_port": free_port(),
            "metrics_port": free_port(),
            "parallel_workers": workers,
            "debug": False,
            # its workers' shared metrics, by default .metrics/ under the working directory: the
            # repository's root here
            "metrics_dir": str(self.folder / "metrics"),
        }
        (self.folder / "settings.json").write_text(json.dumps(settings))
        model = self.folder / MODEL_NAME
        model.mkdir()
        model_settings = {
            "name": MODEL_NAME,
            "implementation": "bench.mlserver_reference.ReferenceMLP",
            "max_batch_size": max_batch_size,
            "max_batch_time": max_batch_time,
        }
        (model / "model-settings.json").write_text(json.dumps(model_settings))
        self.proc = subprocess.Popen(
            [str(binary), "start", str(self.folder)],
            cwd=ROOT,
            env=dict(os.environ, PYTHONPATH=str(ROOT)),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self._wait_ready()

    def _wait_ready(self) -> None:
        url = f"http://127.0.0.1:{self.http_port}/v2/models/{MODEL_NAME}/ready"
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                break
            try:
                with urllib.request.urlopen(url, timeout=2) as reply:
                    if reply.status == 200:
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("MLServer did not become ready")

    def stop(self) -> None:
        super().stop()
        shutil.rmtree(self.folder, ignore_errors=True)


# --- requests ----------------------------------------------------------------------------------


def rows(count: int = 16) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [rng.normal(size=(1, FEATURES)).astype(np.float32).round(4) for _ in range(count)]


def http_request(port: int, body: bytes, headers: dict[str, str]) -> bytes:
    """A whole HTTP/1.1 request, built once and sent as it is."""
    lines = [
        f"POST /v2/models/{MODEL_NAME}/infer HTTP/1.1",
        f"Host: 127.0.0.1:{port}",
        f"Content-Length: {len(body)}",
        *(f"{key}: {value}" for key, value in headers.items()),
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def json_request(port: int, row: np.ndarray) -> bytes:
    tensor = {"name": "input", "shape": [1, FEATURES], "datatype": "FP32", "data": row.tolist()}
    body = json.dumps({"inputs": [tensor]}).encode()
    return http_request(port, body, {"Content-Type": "application/json"})


def binary_request(port: int, row: np.ndarray) -> bytes:
    raw = row.astype("<f4").tobytes()
    tensor = {
        "name": "input",
        "shape": [1, FEATURES],
        "datatype": "FP32",
        "parameters": {"binary_data_size": len(raw)},
    }
    header = json.dumps({"inputs": [tensor], "parameters": {"binary_data_output": True}}).encode()
    return http_request(
        port,
        header + raw,
        {
            "Content-Type": "application/octet-stream",
            "Inference-Header-Content-Length": str(len(header)),
        },
    )


def grpc_request(row: np.ndarray) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=MODEL_NAME)
    request.inputs.add(name="input", datatype="FP32", shape=[1, FEATURES])
    request.raw_input_contents.append(row.astype("<f4").tobytes())
    return request


# --- a lean HTTP/1.1 client --------------------------------------------------------------------


class _Connection(asyncio.Protocol):
    """One keep-alive connection answering one request at a time (Content-Length bodies)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buffer = bytearray()
        self.waiter: asyncio.Future[int] | None = None
        self.broken = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        transport.get_extra_info("socket").setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None or self.waiter.done():
            return
        head = bytes(self.buffer[:end]).lower()
        at = head.find(b"\r\ncontent-length:")
        if at < 0:
            self._fail(ConnectionError("answer without Content-Length"))
            return
        stop = head.find(b"\r\n", at + 2)
        length = int(head[at + 17 : stop if stop >= 0 else None])
        total = end + 4 + length
        if len(self.buffer) < total:
            return
        del self.buffer[:total]
        self.waiter.set_result(int(head[9:12]))

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(ConnectionError("connection closed"))

    def _fail(self, error: Exception) -> None:
        self.broken = True
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(error)
        if self.transport is not None:
            self.transport.close()

    async def send(self, raw: bytes) -> int:
        assert self.transport is not None
        if self.broken:
            raise ConnectionError("connection closed")
        self.waiter = asyncio.get_running_loop().create_future()
        self.transport.write(raw)
        return await self.waiter


class HttpPool:
    """Up to ``limit`` keep-alive connections to one port; a request waits for a free one."""

    def __init__(self, port: int, limit: int = CONNECTIONS) -> None:
        self.port = port
        self.limit = limit
        self.idle: list[_Connection] = []
        self.open = 0
        self.waiters: collections.deque[asyncio.Future[_Connection]] = collections.deque()

    async def _take(self) -> _Connection:
        while self.idle:
            connection = self.idle.pop()
            if not connection.broken:
                return connection
            self.open -= 1  # closed by the server while idle (uvicorn's keep-alive timeout)
        if self.open < self.limit:
            self.open += 1
            try:
                _, connection = await asyncio.get_running_loop().create_connection(
                    _Connection, "127.0.0.1", self.port
                )
            except OSError:
                self.open -= 1
                raise
            return connection
        waiter = asyncio.get_running_loop().create_future()
        self.waiters.append(waiter)
        return await waiter

    def _give(self, connection: _Connection) -> None:
        if connection.broken:
            self.open -= 1
            return
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return
        self.idle.append(connection)

    async def post(self, raw: bytes) -> str:
        """Send one prepared request; the answer's HTTP status. A connection the server
        closed before answering is retried once on another, as HTTP clients do."""
        retry = True
        while True:
            connection = await self._take()
            try:
                return str(await connection.send(raw))
            except ConnectionError:
                if not retry or connection.buffer:
                    raise
                retry = False
            except asyncio.CancelledError:
                connection._fail(ConnectionError("cancelled"))
                raise
            finally:
                self._give(connection)

    def close(self) -> None:
        for connection in self.idle:
            if connection.transport is not None:
                connection.transport.close()


# --- one open-loop point -----------------------------------------------------------------------

Send = Callable[[int], Awaitable[str]]  # request i -> its outcome: "200", "429", "UNAVAILABLE"


async def open_loop(
    send: Send, rate: float, count: int, seed: int, timeout: float
) -> tuple[list[float], collections.Counter[str], float]:
    """``count`` requests at Poisson times; (latencies of the answered, outcomes, seconds)."""
    loop = asyncio.get_running_loop()
    offsets = np.cumsum(np.random.default_rng(seed).exponential(1.0 / rate, size=count))
    latencies: list[float] = []
    outcomes: collections.Counter[str] = collections.Counter()

    async def one(index: int, scheduled: float) -> None:
        try:
            outcome = await send(index)
        except OSError as exc:
            outcome = type(exc).__name__
        except grpc.aio.AioRpcError as exc:
            outcome = exc.code().name
        outcomes[outcome] += 1
        if outcome in OK:
            latencies.append(loop.time() - scheduled)

    start = loop.time()
    tasks = []
    for index, offset in enumerate(offsets.tolist()):
        scheduled = start + offset
        delay = scheduled - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(loop.create_task(one(index, scheduled)))
    _, late = await asyncio.wait(tasks, timeout=timeout)
    for task in late:
        task.cancel()
    if late:
        await asyncio.wait(late)
    outcomes["unanswered"] += len(late)
    return latencies, outcomes, loop.time() - start


def percentile(ordered: list[float], fraction: float) -> float:
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else math.inf


class Target:
    """One way into one server: how to send request ``i``, and the server whose CPU it costs."""

    def __init__(self, mode: str, server: Served, send: Send) -> None:
        self.mode = mode
        self.server = server
        self.send = send

    async def point(self, rate: float, seconds: float, slo: float, seed: int) -> dict:
        count = max(LEAST_COUNT, int(rate * seconds))
        batched = isinstance(self.server, BatcherServer)
        items_before = self.server.batched_items() if batched else (0.0, 0.0)
        cpu_before = self.server.cpu_seconds()
        client_before = time.process_time()
        latencies, outcomes, elapsed = await open_loop(
            self.send, rate, count, seed, timeout=max(10.0, 20 * slo)
        )
        server_cpu = self.server.cpu_seconds() - cpu_before
        client_cpu = time.process_time() - client_before
        items, batches = (
            (a - b for a, b in zip(self.server.batched_items(), items_before, strict=True))
            if batched
            else (0.0, 0.0)
        )
        answered = len(latencies)
        failures = count - answered
        ordered = sorted(latencies) + [math.inf] * failures
        p99 = percentile(ordered, 0.99)
        return {
            "mode": self.mode,
            "rate": rate,
            "sent": count,
            "answered": answered,
            "failures": failures,
            "outcomes": dict(outcomes),
            "throughput": answered / elapsed if elapsed > 0 else 0.0,
            "p50_ms": 1000 * percentile(ordered, 0.5),
            "p99_ms": 1000 * p99,
            "held": p99 <= slo and failures <= 0.01 * count,
            "server_cpu_seconds": server_cpu,
            "server_cores": server_cpu / elapsed if elapsed > 0 else math.nan,
            "requests_per_server_cpu_second": answered / server_cpu if server_cpu > 0 else math.nan,
            "client_cpu_ms_per_request": 1000 * client_cpu / count,
            "mean_batch_items": items / batches if batches else math.nan,
        }


def warm_rate(first_rate: float) -> float:
    """The rate of the one-second point that opens a way's connections and warms its path before
    the measured points: a quarter of the first measured rate, or ``LEAST_COUNT`` a second where
    that is lower (a smoke's low first rate would stretch the second to several)."""
    return max(first_rate / 4, LEAST_COUNT)


async def targets_for(
    batcher: BatcherServer,
    mlserver: MLServer | None,
    modes: tuple[str, ...],
    with_workers: BatcherServer | None = None,
    references: dict[str, Served] | None = None,
) -> tuple[dict[str, Target], Callable[[], Awaitable[None]]]:
    """A sender per mode, over connections kept open for the whole run; and how to close them."""
    row_list = rows()
    pools: list[HttpPool] = []
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{batcher.grpc_port}")
    targets: dict[str, Target] = {}

    def http_target(mode: str, server: Served, build: Callable[[int, np.ndarray], bytes]) -> None:
        pool = HttpPool(server.http_port)
        pools.append(pool)
        prepared = [build(server.http_port, row) for row in row_list]
        targets[mode] = Target(mode, server, lambda i: pool.post(prepared[i % len(prepared)]))

    if "rest-json" in modes:
        http_target("rest-json", batcher, json_request)
    if "rest-binary" in modes:
        http_target("rest-binary", batcher, binary_request)
    if "grpc" in modes:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        messages = [grpc_request(row) for row in row_list]

        async def grpc_send(index: int) -> str:
            await stub.ModelInfer(messages[index % len(messages)])
            return "OK"

        targets["grpc"] = Target("grpc", batcher, grpc_send)
    if with_workers is not None:
        http_target("rest-json-workers", with_workers, json_request)
        http_target("rest-binary-workers", with_workers, binary_request)
    if mlserver is not None and MLSERVER_MODE in modes:
        http_target(MLSERVER_MODE, mlserver, json_request)
    for mode, server in (references or {}).items():
        if mode in modes:
            http_target(mode, server, json_request)

    async def close() -> None:
        for pool in pools:
            pool.close()
        await channel.close()

    return targets, close


# --- the search --------------------------------------------------------------------------------


def top_rate_search(
    start: float, step: float, resolution: float, floor: float, ceiling: float
) -> Generator[float, bool, float]:
    """Yield rates to try, be sent whether each held; return the highest held (0: none).

    Up by ``step`` from ``start`` while rates hold (down by it while they fail), then bisection
    until the bracket is within ``resolution`` of its lower end. ``ceiling`` ends a climb that
    never fails (a smoke run's few requests hold at any rate).
    """
    rate = start
    if (yield rate):
        low = rate
        while rate < ceiling:
            rate = min(ceiling, rate * step)
            if not (yield rate):
                break
            low = rate
        else:
            return low
        high = rate
    else:
        high = rate
        while True:
            rate = rate / step
            if rate < floor:
                return 0.0
            if (yield rate):
                break
            high = rate
        low = rate
    while high - low > resolution * low:
        middle = (low + high) / 2
        if (yield middle):
            low = middle
        else:
            high = middle
    return low


async def interleaved(
    searches: dict[str, Generator[float, bool, float]],
    run: Callable[[str, float], Awaitable[bool]],
) -> dict[str, float]:
    """Advance every search one point at a time, in turn; the top rate each found, by mode."""
    pending = {mode: next(search) for mode, search in searches.items()}
    found: dict[str, float] = {}
    while pending:
        for mode in list(pending):
            try:
                pending[mode] = searches[mode].send(await run(mode, pending[mode]))
            except StopIteration as stop:
                found[mode] = stop.value
                del pending[mode]
    return found


# --- summary -----------------------------------------------------------------------------------


def loadavg() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Neighbours:
    """CPU the rest of the machine used while this bench ran: every CPU's busy time (from
    ``/proc/stat``) less this process and the servers it started. A load average counts waiting
    tasks; this says how many cores other work actually took, which is what moves the figures.
    The hypervisor's share of it (steal: time a virtual CPU was ready but the host ran something
    else) is kept apart too, since no process on this machine can be asked to stop for it."""

    def __init__(self) -> None:
        self._start, self._start_steal = self._others()
        self._wall = time.monotonic()

    @staticmethod
    def _others() -> tuple[float, float]:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
        busy = (user + nice + system + irq + softirq + steal) / CLOCK_TICKS
        return busy - tree_cpu_seconds(os.getpid()), steal / CLOCK_TICKS

    def cores(self) -> float:
        """Mean cores other work (host steal included) used since this object was made."""
        return self._per_second(self._others()[0] - self._start)

    def steal_cores(self) -> float:
        """Mean cores the host took from this machine since this object was made."""
        return self._per_second(self._others()[1] - self._start_steal)

    def _per_second(self, seconds: float) -> float:
        elapsed = time.monotonic() - self._wall
        return seconds / elapsed if elapsed > 0 else math.nan


def spread(values: list[float]) -> dict:
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return {"median": math.nan, "min": math.nan, "max": math.nan, "values": values}
    return {
        "median": statistics.median(finite),
        "min": min(finite),
        "max": max(finite),
        "values": values,
    }


RATIOS = (
    ("rest-json-workers", "rest-json"),
    ("rest-binary-workers", "rest-binary"),
    ("rest-binary", "rest-json"),
    ("grpc", "rest-json"),
    ("rest-json", MLSERVER_MODE),
    ("rest-json", MINIMAL_MODE),
    (MINIMAL_MODE, MLSERVER_MODE),
    ("rest-json", FLOOR_MODE),
    (FLOOR_MODE, MLSERVER_MODE),
)


def summary(passes: list[dict[str, dict]], modes: tuple[str, ...]) -> dict:
    """Per mode the top rate and its CPU cost over the passes; per pair the per-pass ratios."""
    out: dict = {"modes": {}, "ratios": {}}
    for mode in modes:
        tops = [p[mode]["top_rate"] for p in passes]
        costs = [p[mode]["requests_per_server_cpu_second"] for p in passes]
        out["modes"][mode] = {
            "top_rate": spread(tops),
            "requests_per_server_cpu_second": spread(costs),
        }
    for mode, base in RATIOS:
        if mode not in modes or base not in modes:
            continue
        for key, label in (("top_rate", "rate"), ("requests_per_server_cpu_second", "cpu")):
            ratios = [p[mode][key] / p[base][key] if p[base][key] > 0 else math.nan for p in passes]
            out["ratios"][f"{mode}/{base} {label}"] = spread(ratios)
    return out


def model_row_costs(
    passes: list[dict[str, dict]], modes: tuple[str, ...], seconds: float
) -> dict[int, float]:
    """The reference MLP's own CPU per row at each batch size the batcher ran at its top rates,
    and at full batches, measured in a child process (this one stays free of torch)."""
    sizes = {
        max(1, round(p[m]["mean_batch_items"]))
        for p in passes
        for m in modes
        if math.isfinite(p[m].get("mean_batch_items", math.nan))
    }
    return model_row_microseconds(sorted(sizes), seconds) if sizes else {}


def model_row_microseconds(
    sizes: list[int], seconds: float, device: str = "cpu"
) -> dict[int, float]:
    """The MLP's cost per row alone at each of ``sizes`` (CPU time on CPU, a call's wall time on
    CUDA), one torch thread, in a child process (the bench's own stays free of torch)."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.reference_mlp", "--seconds", str(seconds)]
        + ["--device", device]
        + [str(size) for size in sizes],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    return {int(size): cost for size, cost in json.loads(out.stdout).items()}


def model_share(
    passes: list[dict[str, dict]], modes: tuple[str, ...], costs: dict[int, float], cpus: int
) -> dict:
    """Per batcher way: how much of its CPU per request is the model's, and what the CPU goal
    and the machine allow even with a serving path that cost nothing (medians over passes)."""
    out = {}
    for mode in modes:
        rows = []
        for p in passes:
            batch = p[mode].get("mean_batch_items", math.nan)
            served = p[mode]["requests_per_server_cpu_second"]
            if not (math.isfinite(batch) and math.isfinite(served)):
                continue
            model_us = costs[max(1, round(batch))]
            client_us = 1000 * p[mode]["client_cpu_ms_per_request"]
            rows.append(
                {
                    "batch": batch,
                    "model_us_per_row": model_us,
                    "server_us_per_request": 1e6 / served,
                    "model_share": model_us * served / 1e6,
                    "free_path_requests_per_cpu_second": 1e6 / model_us,
                    "free_path_rate_bound": cpus * 1e6 / (model_us + client_us),
                }
            )
        if rows:
            out[mode] = {key: statistics.median(r[key] for r in rows) for key in rows[0]}
    return out


def print_summary(result: dict) -> None:
    print(f"{'way in':<14} {'top req/s':>10} {'range':>15} {'req/CPU-s':>10} {'range':>15}")
    for mode, row in result["modes"].items():
        top, cost = row["top_rate"], row["requests_per_server_cpu_second"]
        print(
            f"{mode:<14} {top['median']:>10.0f} {top['min']:>7.0f}-{top['max']:<7.0f} "
            f"{cost['median']:>10.0f} {cost['min']:>7.0f}-{cost['max']:<7.0f}"
        )
    print("ratios per pass (median, range):")
    for name, ratio in result["ratios"].items():
        print(f"  {name:<32} {ratio['median']:6.2f}  ({ratio['min']:.2f}-{ratio['max']:.2f})")
    print("req/CPU-s: requests per server CPU-second at the highest held rate, model included")
    shares = result.get("model_share", {})
    if shares:
        print(
            f"{'way in':<20} {'batch':>6} {'model us/row':>12} {'server us/req':>13} "
            f"{'model share':>11} {'free path: req/CPU-s':>20} {'req/s':>7}"
        )
        for mode, row in shares.items():
            print(
                f"{mode:<20} {row['batch']:>6.1f} {row['model_us_per_row']:>12.0f} "
                f"{row['server_us_per_request']:>13.0f} {row['model_share']:>11.2f} "
                f"{row['free_path_requests_per_cpu_second']:>20.0f} "
                f"{row['free_path_rate_bound']:>7.0f}"
            )
        print(
            "model us/row: the MLP alone (one torch thread) at the mean batch of that top rate; "
            "free path: what a server whose serving path cost nothing would reach at that batch "
            "(req/CPU-s), and the rate all cores could hold for the model plus this client (req/s)"
        )


# --- main --------------------------------------------------------------------------------------


async def run_passes(
    args: argparse.Namespace,
    batcher: BatcherServer,
    mlserver: MLServer | None,
    with_workers: BatcherServer | None,
    references: dict[str, Served] | None = None,
) -> tuple[list[dict[str, dict]], list[dict]]:
    modes = served_modes(mlserver, with_workers, references)
    targets, close = await targets_for(batcher, mlserver, modes, with_workers, references)
    passes: list[dict[str, dict]] = []
    points: list[dict] = []
    try:
        for target in targets.values():  # open connections, warm every path
            await target.point(warm_rate(args.start), 1.0, args.slo_seconds, seed=0)
        starts = dict.fromkeys(modes, args.start)
        for index in range(1, args.passes + 1):
            before = loadavg()
            neighbours = Neighbours()
            best: dict[str, dict] = {}

            async def run(
                mode: str, rate: float, index: int = index, best: dict[str, dict] = best
            ) -> bool:
                point = await targets[mode].point(rate, args.seconds, args.slo_seconds, seed=index)
                point["pass"] = index
                points.append(point)
                print(
                    f"  {mode:<14} {rate:8.0f}/s  p99 {point['p99_ms']:8.1f} ms  "
                    f"fail {point['failures']:5d}  {point['requests_per_server_cpu_second']:6.0f}"
                    f" req/CPU-s  {point['server_cores']:4.2f} cores  "
                    f"{'held' if point['held'] else 'MISS'}  "
                    + " ".join(
                        f"{k}:{v}" for k, v in point["outcomes"].items() if k not in OK and v
                    ),
                    flush=True,
                )
                if point["held"] and rate >= best.get(mode, {}).get("rate", 0.0):
                    best[mode] = point
                return bool(point["held"])

            found = await interleaved(
                {
                    m: top_rate_search(starts[m], args.step, args.resolution, 20.0, args.ceiling)
                    for m in modes
                },
                run,
            )
            result = {}
            for mode in modes:
                held = best.get(mode)
                result[mode] = {
                    "top_rate": found[mode],
                    "requests_per_server_cpu_second": (
                        held["requests_per_server_cpu_second"] if held else math.nan
                    ),
                    "p99_ms": held["p99_ms"] if held else math.nan,
                    "mean_batch_items": held["mean_batch_items"] if held else math.nan,
                    "client_cpu_ms_per_request": (
                        held["client_cpu_ms_per_request"] if held else math.nan
                    ),
                }
                starts[mode] = max(40.0, found[mode] / args.step)
            result["loadavg"] = {"before": before, "after": loadavg()}  # type: ignore[assignment]
            result["neighbour_cores"] = neighbours.cores()  # type: ignore[assignment]
            result["host_steal_cores"] = neighbours.steal_cores()  # type: ignore[assignment]
            passes.append(result)
            print(
                f"pass {index}: "
                + ", ".join(f"{m} {found[m]:.0f}/s" for m in modes)
                + f"; load average {before} -> {loadavg()}, other work took "
                f"{result['neighbour_cores']:.2f} cores (host steal "
                f"{result['host_steal_cores']:.2f})",
                flush=True,
            )
    finally:
        await close()
    return passes, points


def served_modes(
    mlserver: MLServer | None,
    with_workers: BatcherServer | None,
    references: dict[str, Served] | None = None,
) -> tuple[str, ...]:
    return (
        BATCHER_MODES
        + (WORKER_MODES if with_workers is not None else ())
        + tuple(m for m in REFERENCE_MODES if m in (references or {}))
        + ((MLSERVER_MODE,) if mlserver is not None else ())
    )


def profile(args: argparse.Namespace, extra: list[str]) -> int:
    """One open-loop point at ``--rate`` with py-spy sampling the server: flame graph and top."""
    if shutil.which("py-spy") is None:
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    batcher = BatcherServer(extra, args.model)
    try:

        async def go() -> dict:
            targets, close = await targets_for(batcher, None, (args.profile,))
            target = targets[args.profile]
            try:
                await target.point(args.rate / 4, 1.0, args.slo_seconds, seed=0)
                with tempfile.TemporaryDirectory() as tmp:
                    raw = Path(tmp) / "raw.txt"
                    spies = [
                        subprocess.Popen(
                            [
                                *("py-spy", "record", "--pid", str(batcher.proc.pid)),
                                *("--duration", str(int(args.seconds)), "--rate", "200"),
                                *("--nonblocking", "--format", fmt, "-o", str(path)),
                            ],
                            stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL,
                        )
                        for fmt, path in (("raw", raw), ("flamegraph", args.flame))
                    ]
                    point = await target.point(args.rate, args.seconds, args.slo_seconds, seed=1)
                    for spy in spies:
                        await asyncio.to_thread(spy.wait)
                    point["top"] = top_functions(raw.read_text(), args.top)
                return point
            finally:
                await close()

        point = asyncio.run(go())
    finally:
        batcher.stop()
    print(
        f"{args.profile} at {args.rate:.0f}/s ({args.model}): p99 {point['p99_ms']:.1f} ms, "
        f"{point['requests_per_server_cpu_second']:.0f} req per server CPU-s (sampled), "
        f"load average {loadavg()}; flame graph {args.flame}"
    )
    print(f"{'own':>6} {'incl':>6}  function (share of the server's busy samples, all threads)")
    for own, inclusive, function in point["top"]:
        print(f"{own:6.1%} {inclusive:6.1%}  {function}")
    return 0


def top_functions(raw: str, count: int) -> list[tuple[float, float, str]]:
    """(own share, inclusive share, function) by own samples, from py-spy's raw stacks."""
    own: collections.Counter[str] = collections.Counter()
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, samples = line.rpartition(" ")
        if not stack:
            continue
        weight = int(samples)
        total += weight
        frames = stack.split(";")
        own[frames[-1]] += weight
        for frame in set(frames):
            inclusive[frame] += weight
    return [(n / total, inclusive[f] / total, f) for f, n in own.most_common(count)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--passes", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=4.0, help="per point")
    parser.add_argument("--start", type=float, default=300.0, help="first rate tried (req/s)")
    parser.add_argument("--step", type=float, default=1.5, help="factor between climbing rates")
    parser.add_argument("--resolution", type=float, default=0.05, help="bisection stops here")
    parser.add_argument("--ceiling", type=float, default=20000.0, help="no rate above (req/s)")
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--slo-seconds", type=float, default=0.1)
    parser.add_argument(
        "--mlserver-batch-time",
        type=float,
        default=0.01,
        help="MLServer's max_batch_time (its adaptive batching window), seconds",
    )
    parser.add_argument(
        "--mlserver-workers", type=int, default=1, help="MLServer's parallel_workers"
    )
    parser.add_argument(
        "--mlserver", type=Path, default=MLSERVER_BIN, help="the mlserver command to compare with"
    )
    parser.add_argument("--no-mlserver", action="store_true", help="skip the MLServer column")
    parser.add_argument(
        "--no-minimal", action="store_true", help="skip the minimal batcher's column"
    )
    parser.add_argument(
        "--no-floor", action="store_true", help="skip the floor server's column (no model)"
    )
    parser.add_argument(
        "--model-device",
        default="cpu",
        help="where the batchers run the MLP: cpu, or cuda for the device check's table",
    )
    parser.add_argument(
        "--model-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="the batchers run the model in a child process (their --model-process); default: "
        "on for --model-device cpu, off for cuda (not yet run on a GPU; the device check's "
        "bench/batcher_ab.py measures both there)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=2,
        help="front worker processes of the second batcher (the *-workers columns); 0: none",
    )
    parser.add_argument("--profile", choices=BATCHER_MODES, help="py-spy one protocol")
    parser.add_argument("--rate", type=float, default=500.0, help="--profile's rate (req/s)")
    parser.add_argument(
        "--model",
        default=REFERENCE,
        help="--profile's model; bench.reference_mlp:identity leaves the serving path alone",
    )
    parser.add_argument("--flame", type=Path, default=Path("batcher-serving-flame.svg"))
    parser.add_argument("--top", type=int, default=25, help="functions shown with --profile")
    parser.add_argument("--smoke", action="store_true", help="1 short pass: proves it runs")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    if not re.fullmatch(r"cpu|cuda(:\d+)?", args.model_device):
        parser.error(f"--model-device takes cpu, cuda or cuda:N; got {args.model_device!r}")
    # SIGTERM unwinds like Ctrl-C, so the servers this bench started are stopped on the way out
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.smoke:
        # two points a way that holds: the first rate, then the ceiling one step above it
        args.passes, args.seconds, args.start, args.ceiling = 1, 0.5, 50.0, 100.0
        args.step, args.resolution = 2.0, 0.5
    extra = [
        *("--max-batch-size", str(args.max_batch_size), "--max-queue", "4096"),
        *("--slo-seconds", str(args.slo_seconds)),
        *("--warmup-repeats", "1" if args.smoke else "3"),
    ]
    if args.model_process is None:
        args.model_process = args.model_device == "cpu"
    if args.model_process:
        extra.append("--model-process")
    if args.profile:
        return profile(args, extra)
    skipped = ""
    if args.no_mlserver:
        skipped = "--no-mlserver"
    elif not args.mlserver.exists():
        skipped = f"{args.mlserver} is absent: run bash bench/mlserver-venv"
    load_before = loadavg()
    batcher = BatcherServer(extra, device=args.model_device)
    mlserver = with_workers = None
    references: dict[str, Served] = {}
    scratch = tempfile.TemporaryDirectory(prefix="bench-references-")
    try:
        if not args.no_minimal:
            from bench.minimal_batcher import MinimalBatcher  # they import this module

            references[MINIMAL_MODE] = MinimalBatcher(
                Path(scratch.name), args.max_batch_size, args.model_device, args.model_process
            )
        if not args.no_floor:
            from bench.serving_bounds import FloorServer

            references[FLOOR_MODE] = FloorServer(Path(scratch.name), "floor", hold_seconds=0.0)
        if args.workers:
            workers = [*extra, "--workers", str(args.workers)]
            with_workers = BatcherServer(workers, device=args.model_device)
        if not skipped:
            mlserver = MLServer(
                args.mlserver, args.max_batch_size, args.mlserver_batch_time, args.mlserver_workers
            )
        if skipped:
            print(f"MLServer column skipped: {skipped}")
        passes, points = asyncio.run(run_passes(args, batcher, mlserver, with_workers, references))
    finally:
        batcher.stop()
        for server in references.values():
            server.stop()
        scratch.cleanup()
        if with_workers is not None:
            with_workers.stop()
        if mlserver is not None:
            mlserver.stop()
    modes = served_modes(mlserver, with_workers, references)
    result = summary(passes, modes)
    batched = tuple(m for m in modes if m not in (MLSERVER_MODE, *REFERENCE_MODES))
    if args.model_device == "cpu":  # the MLP alone is timed on one CPU thread: a CPU-only share
        result["model_share"] = model_share(
            passes,
            batched,
            model_row_costs(passes, batched, 0.05 if args.smoke else 1.0),
            os.cpu_count() or 1,
        )
    print_summary(result)
    report = {
        "model": "MLP 512-2048-2048-512, torch, 1 CPU thread (bench/reference_mlp.py)",
        "model_device": args.model_device,
        "slo_seconds": args.slo_seconds,
        "seconds_per_point": args.seconds,
        "passes": args.passes,
        "resolution": args.resolution,
        "smoke": args.smoke,
        "mlserver_skipped": skipped or None,
        "workers": args.workers,
        "model_process": args.model_process,
        "mlserver": None
        if mlserver is None
        else {
            "max_batch_time": args.mlserver_batch_time,
            "parallel_workers": args.mlserver_workers,
        },
        "loadavg_before": load_before,
        "loadavg_after": loadavg(),
        "cpus": os.cpu_count(),
        "summary": result,
        "per_pass": passes,
        "points": points,
    }
    write_report(args.json, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
