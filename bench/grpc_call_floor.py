"""What a gRPC call costs a Python server with an empty handler: the floor under the gRPC face.

Issue 18 asks gRPC for 1.5x the REST JSON rate. A server whose CPU is the limit serves at a rate
inversely proportional to its CPU per request, so gRPC would have to cost at most two thirds of
what a REST JSON request costs the batcher. This bench measures the part no handler code can
remove: server CPU microseconds per answered ``ModelInfer`` of an *empty* unary handler (a canned
response) in each way Python can serve gRPC, next to the real batcher's gRPC and REST JSON paths
(``bench.reference_mlp:identity``: the model does no work), all under the same open-loop client
(``bench/batcher_serving.py``'s), one point each per round, the rounds interleaved:

* ``aio``          -- ``grpc.aio`` server on ``asyncio.run`` (what ``batcher/grpc_server.py`` is)
* ``aio-uvloop``   -- the same on ``uvloop.run`` (skipped when uvloop is not installed)
* ``sync``         -- ``grpc.server`` with a ThreadPoolExecutor, the handler answers in its thread
* ``sync-bridge``  -- the same, the handler awaiting a coroutine on an asyncio loop thread
                      (``run_coroutine_threadsafe``: how a sync server would reach the engine)
* ``sync-queue``   -- the cheapest such hand-off: calls queued for the loop, which is woken once
                      for all those queued meanwhile, and answers each waiting thread's lock
* ``batcher-grpc`` / ``batcher-rest-json`` -- ``autoglm-batcher`` from this tree

    python bench/grpc_call_floor.py                      # 3 rounds at 400 req/s, 4 s a point
    python bench/grpc_call_floor.py --rate 1000 --rounds 5
    python bench/grpc_call_floor.py --smoke              # proves it runs (the slow tests)
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import statistics
import sys
import tempfile
import threading
from concurrent import futures
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from bench.batcher_process import start_with_port_file  # noqa: E402
from bench.batcher_serving import Served, loadavg  # noqa: E402
from bench.report_json import write_report  # noqa: E402
from bench.serving_cost_ab import (  # noqa: E402
    IDENTITY,
    TreeServer,
    interleaved_rounds,
    round_arguments,
    smoke_rounds,
)

FLOORS = ("aio", "aio-uvloop", "sync", "sync-bridge", "sync-queue")
BATCHER = ("batcher-grpc", "batcher-rest-json")
STYLES = FLOORS + BATCHER
RESULTS = ROOT / "bench" / "results" / "grpc_call_floor.json"
SERVICE = "inference.GRPCInferenceService"


def _handler(fn: object) -> grpc.RpcMethodHandler:
    """``ModelInfer`` parsed and answered with the protocol's messages, as the servicer is."""
    from batcher.open_inference import predict_v2_pb2 as pb

    return grpc.unary_unary_rpc_method_handler(
        fn,  # type: ignore[arg-type]
        request_deserializer=pb.ModelInferRequest.FromString,
        response_serializer=pb.ModelInferResponse.SerializeToString,
    )


def _canned() -> object:
    """The answer the batcher gives the bench's request: one FP32 row of 512 values."""
    from batcher.open_inference import predict_v2_pb2 as pb

    response = pb.ModelInferResponse(model_name="reference", model_version="1")
    response.outputs.add(name="output", datatype="FP32", shape=[1, 512])
    response.raw_output_contents.append(bytes(4 * 512))
    return response


def serve(style: str, port_file: Path) -> None:
    """Run one empty server until killed; its port goes to ``port_file``."""
    response = _canned()
    options = [("grpc.so_reuseport", 0)]
    if style.startswith("aio"):

        async def infer(request: object, context: object) -> object:
            return response

        async def main() -> None:
            server = grpc.aio.server(options=options)
            handlers = {"ModelInfer": _handler(infer)}
            generic = grpc.method_handlers_generic_handler(SERVICE, handlers)
            server.add_generic_rpc_handlers([generic])
            port = server.add_insecure_port("127.0.0.1:0")
            await server.start()
            port_file.write_text(str(port))
            await server.wait_for_termination()

        if style == "aio-uvloop":
            import uvloop

            uvloop.run(main())
        else:
            asyncio.run(main())
        return
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def on_loop(request: object) -> object:
        return response

    def infer_here(request: object, context: object) -> object:
        return response

    def infer_on_loop(request: object, context: object) -> object:
        return asyncio.run_coroutine_threadsafe(on_loop(request), loop).result()

    queued: collections.deque[tuple[object, list[object], threading.Lock]] = collections.deque()

    def drain() -> None:
        while queued:
            _request, answer, done = queued.popleft()
            answer.append(response)
            done.release()

    def infer_queued(request: object, context: object) -> object:
        done = threading.Lock()
        done.acquire()
        answer: list[object] = []
        wake = not queued  # a drain is already due when calls are waiting
        queued.append((request, answer, done))
        if wake:
            loop.call_soon_threadsafe(drain)
        done.acquire()
        return answer[0]

    fn = {"sync": infer_here, "sync-bridge": infer_on_loop, "sync-queue": infer_queued}[style]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=options)
    handlers = {"ModelInfer": _handler(fn)}
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(SERVICE, handlers)])
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    port_file.write_text(str(port))
    server.wait_for_termination()


class FloorServer(Served):
    """This script's ``--serve STYLE`` in a child process."""

    def __init__(self, style: str, scratch: Path) -> None:
        self.name = style
        port_file = scratch / f"{style}.port"
        self.proc, port = start_with_port_file(
            [sys.executable, __file__, "--serve", style, "--port-file", str(port_file)],
            port_file,
            f"{style} server",
        )
        self.grpc_port = int(port)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--styles", default=",".join(STYLES))
    round_arguments(parser, RESULTS)
    parser.add_argument("--serve", choices=FLOORS, help=argparse.SUPPRESS)
    parser.add_argument("--port-file", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.serve, args.port_file)
        return 0
    smoke_rounds(args)
    styles = [s for s in args.styles.split(",") if s]
    unknown = [s for s in styles if s not in STYLES]
    if unknown or not styles:
        parser.error(f"--styles takes {','.join(STYLES)}; got {args.styles!r}")
    if "aio-uvloop" in styles:
        try:
            import uvloop  # noqa: F401
        except ImportError:
            print("uvloop is not installed: aio-uvloop skipped", flush=True)
            styles.remove("aio-uvloop")
    ways = [(style, "rest-json" if style == "batcher-rest-json" else "grpc") for style in styles]
    servers: dict[str, Served] = {}
    with tempfile.TemporaryDirectory(prefix="grpc-floor-") as scratch:
        try:
            batcher = None
            for style in styles:
                if style in BATCHER:
                    if batcher is None:
                        extra = ["--max-batch-size", "128", "--max-queue", "4096"]
                        batcher = TreeServer(ROOT, IDENTITY, [*extra, "--warmup-repeats", "1"])
                    servers[style] = batcher
                else:
                    servers[style] = FloorServer(style, Path(scratch))
            load_before = loadavg()
            by_way, failed_by_way = asyncio.run(
                interleaved_rounds(servers, ways, args.rounds, args.rate, args.seconds)
            )
        finally:
            for server in {id(s): s for s in servers.values()}.values():
                server.stop()
    costs = {style: by_way[style, mode] for style, mode in ways}
    failed = {style: failed_by_way[style, mode] for style, mode in ways}
    load_after = loadavg()
    print(f"server CPU per answered call at {args.rate:.0f}/s, load {load_before} -> {load_after}")
    medians = {style: statistics.median(values) for style, values in costs.items()}
    json_cost = medians.get("batcher-rest-json")
    print(f"{'server':<18} {'us/call':>8} {'range':>13}  {'/ batcher REST JSON':>20}")
    for style, values in costs.items():
        share = f"{medians[style] / json_cost:.2f}" if json_cost else "-"
        spread = f"{min(values):.0f}-{max(values):.0f}"
        print(f"{style:<18} {medians[style]:>8.0f} {spread:>13}  {share:>20}")
    write_report(
        args.json,
        {
            "rate": args.rate,
            "seconds_per_point": args.seconds,
            "rounds": args.rounds,
            "smoke": args.smoke,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "us_per_call": costs,
            "median_us_per_call": medians,
            "failed_calls": failed,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
