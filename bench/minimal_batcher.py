"""The simplest batching server the serving bench can hold the batcher against.

``autoglm-batcher`` does much around each request: admission against the SLO, priorities, the
best-effort lane, deadline-aware dispatch, validation against the model's signature, metrics,
memory caps. Whether that work, or the HTTP stack and the machine underneath, is what limits
the rate it holds is answered by serving the same model with none of it: this server reads a KServe
v2 JSON request on aiohttp, holds its row while the model is busy, runs every row waiting (up to
the maximum batch) as one batch on a model thread as soon as the previous batch ends (greedy
batching, the throughput-optimal rule for a single device), and answers. No checks, no metrics,
no logs: a lower reference, not a product. Like the batcher it freezes its start-up heap, so no
full garbage collection stalls it; unlike the batcher's ``--model-process`` its model shares the
interpreter. ``bench/batcher_serving.py`` runs it as the ``minimal-json`` column.

    python bench/minimal_batcher.py PORT_FILE [--max-batch-size 128] [--device cpu]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import sys
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.batcher_process import start_with_port_file  # noqa: E402
from bench.batcher_serving import FEATURES, MODEL_NAME, Served  # noqa: E402


def serve(port_file: Path, max_batch_size: int, device: str) -> None:
    """Serve until killed; the HTTP port goes to ``port_file``."""
    import numpy as np
    import orjson
    import torch

    from bench.reference_mlp import reference_mlp

    torch.set_num_threads(1)
    module = reference_mlp().eval().to(device)
    # torch's thread count is per OS thread under OpenMP: the model thread is given one too
    model_thread = ThreadPoolExecutor(1, initializer=torch.set_num_threads, initargs=(1,))

    def forward(rows: np.ndarray) -> np.ndarray:
        with torch.inference_mode():
            return module(torch.from_numpy(rows).to(device)).cpu().numpy()

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
        tensor = orjson.loads(await request.read())["inputs"][0]
        row = np.asarray(tensor["data"], dtype=np.float32).reshape(tensor["shape"])
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

    def __init__(self, scratch: Path, max_batch_size: int, device: str = "cpu") -> None:
        port_file = scratch / "minimal.port"
        options = ["--max-batch-size", str(max_batch_size), "--device", device]
        self.proc, port = start_with_port_file(
            [sys.executable, __file__, str(port_file), *options], port_file, "minimal batcher", 120
        )
        self.http_port = int(port)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("port_file", type=Path)
    parser.add_argument("--max-batch-size", type=int, default=128)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    serve(args.port_file, args.max_batch_size, args.device)
