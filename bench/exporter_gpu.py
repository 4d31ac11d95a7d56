"""On a GPU machine: does the exporter agree with nvidia-smi? One prepared run, table + JSON.

The exporter claims to stand in for dcgm-exporter; its NVML readings are only tested against a
patched NVML on machines without GPUs. This script is the check on real hardware: it starts the
exporter on NVML, puts load on every GPU with torch (so utilization, power and clocks move), and
samples ``nvidia-smi --query-gpu`` and ``/metrics`` side by side. For each field it reports the
largest difference seen per GPU against a tolerance that allows for the two tools sampling a
moving value at different instants (and averaging power and utilization over different windows);
totals, limits and memory clock must agree almost exactly. It also records how long the
exporter's collections take on real NVML.

    python bench/exporter_gpu.py [--samples 20] [--json bench/results/exporter-gpu.json]
    python bench/exporter_gpu.py --exporter-url http://127.0.0.1:9400   # one already running

Exit code 0 when every compared field is within its tolerance, 1 otherwise, 2 when no GPU
could be compared. ``--nvidia-smi`` and ``--no-load`` let the test suite run it without a GPU.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import requests
from prometheus_client.parser import text_string_to_metric_families

REPO_ROOT = Path(__file__).resolve().parents[1]
# Run as a script, this folder comes first on the path, where bench/exporter.py would shadow the
# exporter package.
if sys.path and Path(sys.path[0]).resolve() == Path(__file__).resolve().parent:
    sys.path[0] = str(REPO_ROOT)

from autoglm.ports import free_port  # noqa: E402
from exporter.nvidia_smi import (  # noqa: E402
    SMI_FIELDS,
    FieldResult,
    compare,
    parse_exporter,
    parse_nvidia_smi,
)


@contextmanager
def nvml_exporter(interval: float) -> Iterator[str]:
    """The real exporter on NVML in its own process; yields its URL."""
    port = free_port()
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "exporter.cli", "--source", "nvml", "--no-kubernetes"),
            *("--listen", f"127.0.0.1:{port}", "--interval", str(interval)),
        ],
        cwd=REPO_ROOT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the exporter exited with code {proc.returncode}")
            try:
                if requests.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError("the exporter did not become ready within 60 s")
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=30)


@contextmanager
def gpu_load(enabled: bool) -> Iterator[int]:
    """Matrix products on every CUDA device until the block ends; yields the device count."""
    if not enabled:
        yield 0
        return
    import torch

    if not torch.cuda.is_available():
        yield 0
        return
    stop = threading.Event()

    def burn(index: int) -> None:
        with torch.cuda.device(index):
            a = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
            while not stop.is_set():
                for _ in range(20):
                    a = (a @ a).clamp_(-1, 1)
                torch.cuda.synchronize()

    threads = [
        threading.Thread(target=burn, args=(i,), daemon=True)
        for i in range(torch.cuda.device_count())
    ]
    for t in threads:
        t.start()
    try:
        time.sleep(3)  # clocks and power settle
        yield len(threads)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)


def collection_duration(text: str) -> float | None:
    """How long the exporter's last collection took, from its own gauge."""
    for family in text_string_to_metric_families(text):
        if family.name == "autoglm_exporter_collection_duration_seconds":
            return family.samples[0].value
    return None


def sample_pairs(
    url: str, nvidia_smi: str, samples: int, pause: float
) -> tuple[list[tuple[dict, dict]], list[float]]:
    """(nvidia-smi, exporter) readings taken back to back, and the collection durations seen."""
    query = [nvidia_smi, f"--query-gpu={','.join(SMI_FIELDS)}", "--format=csv,noheader,nounits"]
    pairs, durations = [], []
    for _ in range(samples):
        smi = subprocess.run(query, capture_output=True, text=True, timeout=60, check=True).stdout
        exported = requests.get(url + "/metrics", timeout=10).text
        pairs.append((parse_nvidia_smi(smi), parse_exporter(exported)))
        duration = collection_duration(exported)
        if duration is not None:
            durations.append(duration)
        time.sleep(pause)
    return pairs, durations


def print_table(results: list[FieldResult]) -> None:
    print(f"{'field':<32} {'gpu':<14} {'samples':>7} {'worst diff':>11} {'allowed':>9}  ok")
    for r in sorted(results, key=lambda r: (r.field, r.gpu)):
        print(
            f"{r.field:<32} {r.gpu[:14]:<14} {r.samples:>7} {r.worst_difference:>11.2f} "
            f"{r.allowed_at_worst:>9.2f}  {'yes' if r.within else 'NO'}"
        )


def run(args: argparse.Namespace, exporter: Callable[[], Iterator[str]]) -> int:
    with exporter() as url, gpu_load(not args.no_load) as loaded:
        pairs, durations = sample_pairs(url, args.nvidia_smi, args.samples, args.pause)
    results = compare(pairs)
    print_table(results)
    slowest = max(durations, default=None)
    print(f"GPUs under load: {loaded}; slowest collection seen: {slowest} s")
    report = {
        "samples": args.samples,
        "gpus_loaded": loaded,
        "collection_seconds": durations,
        "fields": [asdict(r) for r in results],
        "all_within": bool(results) and all(r.within for r in results),
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.json}")
    if not results:
        print("no GPU could be compared (nvidia-smi and the exporter share no UUID)")
        return 2
    return 0 if report["all_within"] else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--samples", type=int, default=20)
    parser.add_argument("--pause", type=float, default=0.5, help="seconds between samples")
    parser.add_argument("--interval", type=float, default=1.0, help="the exporter's --interval")
    parser.add_argument("--exporter-url", help="compare an exporter already running here")
    parser.add_argument("--nvidia-smi", default="nvidia-smi", help="the nvidia-smi to run")
    parser.add_argument("--no-load", action="store_true", help="do not load the GPUs")
    parser.add_argument("--json", default=str(REPO_ROOT / "bench/results/exporter-gpu.json"))
    parser.add_argument("--smoke", action="store_true", help="3 samples, short pauses")
    args = parser.parse_args(argv)
    if args.smoke:
        args.samples, args.pause = 3, 0.1

    @contextmanager
    def given() -> Iterator[str]:
        yield args.exporter_url

    return run(args, given if args.exporter_url else lambda: nvml_exporter(args.interval))


if __name__ == "__main__":
    raise SystemExit(main())
