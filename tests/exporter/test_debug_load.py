"""``PUT /debug/load``: an outside process drives a simulated GPU's utilization over HTTP."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from exporter.service import ExporterService, parse_load_request
from exporter.sources import SimulatedSource, load_profile
from tests.waiting import wait_until


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"gpu": 0, "utilization": 0.7}', (0, 0.7)),
        (b'{"gpu": 3, "utilization": 1}', (3, 1.0)),
        (b'{"utilization": null, "gpu": 2}', (2, None)),
    ],
)
def test_parse_load_request_accepts(body, expected):
    assert parse_load_request(body) == expected


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"", "body must be JSON like"),
        (b"gpu=0", "body must be JSON like"),
        (b"[0, 0.7]", "must be a JSON object"),
        (b'{"gpu": 0}', "both 'gpu' and 'utilization' are required"),
        (b'{"utilization": 0.5}', "both 'gpu' and 'utilization' are required"),
        (b'{"gpu": 0, "util": 0.5}', "unknown key(s) util"),
        (b'{"gpu": "0", "utilization": 0.5}', "'gpu' must be a GPU index"),
        (b'{"gpu": 0.5, "utilization": 0.5}', "'gpu' must be a GPU index"),
        (b'{"gpu": true, "utilization": 0.5}', "'gpu' must be a GPU index"),
        (b'{"gpu": 0, "utilization": "70%"}', "'utilization' must be a ratio 0..1 or null"),
        (b'{"gpu": 0, "utilization": false}', "'utilization' must be a ratio 0..1 or null"),
    ],
)
def test_parse_load_request_names_the_problem(body, needle):
    with pytest.raises(ValueError) as info:
        parse_load_request(body)
    assert needle in str(info.value)


@pytest.fixture
def service() -> Iterator[ExporterService]:
    """Two simulated GPUs idling (constant:0: no noise), their controls served."""
    source = SimulatedSource(gpus=2, model="h100", seed=5, profile=load_profile("constant:0"))
    service = ExporterService(
        source, listen="127.0.0.1:0", interval=0.2, deadline=0.2, simulation=source
    )
    service.start()
    try:
        wait_until(lambda: service.exposition is not None, timeout=20, what="the first collection")
        yield service
    finally:
        service.stop()
        source.close()


def gpu_util(service: ExporterService) -> dict[str, str]:
    text = requests.get(f"{service.server.url}/metrics", timeout=5).text
    lines = [line for line in text.splitlines() if line.startswith("DCGM_FI_DEV_GPU_UTIL{")]
    return {line.split('gpu="')[1].split('"')[0]: line.rsplit(" ", 1)[1] for line in lines}


def put_load(service: ExporterService, body: str) -> requests.Response:
    return requests.put(f"{service.server.url}/debug/load", data=body, timeout=5)


@pytest.mark.timeout(60)
def test_put_load_drives_one_gpu_and_null_returns_it_to_the_profile(service):
    # A GPU whose read misses a cycle's deadline on a busy machine is absent from that cycle.
    wait_until(lambda: gpu_util(service) == {"0": "0", "1": "0"}, timeout=20, what="both GPUs idle")

    reply = put_load(service, '{"gpu": 1, "utilization": 0.7}')
    assert reply.status_code == 200, reply.text
    assert reply.json() == {"gpu": 1, "utilization": 0.7}
    wait_until(lambda: gpu_util(service) == {"0": "0", "1": "70"}, timeout=20, what="GPU 1 at 70 %")

    reply = put_load(service, '{"gpu": 1, "utilization": null}')
    assert reply.status_code == 200 and reply.json() == {"gpu": 1, "utilization": None}
    wait_until(
        lambda: gpu_util(service) == {"0": "0", "1": "0"}, timeout=20, what="GPU 1 back to idle"
    )


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ('{"gpu": 2, "utilization": 0.5}', "gpu=2 is out of range; this source has GPUs 0..1"),
        ('{"gpu": 0, "utilization": 1.5}', "utilization is a ratio 0..1, not 1.5"),
        ('{"gpu": 0, "utilization": NaN}', "utilization is a ratio 0..1, not nan"),
        ('{"gpu": 0, "utilization": -0.1}', "utilization is a ratio 0..1"),
        ("0.7", "must be a JSON object"),
    ],
)
def test_bad_load_is_a_400_that_says_why_and_changes_nothing(service, body, needle):
    reply = put_load(service, body)
    assert reply.status_code == 400
    assert needle in reply.text
    wait_until(
        lambda: gpu_util(service) == {"0": "0", "1": "0"}, timeout=20, what="both GPUs still idle"
    )


def test_load_route_is_put_only_and_absent_without_a_simulated_source(service):
    get = requests.get(f"{service.server.url}/debug/load", timeout=5)
    assert get.status_code == 405 and get.headers["Allow"] == "PUT"

    source = SimulatedSource(gpus=1, model="h100", seed=5, profile=load_profile("constant:0"))
    plain = ExporterService(source, listen="127.0.0.1:0", interval=0.1, deadline=0.1)
    plain.start()
    try:
        reply = requests.put(
            f"{plain.server.url}/debug/load", data='{"gpu": 0, "utilization": 0.5}', timeout=5
        )
        assert reply.status_code == 404
    finally:
        plain.stop()
        source.close()
