"""How far any server on this stack could go: the floors under issue 18's serving goals.

Issue 18 asks REST JSON for 2,500 requests per server CPU-second with the reference MLP, and the
binary extension and gRPC each for 1.5x REST JSON's rate. Whether a goal is out of reach for
*any* serving design on aiohttp and grpc.aio is a question about the cheapest server these
libraries allow, not about ours. This bench runs that server, a **floor**: one process answering
``POST /v2/models/reference/infer`` (JSON and binary extension) on aiohttp and ``ModelInfer`` on
grpc.aio with only what every Open Inference Protocol server must do for a one-row request (read
the body, decode the tensor to a numpy array, encode the answer) and nothing else: no model, no
batching, no validation, no metrics, no logging. Beside it, the real batcher serves the reference
MLP on the same ways, and the MLP's own CPU per row is measured at full batches (a child process,
one torch thread, as the batcher runs it). Every way of both servers is loaded with the same
open-loop client (``bench/batcher_serving.py``'s) at the same rates, the points interleaved,
over ``--rounds`` rounds; the figure is server CPU microseconds per answered request.

Why the bounds hold (every cost per request, server CPU):

* **Requests per CPU-second** of any server <= 1e6 / (floor JSON + MLP per row at the largest
  batch): a server must do at least the floor's work and run the model's row.
* **Binary (or gRPC) rate / JSON rate.** A JSON and a binary request differ only in their
  codec: whatever the rest costs (R, at least the floor's) both pay it, so the ratio of their
  costs, (R + json codec) / (R + binary codec), is largest when R is smallest, at the floor. A
  server whose rate its CPU limits serves at a rate inversely proportional to its cost per
  request, so rate ratio <= floor JSON / floor binary, and with the model's row added to both
  (it runs for every request of either way) <= (floor JSON + MLP row) / (floor binary + MLP row).
  gRPC's whole transport differs, so its floor is a whole grpc.aio call: the same argument with
  the gRPC floor.
* **A rate on this machine**, for ``--target-rate`` (say 8x MLServer's top rate from
  ``bench/batcher_serving.py``): the cores it needs at the least are target x (floor JSON + MLP
  row + the client's cost per request), against the machine's cores; and one interpreter's event
  loop (which must do at least the floor's work for each of its requests) is full at
  1e6 / floor JSON requests a second.

    python bench/serving_bounds.py                           # 1,000 and 2,000 req/s, 3 rounds
    python bench/serving_bounds.py --rates 1500 --rounds 5 --target-rate 2304
    python bench/serving_bounds.py --smoke                   # proves it runs (the slow tests)
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.batcher_process import start_with_port_file  # noqa: E402
from bench.batcher_serving import (  # noqa: E402
    BATCHER_MODES,
    FEATURES,
    MODEL_NAME,
    REFERENCE,
    BatcherServer,
    Neighbours,
    Served,
    loadavg,
    model_row_microseconds,
    targets_for,
    warm_rate,
)
from bench.minimal_batcher import json_row, serve_infer_route  # noqa: E402
from bench.report_json import write_report  # noqa: E402

MODES = BATCHER_MODES
HTTP_MODES = ("rest-json", "rest-binary")
RESULTS = ROOT / "bench" / "results" / "serving_bounds.json"
GOAL_REQUESTS_PER_CPU_SECOND = 2500.0
GOAL_RATIO = 1.5
SENSITIVITY_BATCHES = (32, 256, 512)  # the MLP's row at other batches, beside --batch's


# --- the floor server (a child process: ``--serve PORT_FILE``) ------------------------------------


def serve_floor(port_file: Path, hold_seconds: float, stack: str) -> None:
    """Serve the floor on free ports, written to ``port_file`` as JSON, until killed. With
    ``hold_seconds`` every request's decoded row is held until a timer releases all those held
    (a batch), as a batching server must hold it, and only then answered. On ``aiohttp`` the
    floor serves REST and gRPC (grpc.aio), as the batcher does; on ``uvicorn`` (httptools' parser
    under a bare ASGI app, the lightest well-kept asyncio HTTP server) it serves REST alone, to
    show whether another HTTP stack would lower the bounds."""
    import grpc
    import numpy as np
    import orjson
    from aiohttp import web

    from batcher.open_inference import predict_v2_pb2 as pb

    header_length = "Inference-Header-Content-Length"
    held: list[tuple[asyncio.Future, np.ndarray]] = []

    def release() -> None:
        batch = held[:]
        held.clear()
        for future, row in batch:
            future.set_result(row)

    async def hold(row: np.ndarray) -> np.ndarray:
        if hold_seconds <= 0:
            return row
        loop = asyncio.get_running_loop()
        if not held:
            loop.call_later(hold_seconds, release)
        future = loop.create_future()
        held.append((future, row))
        return await future

    async def answer(body: bytes, json_length: str | None) -> tuple[bytes, dict[str, str]]:
        """A one-row request's answer and its headers, whichever stack carried it."""
        if json_length is not None:
            size = int(json_length)
            orjson.loads(body[:size])
            row = np.frombuffer(body, dtype="<f4", offset=size).reshape(1, FEATURES)
            raw = (await hold(row)).tobytes()
            described = {
                "name": "output",
                "datatype": "FP32",
                "shape": [1, FEATURES],
                "parameters": {"binary_data_size": len(raw)},
            }
            head = orjson.dumps({"model_name": MODEL_NAME, "outputs": [described]})
            headers = {header_length: str(len(head)), "Content-Type": "application/octet-stream"}
            return head + raw, headers
        row = await hold(json_row(body))
        output = {"name": "output", "datatype": "FP32", "shape": [1, FEATURES], "data": row}
        answered = {"model_name": MODEL_NAME, "outputs": [output]}
        body = orjson.dumps(answered, option=orjson.OPT_SERIALIZE_NUMPY)
        return body, {"Content-Type": "application/json"}

    async def infer(request: web.Request) -> web.Response:
        body, headers = await answer(await request.read(), request.headers.get(header_length))
        return web.Response(body=body, headers=headers)

    async def model_infer(request: pb.ModelInferRequest, context: object) -> pb.ModelInferResponse:
        row = np.frombuffer(request.raw_input_contents[0], dtype="<f4").reshape(1, FEATURES)
        row = await hold(row)
        response = pb.ModelInferResponse(model_name=MODEL_NAME)
        response.outputs.add(name="output", datatype="FP32", shape=[1, FEATURES])
        response.raw_output_contents.append(row.tobytes())
        return response

    async def serve_aiohttp() -> None:
        http_port = await serve_infer_route(infer)
        server = grpc.aio.server()
        handler = grpc.unary_unary_rpc_method_handler(
            model_infer,
            request_deserializer=pb.ModelInferRequest.FromString,
            response_serializer=pb.ModelInferResponse.SerializeToString,
        )
        service = "inference.GRPCInferenceService"
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler(service, {"ModelInfer": handler})]
        )
        grpc_port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        port_file.write_text(json.dumps({"http": http_port, "grpc": grpc_port}))
        await server.wait_for_termination()

    async def asgi_infer(scope: dict, receive: Callable, send: Callable) -> None:
        # Only the bench's client calls it: one route, every body read whole.
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        sent = dict(scope["headers"]).get(header_length.lower().encode())
        body, headers = await answer(b"".join(chunks), None if sent is None else sent.decode())
        fields = [(k.encode(), v.encode()) for k, v in headers.items()]
        fields.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": fields})
        await send({"type": "http.response.body", "body": body})

    async def serve_uvicorn() -> None:
        import socket

        import uvicorn

        # The protocol named: asyncio sets TCP_NODELAY only on sockets whose ``proto`` says TCP,
        # and an accepted socket inherits it; uvicorn does not set it, so with ``proto`` 0 an
        # answer written in two sends waits for the client's delayed ACK (about 40 ms).
        listening = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        listening.bind(("127.0.0.1", 0))
        listening.listen(1024)
        config = uvicorn.Config(
            asgi_infer, http="httptools", lifespan="off", access_log=False, log_level="warning"
        )
        server = uvicorn.Server(config)
        serving = asyncio.ensure_future(server.serve(sockets=[listening]))
        while not server.started:
            await asyncio.sleep(0.01)
        port_file.write_text(json.dumps({"http": listening.getsockname()[1], "grpc": 0}))
        await serving

    asyncio.run(serve_uvicorn() if stack == "uvicorn" else serve_aiohttp())


class FloorServer(Served):
    """:func:`serve_floor` in a child process."""

    def __init__(
        self, scratch: Path, name: str, hold_seconds: float, stack: str = "aiohttp"
    ) -> None:
        self.name = name
        self.modes = MODES if stack == "aiohttp" else HTTP_MODES
        port_file = scratch / f"{name}.ports"
        command = [sys.executable, __file__, "--serve", str(port_file), "--stack", stack]
        self.proc, written = start_with_port_file(
            [*command, "--hold-seconds", str(hold_seconds)], port_file, f"{name} floor server"
        )
        ports = json.loads(written)
        self.http_port, self.grpc_port = ports["http"], ports["grpc"]


# --- measuring ------------------------------------------------------------------------------------


async def measure(servers: dict[str, Served], args: argparse.Namespace) -> list[dict]:
    """Every (server, way, rate) point of every round, interleaved; each a point's record."""
    targets, closers = {}, []
    for name, server in servers.items():
        found, close = await targets_for(server, None, server.modes)  # type: ignore[arg-type]
        closers.append(close)
        targets.update({(name, mode): target for mode, target in found.items()})
    points: list[dict] = []
    try:
        for target in targets.values():  # connections open, every path warm
            await target.point(warm_rate(min(args.rates)), 1.0, args.slo_seconds, seed=0)
        for index in range(1, args.rounds + 1):
            before = loadavg()
            order = list(targets) if index % 2 else list(reversed(targets))
            for rate in args.rates:
                for name, mode in order:
                    point = await targets[name, mode].point(
                        rate, args.seconds, args.slo_seconds, seed=index
                    )
                    point.update(server=name, round=index)
                    points.append(point)
                    micros = 1e6 * point["server_cpu_seconds"] / max(1, point["answered"])
                    print(
                        f"  round {index} {name:<8} {mode:<12} {rate:6.0f}/s {micros:7.0f} us/req"
                        f"  client {1000 * point['client_cpu_ms_per_request']:5.0f} us"
                        f"  p99 {point['p99_ms']:7.1f} ms  failed {point['failures']}",
                        flush=True,
                    )
            print(f"round {index}: load average {before} -> {loadavg()}", flush=True)
    finally:
        for close in closers:
            await close()
    return points


def costs(points: list[dict]) -> dict[str, dict[str, dict[float, dict]]]:
    """Per server, way and rate: the median server and client microseconds per request over the
    rounds (answered requests only), with their ranges and the failures."""
    grouped: dict[tuple[str, str, float], list[dict]] = {}
    for point in points:
        grouped.setdefault((point["server"], point["mode"], point["rate"]), []).append(point)
    out: dict[str, dict[str, dict[float, dict]]] = {}
    for (server, mode, rate), group in grouped.items():
        server_us = [1e6 * p["server_cpu_seconds"] / max(1, p["answered"]) for p in group]
        client_us = [1000 * p["client_cpu_ms_per_request"] for p in group]
        out.setdefault(server, {}).setdefault(mode, {})[rate] = {
            "server_us": statistics.median(server_us),
            "server_us_range": [min(server_us), max(server_us)],
            "client_us": statistics.median(client_us),
            "p99_ms": [p["p99_ms"] for p in group],
            "failures": sum(p["failures"] for p in group),
            "mean_batch": statistics.median(p["mean_batch_items"] for p in group),
        }
    return out


def bounds(
    floors: dict[str, dict[str, dict[float, dict]]],
    model_us: float,
    cores: int,
    target_rate: float | None,
) -> dict:
    """Each goal's bound from the cheapest floors measured at any rate: the bound most generous
    to the goal. A ratio of two ways is taken within one floor server (one stack, answering at
    once or holding requests for a batch), where the argument that only the codec differs holds,
    and the most generous server's ratio is the bound; a cost is the cheapest of any server.
    Pure arithmetic on the medians, so the tests can check it without a server."""
    cheapest = {
        server: {
            mode: min(costs.values(), key=lambda c: c["server_us"])
            for mode, costs in ways.items()
            if costs
        }
        for server, ways in floors.items()
    }

    def floor(mode: str) -> tuple[str, dict]:
        return min(
            ((server, ways[mode]) for server, ways in cheapest.items() if mode in ways),
            key=lambda found: found[1]["server_us"],
        )

    def ratio(mode: str, model: float) -> float:
        """JSON's floor over ``mode``'s, within each server that answers both; the largest."""
        return max(
            (ways["rest-json"]["server_us"] + model) / (ways[mode]["server_us"] + model)
            for ways in cheapest.values()
            if mode in ways and "rest-json" in ways
        )

    json_floor = floor("rest-json")[1]
    f_json = json_floor["server_us"]
    out = {
        "floor_us": {mode: floor(mode)[1]["server_us"] for mode in MODES},
        "floor_server": {mode: floor(mode)[0] for mode in MODES},
        "model_us_per_row": model_us,
        "requests_per_cpu_second": {
            "bound": 1e6 / (f_json + model_us),
            "model_alone_bound": 1e6 / model_us if model_us > 0 else math.inf,
            "goal": GOAL_REQUESTS_PER_CPU_SECOND,
        },
        "binary_over_json": {
            "bound_without_model": ratio("rest-binary", 0.0),
            "bound": ratio("rest-binary", model_us),
            "goal": GOAL_RATIO,
        },
        "grpc_over_json": {
            "bound_without_model": ratio("grpc", 0.0),
            "bound": ratio("grpc", model_us),
            "goal": GOAL_RATIO,
        },
        "one_interpreter_rate_bound": 1e6 / f_json,
    }
    if target_rate:
        client_us = json_floor["client_us"]
        out["target_rate"] = {
            "rate": target_rate,
            "cores_needed_at_least": target_rate * (f_json + model_us + client_us) / 1e6,
            "server_cores_needed_at_least": target_rate * (f_json + model_us) / 1e6,
            "cores": cores,
            "client_us": client_us,
            "one_interpreter_load": target_rate * f_json / 1e6,
        }
    return out


def beyond_floor(
    batcher: dict[str, dict[float, dict]], floor_us: dict[str, float], model_us: dict[int, float]
) -> dict[str, dict[float, float]]:
    """Per way and rate, what the batcher spends per request beyond the floor's cost and the
    MLP's row at the batch it ran: batching, admission, metrics, its HTTP app, and the slowdown
    the model's memory traffic causes the serving thread on shared cores."""
    return {
        mode: {
            rate: c["server_us"] - floor_us[mode] - model_us[round(c["mean_batch"])]
            for rate, c in rates.items()
            if math.isfinite(c["mean_batch"]) and c["mean_batch"] >= 1
        }
        for mode, rates in batcher.items()
    }


def verdict(bound: float, goal: float) -> str:
    return "reachable" if bound >= goal else "OUT OF REACH"


def print_report(measured: dict, found: dict) -> None:
    print()
    print("server CPU per answered request (median over rounds; client beside it)")
    print(
        f"{'server':<8} {'way':<12} {'rate':>6} {'us/req':>7} {'range':>11} {'client':>7} "
        f"{'p99 ms (rounds)':>22} {'batch':>6} fail"
    )
    for server, modes in measured.items():
        for mode, rates in modes.items():
            for rate, c in sorted(rates.items()):
                low, high = c["server_us_range"]
                p99 = "/".join(f"{ms:.0f}" for ms in c["p99_ms"])
                print(
                    f"{server:<8} {mode:<12} {rate:6.0f} {c['server_us']:7.0f} "
                    f"{f'{low:.0f}-{high:.0f}':>11} {c['client_us']:7.0f} {p99:>22} "
                    f"{c['mean_batch']:6.1f} {c['failures']}"
                )
    f = found["floor_us"]
    print()
    by = found["floor_server"]
    print(
        f"floors: JSON {f['rest-json']:.0f} us ({by['rest-json']}), binary "
        f"{f['rest-binary']:.0f} us ({by['rest-binary']}), gRPC {f['grpc']:.0f} us ({by['grpc']}); "
        f"MLP alone {found['model_us_per_row']:.0f} us a row at full batch"
    )
    print(f"{'goal':<34} {'bound':>10} {'goal':>8}  verdict")
    per_cpu = found["requests_per_cpu_second"]
    rows = [
        ("REST JSON requests per CPU-second", per_cpu["bound"], per_cpu["goal"]),
        ("  the same, a server costing nothing", per_cpu["model_alone_bound"], per_cpu["goal"]),
    ]
    for key, label in (
        ("binary_over_json", "binary / JSON rate"),
        ("grpc_over_json", "gRPC / JSON rate"),
    ):
        rows.append((f"{label} (model included)", found[key]["bound"], found[key]["goal"]))
        rows.append(
            (f"{label} (model free)", found[key]["bound_without_model"], found[key]["goal"])
        )
    for label, bound, goal in rows:
        print(f"{label:<34} {bound:>10.2f} {goal:>8.2f}  {verdict(bound, goal)}")
    full = found["one_interpreter_rate_bound"]
    print(f"one interpreter's loop is full at {full:.0f} req/s of REST JSON")
    target = found.get("target_rate")
    if target:
        print(
            f"{target['rate']:.0f} req/s needs at least {target['cores_needed_at_least']:.2f} of "
            f"{target['cores']} cores (server {target['server_cores_needed_at_least']:.2f}, client "
            f"{target['client_us']:.0f} us a request) and loads one interpreter to "
            f"{target['one_interpreter_load']:.2f}"
        )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rates", default="1000,2000", help="requests per second, comma-separated")
    parser.add_argument("--seconds", type=float, default=4.0, help="per point")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--slo-seconds", type=float, default=0.1)
    parser.add_argument(
        "--batch", type=int, default=128, help="the batch the MLP's row is timed at"
    )
    parser.add_argument("--target-rate", type=float, help="a rate to size (say 8x MLServer's)")
    parser.add_argument("--no-batcher", action="store_true", help="floors only")
    parser.add_argument(
        "--batcher-model",
        default=REFERENCE,
        help="the batcher's model (bench.reference_mlp:identity: what our code adds to the floor)",
    )
    parser.add_argument("--smoke", action="store_true", help="one short round: proves it runs")
    parser.add_argument("--json", type=Path, default=RESULTS)
    parser.add_argument(
        "--hold-ms",
        type=float,
        default=10.0,
        help="the held floor releases its requests every so many ms (0: no held floor)",
    )
    parser.add_argument(
        "--uvicorn",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also the REST floor on uvicorn (httptools): does another HTTP stack lower the bounds",
    )
    parser.add_argument("--serve", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--stack", choices=("aiohttp", "uvicorn"), help=argparse.SUPPRESS)
    parser.add_argument("--hold-seconds", type=float, default=0.0, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        serve_floor(args.serve, args.hold_seconds, args.stack)
        return 0
    try:
        args.rates = [float(r) for r in args.rates.split(",") if r]
    except ValueError:
        parser.error(
            f"--rates takes numbers separated by commas, e.g. 1000,2000; got {args.rates!r}"
        )
    if not args.rates or min(args.rates) <= 0 or args.rounds < 1 or args.seconds <= 0:
        parser.error("--rates, --rounds and --seconds must be positive")
    if args.batch < 1:
        parser.error("--batch must be at least 1")
    if args.uvicorn and not all(map(importlib.util.find_spec, ("uvicorn", "httptools"))):
        parser.error("the uvicorn floor needs uvicorn and httptools: pip install -e '.[test]'")
    if args.smoke:
        args.rates, args.rounds, args.seconds, model_seconds = [50.0], 1, 0.5, 0.1
    else:
        model_seconds = 2.0
    neighbours = Neighbours()
    servers: dict[str, Served] = {}
    with tempfile.TemporaryDirectory(prefix="serving-bounds-") as scratch:
        try:
            servers["floor"] = FloorServer(Path(scratch), "floor", 0.0, "aiohttp")
            if args.hold_ms > 0:
                servers["held"] = FloorServer(Path(scratch), "held", args.hold_ms / 1000, "aiohttp")
            if args.uvicorn:
                servers["uvicorn"] = FloorServer(Path(scratch), "uvicorn", 0.0, "uvicorn")
            if not args.no_batcher:
                extra = ["--max-batch-size", "128", "--max-queue", "4096"]
                servers["batcher"] = BatcherServer(extra, model=args.batcher_model)
            load_before = loadavg()
            points = asyncio.run(measure(servers, args))
            other_cores = neighbours.cores()  # while the servers still count as this tree's
        finally:
            for server in servers.values():
                server.stop()
    load_after = loadavg()
    measured = costs(points)
    batches = {
        round(c["mean_batch"])
        for c in (c for ways in measured.get("batcher", {}).values() for c in ways.values())
        if math.isfinite(c["mean_batch"]) and c["mean_batch"] >= 1
    }
    sizes = sorted({args.batch, *SENSITIVITY_BATCHES, *batches})
    model_us = model_row_microseconds(sizes, model_seconds)
    floors = {n: ways for n, ways in measured.items() if n != "batcher"}
    cores = os.cpu_count() or 1
    found = bounds(floors, model_us[args.batch], cores, args.target_rate)
    print_report(measured, found)
    per_cpu = {size: 1e6 / (found["floor_us"]["rest-json"] + us) for size, us in model_us.items()}
    print(
        "the MLP's row at other batches, and the requests per CPU-second bound with it: "
        + ", ".join(f"{size}: {model_us[size]:.0f} us, {per_cpu[size]:.0f}" for size in sizes)
    )
    overhead = {}
    if "batcher" in measured and args.batcher_model == REFERENCE:
        overhead = beyond_floor(measured["batcher"], found["floor_us"], model_us)
        print("the batcher beyond the floor and the MLP's row at its batch (us a request):")
        for mode, rates in overhead.items():
            print(f"  {mode:<12} " + ", ".join(f"{r:.0f}/s: {us:.0f}" for r, us in rates.items()))
    print(f"load average {load_before} -> {load_after}; other work took {other_cores:.2f} cores")
    write_report(
        args.json,
        {
            "rates": args.rates,
            "seconds_per_point": args.seconds,
            "rounds": args.rounds,
            "smoke": args.smoke,
            "loadavg_before": load_before,
            "loadavg_after": load_after,
            "other_cores": other_cores,
            "cores": cores,
            "batch": args.batch,
            "measured": {
                s: {m: {str(r): c for r, c in v.items()} for m, v in d.items()}
                for s, d in measured.items()
            },
            "bounds": found,
            "model_us_per_row_by_batch": {str(size): us for size, us in model_us.items()},
            "requests_per_cpu_second_bound_by_batch": {str(k): v for k, v in per_cpu.items()},
            "batcher_beyond_floor_us": {
                m: {str(r): us for r, us in rates.items()} for m, rates in overhead.items()
            },
            "points": points,
        },
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
