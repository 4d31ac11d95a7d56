"""Where ``--device auto`` puts a torch model: the device check's look at the batcher's
torch-free start (docs/batcher.md, "Models that are not torch modules").

Since the batcher stopped importing torch for every model, ``auto`` is settled where the model
is known: in the server for a model it loads itself, in the child with ``--model-process``. On a
machine without CUDA the tests cover both; this runs them where CUDA is, as part of
``bench/device-check-serving``: the demo model (a torch module) under the default ``--device
auto``, in the server and in a child, must report ``cuda`` and answer a request. On a machine
without CUDA it expects ``cpu`` instead, which is how it is checked here.

    python bench/device_auto.py --json bench/results/device_auto.json
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.batcher_process import BatcherProcess  # noqa: E402

READY_SECONDS = 180.0


def serve_once(model_process: bool) -> dict:
    """Start the demo model with ``--device auto``, send one request, stop: what it reported."""
    args = ["--model", "batcher.models.demo:factory", "--listen", "127.0.0.1:0"]
    try:
        server = BatcherProcess(
            [*args, *(["--model-process"] if model_process else [])], READY_SECONDS
        )
    except RuntimeError as exc:
        return {"model_process": model_process, "error": str(exc)}
    try:
        row = {"name": "input", "shape": [1, 16], "datatype": "FP32", "data": [0.5] * 16}
        request = urllib.request.Request(
            f"http://127.0.0.1:{server.port}/v2/models/demo/infer",
            data=json.dumps({"inputs": [row]}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            answer = json.loads(reply.read())
        loaded = server.startup_record("model process ready" if model_process else "model loaded")
        return {
            "model_process": model_process,
            "device": (loaded or {}).get("device"),
            "answered": answer["outputs"][0]["shape"] == [1, 4],
        }
    finally:
        server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", type=Path, default=ROOT / "bench/results/device_auto.json")
    args = parser.parse_args(argv)
    import torch

    expected = "cuda" if torch.cuda.is_available() else "cpu"
    runs = [serve_once(model_process) for model_process in (False, True)]
    print(f"{'where the model runs':<24} {'device':<8} answered  (expected {expected})")
    for run in runs:
        where = "child (--model-process)" if run["model_process"] else "server"
        print(f"{where:<24} {run.get('device') or run.get('error')!s:<8} {run.get('answered')}")
    ok = all(run.get("device") == expected and run.get("answered") for run in runs)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"expected": expected, "runs": runs, "ok": ok}, indent=2))
    print(f"--device auto settles on {expected} in both: {'yes' if ok else 'NO'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
