"""Each component's own command, serving over TLS with basic auth from one web config file.

The kernel's server is tested in-process (test_server.py); this starts the real processes, as an
operator would with ``--web-config-file``, and talks to them with a real HTTPS client: the web
config reaches every component's server, not only the shared code.
"""

from __future__ import annotations

import base64
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

from autoglm.ports import free_port
from tests.selfsigned import ScratchCA
from tests.waiting import wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

REPO = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret"


@dataclass(frozen=True)
class Secured:
    """A web config file with TLS, one user and a header, and what a client needs for it."""

    path: Path
    ca: Path

    def session(self, authenticated: bool) -> requests.Session:
        session = requests.Session()
        session.trust_env = False  # REQUESTS_CA_BUNDLE would override verify
        session.verify = str(self.ca)
        if authenticated:
            token = base64.b64encode(f"prometheus:{PASSWORD}".encode()).decode()
            session.headers["Authorization"] = f"Basic {token}"
        return session


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Secured:
    folder = tmp_path_factory.mktemp("web")
    ca = ScratchCA(folder)
    server = ca.server()
    config = {
        "tls_server_config": {"cert_file": str(server.cert), "key_file": str(server.key)},
        "basic_auth_users": {
            "prometheus": bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(4)).decode()
        },
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
    }
    path = folder / "web-config.yml"
    path.write_text(yaml.safe_dump(config))
    return Secured(path, ca.cert_file)


def predictor_config(folder: Path) -> Path:
    path = folder / "predictor.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                # Nothing listens there: queries fail and are counted, /metrics still serves.
                "prometheus_url": "http://127.0.0.1:9",
                "targets": [{"name": "rate", "query": "sum(up)", "step": "1s", "lookback": "2m"}],
            }
        )
    )
    return path


def command(component: str, port: int, web_config: Path, folder: Path) -> list[str]:
    listen = ["--listen", f"127.0.0.1:{port}", "--web-config-file", str(web_config)]
    if component == "exporter":
        return ["-m", "exporter.cli", "--source", "simulated", "--gpus", "1", *listen]
    if component == "predictor":
        config = predictor_config(folder)
        return ["-m", "predictor.cli", "serve", "--config", str(config), *listen]
    worker = REPO / "tests" / "autoscaler" / "workers" / "http_worker.py"
    return [
        "-m", "autoscaler.cli", "run", "--mode", "local",
        "--spec-file", str(REPO / "autoscaler" / "crd" / "example.yaml"),
        f"--worker-command={sys.executable}", f"--worker-command={worker}",
        "--worker-command=--port={port}", "--worker-base-port", str(free_port()),
        "--prometheus-url", "http://127.0.0.1:9", "--interval", "1", *listen,
    ]  # fmt: skip


@pytest.fixture
def running(request: pytest.FixtureRequest, secured: Secured, tmp_path: Path) -> Iterator[str]:
    """Start the component named by the test's parameter; yield its HTTPS base URL."""
    port = free_port()
    log = (tmp_path / "component.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, *command(request.param, port, secured.path, tmp_path)],
        cwd=REPO,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"https://127.0.0.1:{port}"
    try:
        with secured.session(authenticated=False) as probe:

            def serving() -> bool:
                assert proc.poll() is None, (tmp_path / "component.log").read_text()[-3000:]
                try:
                    probe.get(url + "/metrics", timeout=5)
                except requests.exceptions.ConnectionError:
                    return False
                return True

            wait_until(serving, timeout=120, what="the component to start serving", interval=0.2)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


# component, realm in WWW-Authenticate, a path served without credentials ("" for none)
COMPONENTS = [
    pytest.param("exporter", "autoglm-exporter", "/healthz", id="exporter"),
    pytest.param("predictor", "predictor", "", id="predictor"),
    pytest.param("autoscaler", "autoscaler", "/healthz", id="autoscaler"),
]


@pytest.mark.parametrize(("running", "realm", "open_path"), COMPONENTS, indirect=["running"])
def test_metrics_need_credentials_over_tls(
    running: str, realm: str, open_path: str, secured: Secured
) -> None:
    with secured.session(authenticated=False) as anonymous:
        denied = anonymous.get(running + "/metrics", timeout=10)
        assert denied.status_code == 401
        assert denied.headers["WWW-Authenticate"] == f'Basic realm="{realm}"'
        assert denied.headers["X-Content-Type-Options"] == "nosniff"
        if open_path:
            assert anonymous.get(running + open_path, timeout=10).status_code == 200
    refusal = 'autoglm_http_requests_total{code="401",path="/metrics"}'
    with secured.session(authenticated=True) as scraper:
        # The exporter renders its own metrics with each collection: poll for the refusal.

        def refusal_counted() -> requests.Response | None:
            metrics = scraper.get(running + "/metrics", timeout=10)
            if metrics.status_code == 200 and refusal in metrics.text:
                return metrics
            assert metrics.status_code in (200, 503), metrics.text
            return None

        metrics = wait_until(
            refusal_counted,
            timeout=60,
            what="the refusal on /metrics",
            interval=0.2,
            detail=lambda: scraper.get(running + "/metrics", timeout=10).text[-2000:],
        )
        assert metrics.headers["X-Content-Type-Options"] == "nosniff"
        assert "autoglm_web_config_last_reload_successful 1.0" in metrics.text
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(running.replace("https", "http") + "/metrics", timeout=10)
