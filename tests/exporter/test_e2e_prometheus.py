"""A real Prometheus scrapes the real exporter process (8 simulated GPUs) and answers PromQL."""

from __future__ import annotations

import pytest

from tests.live import Prometheus, scrape_job


@pytest.mark.live
@pytest.mark.timeout(120)
def test_prometheus_scrapes_eight_simulated_gpus(start_exporter, tmp_path):
    exporter = start_exporter("--source", "simulated", "--gpus", "8", "--seed", "3")
    target = exporter.address
    with Prometheus(tmp_path / "prometheus", [scrape_job("gpu", [target])]) as prom:
        # The first scrape of a fresh Prometheus lands a few seconds after it starts.
        per_gpu = prom.wait_for(
            "avg by (gpu) (DCGM_FI_DEV_GPU_UTIL)", lambda r: len(r) == 8, timeout=60
        )
        assert sorted(int(s["metric"]["gpu"]) for s in per_gpu) == list(range(8))
        assert all(0.0 <= float(s["value"][1]) <= 100.0 for s in per_gpu)

        # Prometheus negotiates OpenMetrics: DCGM counters keep their exact names there.
        replays = prom.query("count(DCGM_FI_DEV_PCIE_REPLAY_COUNTER)")
        assert replays and float(replays[0]["value"][1]) == 8
        labels = prom.query('DCGM_FI_DEV_FB_USED{gpu="5"}')[0]["metric"]
        assert {"UUID", "pci_bus_id", "device", "modelName", "Hostname"} <= set(labels)
        assert prom.query('up{job="gpu"}')[0]["value"][1] == "1"
        health = prom.query("autoglm_exporter_gpu_up")
        assert len(health) == 8 and all(s["value"][1] == "1" for s in health)
