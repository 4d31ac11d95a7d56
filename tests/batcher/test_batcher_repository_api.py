"""The model repository extension through unchanged tritonclient HTTP and gRPC clients, against
a real ``autoglm-batcher --model-repository`` process (slow: it starts the CLI)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np
import pytest
import requests
import tritonclient.grpc as triton_grpc
import tritonclient.http as triton_http
from tritonclient.utils import InferenceServerException

from batcher.models.demo import factory
from batcher.repository_loader import module_bytes
from tests.batcher.test_batcher_cli import LogReader, _alive, batcher_process
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

DEMO = "model: batcher.models.demo:factory\nwarmup_repeats: 1\n"


def write_repository(folder: Path) -> None:
    for name, extra in (
        ("alpha", "max_batch_size: 8\nslo_seconds: 0.5\n"),
        ("beta", "max_batch_size: 4\nmodel_process: true\n"),  # in a process of its own
        ("gamma", ""),
    ):
        (folder / name).mkdir()
        (folder / name / "config.yaml").write_text(DEMO + extra)
    (folder / "misplaced").mkdir()
    (folder / "misplaced" / "config.yaml").write_text(DEMO + "listen: ':9'\n")


@pytest.fixture
def repository_server(tmp_path):
    write_repository(tmp_path)
    two_models = 2.5 * module_bytes(factory())  # room for two demo models, not three
    proc = batcher_process(
        "--model-repository",
        str(tmp_path),
        "--startup-models",
        "alpha",
        "--repository-memory-bytes",
        str(int(two_models)),
        "--listen",
        "127.0.0.1:0",
        "--grpc-listen",
        "127.0.0.1:0",
        "--log-format",
        "json",
        "--device",
        "cpu",  # beta's model_process serves CPU models
    )
    logs = LogReader(proc)
    try:
        grpc_port = logs.wait_for("serving grpc")["port"]
        http_port = logs.wait_for("serving")["port"]
        yield f"127.0.0.1:{http_port}", f"127.0.0.1:{grpc_port}", logs
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()


def infer_http(client: triton_http.InferenceServerClient, model: str) -> np.ndarray:
    data = np.ones((2, 16), dtype=np.float32)
    tensor = triton_http.InferInput("input", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    return client.infer(model, [tensor]).as_numpy("logits")


def states(index: list[dict]) -> dict[str, str]:
    return {entry["name"]: entry["state"] for entry in index}


def test_index_load_and_unload_through_tritonclient_http(repository_server) -> None:
    http_url, _, _ = repository_server
    client = triton_http.InferenceServerClient(http_url)
    assert states(client.get_model_repository_index()) == {
        "alpha": "READY",
        "beta": "UNAVAILABLE",
        "gamma": "UNAVAILABLE",
        "misplaced": "UNAVAILABLE",
    }
    assert infer_http(client, "alpha").shape == (2, 4)
    with pytest.raises(InferenceServerException, match="unavailable: not loaded"):
        infer_http(client, "beta")

    client.load_model("beta")  # while alpha serves
    assert client.is_model_ready("beta")
    assert infer_http(client, "beta").shape == (2, 4)

    with pytest.raises(InferenceServerException, match=r"needs about .* MiB") as refused:
        client.load_model("gamma")
    assert "--repository-memory-bytes" in str(refused.value)
    with pytest.raises(InferenceServerException, match="setting of the whole process"):
        client.load_model("misplaced")
    with pytest.raises(InferenceServerException, match="no model 'nope'"):
        client.load_model("nope")
    index = {e["name"]: e for e in client.get_model_repository_index()}
    assert index["gamma"]["state"] == "UNAVAILABLE" and "needs about" in index["gamma"]["reason"]

    metrics = requests.get(f"http://{http_url}/metrics", timeout=10).text
    memory = {
        line.split('"')[1]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("autoglm_batcher_model_memory_bytes{")
    }
    assert set(memory) == {"alpha", "beta"} and min(memory.values()) > 0
    for model in ("alpha", "beta"):
        assert f'autoglm_batcher_queue_items{{model="{model}"}}' in metrics
        assert f'autoglm_batcher_requests_total{{model="{model}",outcome="ok"}} 1.0' in metrics

    ready = requests.post(
        f"http://{http_url}/v2/repository/index", json={"ready": True}, timeout=10
    )
    assert [entry["name"] for entry in ready.json()] == ["alpha", "beta"]

    base = f"http://{http_url}/v2/repository"
    garbled = requests.post(f"{base}/index", data=b"{not json", timeout=10)
    assert garbled.status_code == 400 and "not JSON" in garbled.json()["error"]
    deep = requests.post(f"{base}/index", data=b"[" * 100_000, timeout=10)
    assert deep.status_code == 400 and "nested too deeply" in deep.json()["error"]
    override = requests.post(
        f"{base}/models/gamma/load", json={"parameters": {"config": "{}"}}, timeout=10
    )
    assert override.status_code == 400 and "'config' is not supported" in override.json()["error"]
    assert requests.post(f"{base}/models/nope/unload", timeout=10).status_code == 404

    client.unload_model("beta")
    assert states(client.get_model_repository_index())["beta"] == "UNAVAILABLE"
    assert not client.is_model_ready("beta")
    client.load_model("gamma")  # fits now that beta is gone
    assert infer_http(client, "gamma").shape == (2, 4)


def test_index_load_and_unload_through_tritonclient_grpc(repository_server) -> None:
    _, grpc_url, logs = repository_server
    client = triton_grpc.InferenceServerClient(grpc_url)
    index = client.get_model_repository_index(as_json=True)["models"]
    assert states(index)["alpha"] == "READY" and states(index)["beta"] == "UNAVAILABLE"
    client.load_model("beta")
    beta_process = logs.wait_for("model process ready")
    assert beta_process["model"] == "beta"
    assert client.is_model_ready("beta")
    data = np.ones((1, 16), dtype=np.float32)
    tensor = triton_grpc.InferInput("input", [1, 16], "FP32")
    tensor.set_data_from_numpy(data)
    assert client.infer("beta", [tensor]).as_numpy("logits").shape == (1, 4)
    with pytest.raises(InferenceServerException, match="RESOURCE_EXHAUSTED"):
        client.load_model("gamma")
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.load_model("nope")
    client.unload_model("beta")
    wait_until(
        lambda: not client.is_model_ready("beta"), timeout=30, what="beta unloaded", interval=0.1
    )
    with pytest.raises(InferenceServerException, match="NOT_FOUND"):
        client.infer("beta", [tensor])
    index = {e["name"]: e for e in client.get_model_repository_index(as_json=True)["models"]}
    assert index["beta"]["state"] == "UNAVAILABLE" and index["beta"]["reason"] == "unloaded"
    assert not _alive(beta_process["pid"])  # unloading stopped beta's own process
