"""CPU per request of this project's own serving code, in-process: no sockets, no HTTP library.

Times (``time.process_time``, all threads; best of five runs of a few thousand calls) each step a
one-row reference-MLP request (512 FP32 in, 512 out) takes through our code: the JSON, binary and
gRPC codecs one way and the other, and the engine (admission, queue, dispatch, the hand-off to
the model thread and back, metrics) with an identity model, with 1, 8 and 64 requests in flight
(batches of about that many rows). ``--tree DIR`` measures another source tree (an older
revision exported with ``git archive``), so two trees compare in two runs side by side.

    python bench/serving_path_parts.py
    python bench/serving_path_parts.py --tree /tmp/old
    python bench/serving_path_parts.py --smoke       # proves it runs (the slow tests)
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

FEATURES = 512
RESULTS = Path(__file__).resolve().parent / "results" / "serving_path_parts.json"


def best_of(fn: Callable[[], object], calls: int, runs: int) -> float:
    """Microseconds of CPU per call, the best of ``runs``."""
    best = float("inf")
    for _ in range(runs):
        start = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - start) / calls * 1e6)
    return best


def codec_steps(calls: int, runs: int) -> dict[str, float]:
    from tritonclient.grpc import service_pb2

    from batcher import grpc_server, oip
    from batcher.model import TensorSpec
    from batcher.open_inference import predict_v2_pb2 as pb

    specs = [TensorSpec("input", "FP32", (FEATURES,))]
    row = np.random.default_rng(0).normal(size=(1, FEATURES)).astype(np.float32).round(4)
    result = {"input": row}
    tensor = {"name": "input", "shape": [1, FEATURES], "datatype": "FP32"}
    json_body = json.dumps({"inputs": [{**tensor, "data": row.tolist()}]}).encode()
    raw = row.astype("<f4").tobytes()
    header = json.dumps(
        {
            "inputs": [{**tensor, "parameters": {"binary_data_size": len(raw)}}],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    raw_message = service_pb2.ModelInferRequest(model_name="reference")
    raw_message.inputs.add(name="input", datatype="FP32", shape=[1, FEATURES])
    raw_message.raw_input_contents.append(raw)
    typed_message = service_pb2.ModelInferRequest(model_name="reference")
    typed = typed_message.inputs.add(name="input", datatype="FP32", shape=[1, FEATURES])
    typed.contents.fp32_contents.extend(row.ravel().tolist())
    grpc_raw = pb.ModelInferRequest.FromString(raw_message.SerializeToString())
    grpc_typed = pb.ModelInferRequest.FromString(typed_message.SerializeToString())
    as_json = oip.parse_infer_request(json_body, None, specs, specs)
    as_binary = oip.parse_infer_request(header + raw, str(len(header)), specs, specs)
    as_grpc = grpc_server.decode_infer_request(grpc_raw, specs, specs)

    def best(fn: Callable[[], object]) -> float:
        return best_of(fn, calls, runs)

    return {
        "REST JSON: decode": best(lambda: oip.parse_infer_request(json_body, None, specs, specs)),
        "REST JSON: encode": best(lambda: oip.encode_infer_response("m", as_json, result)),
        "REST binary: decode": best(
            lambda: oip.parse_infer_request(header + raw, str(len(header)), specs, specs)
        ),
        "REST binary: encode": best(lambda: oip.encode_infer_response("m", as_binary, result)),
        "gRPC raw: decode": best(lambda: grpc_server.decode_infer_request(grpc_raw, specs, specs)),
        "gRPC typed contents: decode": best(
            lambda: grpc_server.decode_infer_request(grpc_typed, specs, specs)
        ),
        "gRPC: encode": best(lambda: grpc_server.encode_infer_response("m", as_grpc, result)),
    }


async def engine_cost(in_flight: int, requests: int, runs: int) -> tuple[float, float]:
    """(CPU microseconds per request, mean batch size) through a warmed engine."""
    from prometheus_client import CollectorRegistry

    from batcher.config import BatcherConfig
    from batcher.engine import from_config
    from batcher.execution import ThreadExecutor
    from batcher.metrics import BatcherMetrics

    config = BatcherConfig(max_batch_size=128, max_queue=4096)
    metrics = BatcherMetrics(CollectorRegistry(), "reference", config.slo_seconds, 128)
    batcher = from_config(
        ThreadExecutor(lambda payloads: payloads), config, model_device="cpu", metrics=metrics
    )
    payload = {"input": np.zeros((1, FEATURES), np.float32)}
    await batcher.calibrate(lambda size: [payload] * size, [1, 2, 4, 8, 16, 32, 64, 128], 2)
    await batcher.start()

    async def client(count: int) -> None:
        for _ in range(count):
            await batcher.submit(payload)

    best = float("inf")
    batches_before = batcher.batches
    for _ in range(runs):
        start = time.process_time()
        await asyncio.gather(*(client(requests // in_flight) for _ in range(in_flight)))
        best = min(best, (time.process_time() - start) / requests * 1e6)
    mean_batch = runs * requests / max(1, batcher.batches - batches_before)
    await batcher.drain(5.0)
    return best, mean_batch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tree", type=Path, default=Path(__file__).resolve().parents[1])
    parser.add_argument("--smoke", action="store_true", help="a few calls: proves it runs")
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    calls, runs, requests = (64, 1, 128) if args.smoke else (3000, 5, 3000)
    if not (args.tree / "batcher" / "oip.py").is_file():
        parser.error(f"--tree {args.tree} holds no batcher/oip.py; give a source tree")
    # this file's folder would shadow the batcher package with bench/batcher.py
    here = Path(__file__).resolve().parent
    sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != here]
    sys.path.insert(0, str(args.tree.resolve()))
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    print(f"tree {args.tree}, load average {load}")
    steps = codec_steps(calls, runs)
    batches = {}
    for in_flight in (1, 8, 64):
        micros, batches[in_flight] = asyncio.run(engine_cost(in_flight, requests, runs))
        steps[f"engine, {in_flight} in flight"] = micros
    print(f"{'step':<36} {'CPU us per request':>18}")
    for step, micros in steps.items():
        print(f"{step:<36} {micros:>18.1f}")
    print("mean batch size, by requests in flight: " + str(batches))
    report = {
        "tree": str(args.tree.resolve()),
        "smoke": args.smoke,
        "loadavg": load,
        "calls_per_run": calls,
        "runs": runs,
        "us_per_request": steps,
        "mean_batch_by_in_flight": batches,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
