"""The simplest batching server the serving bench can hold the batcher against.

``autoglm-batcher`` does much around each request: admission against the SLO, priorities, the
best-effort lane, deadline-aware dispatch, validation against the model's signature, metrics,
memory caps. Whether that work, or the HTTP stack and the machine underneath, is what limits
the rate it holds is answered by serving the same model with none of it: this server reads a KServe
v2 JSON request on aiohttp, holds its row while the model is busy, runs every row waiting (up to
the maximum batch) as one batch on a model thread as soon as the previous batch ends (greedy
batching, the throughput-optimal rule for a single device), and answers. No checks, no metrics,
no logs: a lower reference, not a product. Like the batcher it freezes its start-up heap, so no
full garbage collection stalls it. With ``--model-process`` the model runs in a child process of
its own, as the batcher's ``--model-process`` runs it (each batch's rows go over a pipe as raw
float32 bytes and come back the same way), so the model's operators never wait for the event
loop's interpreter lock; without it the model shares the interpreter on a thread.
``bench/batcher_serving.py`` runs it as the ``minimal-json`` column, placing the model as it
places the batchers'.

    python bench/minimal_batcher.py PORT_FILE [--max-batch-size 128] [--device cpu]
        [--model-process]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import BufferTooShort, get_context
from multiprocessing.connection import Connection
from pathlib import Path

import numpy as np
import simdjson
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.batcher_process import start_with_port_file  # noqa: E402
from bench.batcher_serving import FEATURES, MODEL_NAME, Served  # noqa: E402


def model_forward(device: str) -> Callable[[np.ndarray], np.ndarray]:
    """The reference MLP on ``device`` with one torch thread, as a function of a batch's rows."""
    import torch

    from bench.reference_mlp import reference_mlp

    torch.set_num_threads(1)
    module = reference_mlp().eval().to(device)

    def forward(rows: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(rows).to(device)).cpu().numpy()

    return forward


def model_child(pipe: Connection, device: str) -> None:
    """The model's process: a batch's rows in as float32 bytes, its outputs back the same way,
    until the server's end of the pipe closes."""
    forward = model_forward(device)
    received = bytearray()  # grown to the largest batch seen; torch reads it without a copy
    pipe.send_bytes(b"ready")
    while True:
        try:
            size = pipe.recv_bytes_into(received)
        except EOFError:
            return
        except BufferTooShort as short:
            received = bytearray(short.args[0])
            size = len(received)
        rows = np.frombuffer(received, dtype=np.float32, count=size // 4).reshape(-1, FEATURES)
        pipe.send_bytes(np.ascontiguousarray(forward(rows), dtype=np.float32).tobytes())


def in_child(device: str) -> Callable[[np.ndarray], np.ndarray]:
    """The forward pass of :func:`model_child` in a process of its own, called from a thread."""
    spawn = get_context("spawn")
    server_end, child_end = spawn.Pipe()
    spawn.Process(target=model_child, args=(child_end, device), daemon=True).start()
    child_end.close()
    if server_end.recv_bytes() != b"ready":
        raise RuntimeError("the model process did not start")

    def forward(rows: np.ndarray) -> np.ndarray:
        server_end.send_bytes(rows.tobytes())
        return np.frombuffer(server_end.recv_bytes(), dtype=np.float32).reshape(-1, FEATURES)

    return forward


def serve(port_file: Path, max_batch_size: int, device: str, model_process: bool) -> None:
    """Serve until killed; the HTTP port goes to ``port_file``."""
    import orjson

    if model_process:
        forward = in_child(device)
        model_thread = ThreadPoolExecutor(1)  # waits on the pipe, the interpreter lock let go
    else:
        import torch

        forward = model_forward(device)
        # torch's thread count is per OS thread under OpenMP: the model thread is given one too
        model_thread = ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(1,))

    waiting: list[tuple[asyncio.Future, np.ndarray]] = []
    running = False

    async def run_batches() -> None:
        nonlocal running
        loop = asyncio.get_running_loop()
        while waiting:
            batch = waiting[:max_batch_size]
            del waiting[:max_batch_size]
            rows = await loop.run_in_executor(
                model_thread, forward, np.concatenate([row for _, row in batch])
            )
            for index, (future, _) in enumerate(batch):
                future.set_result(rows[index : index + 1])
        running = False

    async def infer(request: web.Request) -> web.Response:
        nonlocal running
        row = json_row(await request.read())
        future = asyncio.get_running_loop().create_future()
        waiting.append((future, row))
        if not running:
            running = True
            asyncio.get_running_loop().create_task(run_batches())
        output = {"name": "output", "datatype": "FP32", "shape": [1, FEATURES]}
        output["data"] = await future
        return web.Response(
            body=orjson.dumps(
                {"model_name": MODEL_NAME, "outputs": [output]}, option=orjson.OPT_SERIALIZE_NUMPY
            ),
            content_type="application/json",
        )

    async def main() -> None:
        port = await serve_infer_route(infer)
        gc.collect()  # as the batcher does: no full collection walks the start-up heap
        gc.freeze()
        port_file.write_text(str(port))
        await asyncio.Event().wait()

    asyncio.run(main())


def json_row(body: bytes) -> np.ndarray:
    """The one FP32 input of a JSON request as an array, read as cheaply as this stack allows:
    simdjson copies the numbers into a buffer with no Python object per element (as the batcher
    reads them, :mod:`batcher.json_request`), and nothing is checked."""
    tensor = simdjson.Parser().parse(body)["inputs"][0]
    numbers = np.frombuffer(tensor["data"].as_buffer(of_type="d"), dtype=np.float64)
    return numbers.astype(np.float32).reshape(tensor["shape"].as_list())


async def serve_infer_route(infer: Callable[[web.Request], Awaitable[web.Response]]) -> int:
    """Serve ``infer`` as ``POST /v2/models/reference/infer`` alone, with no access log, on a
    free port of 127.0.0.1 (returned), until the loop ends: all the HTTP a lower reference has."""
    app = web.Application()
    app.router.add_post(f"/v2/models/{MODEL_NAME}/infer", infer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]


class MinimalBatcher(Served):
    """:func:`serve` in a child process."""

    name = "minimal"

    def __init__(
        self, scratch: Path, max_batch_size: int, device: str = "cpu", model_process: bool = False
    ) -> None:
        port_file = scratch / "minimal.port"
        options = ["--max-batch-size", str(max_batch_size), "--device", device]
        if model_process:
            options.append("--model-process")
        self.proc, port = start_with_port_file(
            [sys.executable, __file__, str(port_file), *options], port_file, "minimal batcher", 120
        )
        self.http_port = int(port)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("port_file", type=Path)
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--model-process", action="store_true", help="the model in a child process of its own"
    )
    args = parser.parse_args()
    serve(args.port_file, args.max_batch_size, args.device, args.model_process)
