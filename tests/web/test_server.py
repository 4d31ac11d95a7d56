"""The shared aiohttp server for synchronous routes over real sockets: routing, keep-alive,
metrics, auth and real TLS."""

from __future__ import annotations

import asyncio
import base64
import gzip
import http.client
import logging
import socket
import ssl
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml
from cryptography import x509
from prometheus_client import CollectorRegistry, Counter
from prometheus_client.parser import text_string_to_metric_families

from autoglm.config import ConfigError
from autoglm.web.exchange import Request, Response
from autoglm.web.exposition import registry_route
from autoglm.web.server import HTTPServer
from autoglm.webconfig import WebConfig, basic_auth
from tests.selfsigned import CertFiles, ScratchCA
from tests.waiting import wait_until

pytestmark = pytest.mark.timeout(60)


def echo(request: Request) -> Response:
    return Response.json(
        {
            "method": request.method,
            "path": request.path,
            "query": request.query,
            "body": request.body.decode(),
            "agent": request.headers.get("user-agent"),
        }
    )


def explode(request: Request) -> Response:
    raise RuntimeError("handler bug")


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def server(registry: CollectorRegistry) -> Iterator[HTTPServer]:
    routes = {
        "/metrics": registry_route(registry),
        "/echo": echo,
        "POST /echo": echo,
        "DELETE /items": lambda r: Response(status=204),
        "/boom": explode,
    }
    with HTTPServer("127.0.0.1:0", routes, registry=registry, component="test") as srv:
        yield srv


def sample(registry: CollectorRegistry, name: str, labels: dict[str, str]) -> float | None:
    return registry.get_sample_value(name, labels)


def test_routes_methods_and_status_codes(server: HTTPServer, registry: CollectorRegistry) -> None:
    with requests.Session() as s:
        r = s.get(server.url + "/echo?a=1&a=2&b=", headers={"User-Agent": "pytest"})
        assert r.status_code == 200
        assert r.headers["Content-Type"] == "application/json"
        assert r.json() == {
            "method": "GET",
            "path": "/echo",
            "query": {"a": ["1", "2"], "b": [""]},
            "body": "",
            "agent": "pytest",
        }
        assert s.post(server.url + "/echo", data=b"payload").json()["body"] == "payload"
        assert s.delete(server.url + "/items").status_code == 204

        head = s.head(server.url + "/echo")
        assert head.status_code == 200
        assert head.content == b""
        assert int(head.headers["Content-Length"]) > 0

        not_allowed = s.put(server.url + "/echo")
        assert not_allowed.status_code == 405
        assert not_allowed.headers["Allow"] == "GET, HEAD, POST"
        assert s.get(server.url + "/items").status_code == 405
        assert s.get(server.url + "/nowhere").status_code == 404

    assert sample(registry, "autoglm_http_requests_total", {"path": "/echo", "code": "200"}) == 3
    assert sample(registry, "autoglm_http_requests_total", {"path": "/echo", "code": "405"}) == 1
    assert sample(registry, "autoglm_http_requests_total", {"path": "other", "code": "404"}) == 1
    assert sample(registry, "autoglm_http_request_duration_seconds_count", {"path": "/echo"}) == 4


def test_handler_error_is_a_500_and_the_server_keeps_serving(server: HTTPServer) -> None:
    with requests.Session() as s:
        r = s.get(server.url + "/boom")
        assert r.status_code == 500
        assert "handler bug" not in r.text
        assert s.get(server.url + "/echo").status_code == 200


def test_request_body_limit(registry: CollectorRegistry) -> None:
    with HTTPServer("127.0.0.1:0", {"POST /echo": echo}, max_body_bytes=10) as srv:
        assert requests.post(srv.url + "/echo", data=b"x" * 10).status_code == 200
        assert requests.post(srv.url + "/echo", data=b"x" * 11).status_code == 413


def test_a_body_that_does_not_decode_is_a_400_that_closes_the_connection(
    server: HTTPServer, caplog: pytest.LogCaptureFixture
) -> None:
    with requests.Session() as s, caplog.at_level(logging.DEBUG):
        r = s.post(server.url + "/echo", data=b"plain", headers={"Content-Encoding": "gzip"})
        assert r.status_code == 400
        assert "Content-Encoding" in r.text and "gzip" in r.text
        assert r.headers["Connection"] == "close"
        compressed = gzip.compress(b"packed")
        ok = s.post(server.url + "/echo", data=compressed, headers={"Content-Encoding": "gzip"})
        assert ok.status_code == 200 and ok.json()["body"] == "packed"
    # aiohttp's own traceback for the same body is dropped: the 400 said it
    assert not [r for r in caplog.records if r.exc_info and r.name == "aiohttp.server"]


def test_connections_beyond_the_limit_are_refused(registry: CollectorRegistry) -> None:
    routes = {"/echo": echo}
    with HTTPServer("127.0.0.1:0", routes, registry=registry, max_connections=1) as srv:
        holder = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        try:
            holder.request("GET", "/echo")
            assert holder.getresponse().read()
            with pytest.raises(requests.exceptions.ConnectionError):
                requests.get(srv.url + "/echo", timeout=10)
            assert registry.get_sample_value("autoglm_http_connections_refused_total") == 1
        finally:
            holder.close()
        wait_until(
            lambda: answers(srv.url + "/echo"), timeout=10, what="/echo to answer", interval=0.01
        )


def answers(url: str) -> bool:
    try:
        return requests.get(url, timeout=10).status_code == 200
    except requests.exceptions.ConnectionError:
        return False


def test_keep_alive_reuses_one_connection(server: HTTPServer) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        conn.request("GET", "/echo")
        first = conn.getresponse()
        first.read()
        sock = conn.sock
        conn.request("GET", "/metrics")
        second = conn.getresponse()
        second.read()
        assert first.status == second.status == 200
        assert conn.sock is sock, "the server closed a keep-alive connection"
    finally:
        conn.close()


def test_metrics_negotiation_text_openmetrics_gzip_and_name_filter(
    server: HTTPServer, registry: CollectorRegistry
) -> None:
    jobs = Counter("jobs", "Jobs done.", registry=registry)
    jobs.inc(3)
    text = requests.get(server.url + "/metrics", headers={"Accept-Encoding": "identity"})
    assert text.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "Content-Encoding" not in text.headers
    families = {f.name: f for f in text_string_to_metric_families(text.text)}
    assert families["jobs"].samples[0].value == 3

    om = requests.get(
        server.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
    )
    assert om.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0")
    assert om.text.endswith("# EOF\n")
    assert "jobs_total 3.0" in om.text

    raw = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
    try:
        raw.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        response = raw.getresponse()
        assert response.getheader("Content-Encoding") == "gzip"
        assert b"jobs_total 3.0" in gzip.decompress(response.read())
    finally:
        raw.close()

    only = requests.get(server.url + "/metrics", params={"name[]": "jobs_total"}).text
    assert "jobs_total 3.0" in only
    assert "autoglm_http_requests_total" not in only

    # an Accept prometheus_client cannot read gets the text format, not a 500
    odd = requests.get(
        server.url + "/metrics", headers={"Accept": "application/openmetrics-text; version=abc"}
    )
    assert odd.status_code == 200
    assert odd.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    assert "jobs_total 3.0" in odd.text


def test_taken_port_and_bad_address_are_config_errors(server: HTTPServer) -> None:
    with pytest.raises(ConfigError, match=rf"127\.0\.0\.1:{server.port}.*choose another --listen"):
        HTTPServer(f"127.0.0.1:{server.port}", {}).start()
    with pytest.raises(ConfigError, match=r"unknown host 'no-such-host\.invalid'"):
        HTTPServer("no-such-host.invalid:0", {}).start()
    with pytest.raises(ConfigError, match="must be HOST:PORT"):
        HTTPServer("127.0.0.1", {})


def test_stop_closes_keep_alive_connections_and_joins_threads(registry: CollectorRegistry) -> None:
    srv = HTTPServer("127.0.0.1:0", {"/echo": echo}, component="joined")
    srv.start()
    sessions = [requests.Session() for _ in range(3)]
    for s in sessions:
        assert s.get(srv.url + "/echo").status_code == 200
    assert any(t.name.startswith("joined-http") for t in threading.enumerate())
    srv.stop()
    assert [t.name for t in threading.enumerate() if t.name.startswith("joined-http")] == []
    for s in sessions:
        s.close()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", srv.port)) != 0


def test_access_log_only_at_debug(server: HTTPServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="autoglm.web.server"):
        requests.get(server.url + "/echo")
    assert [r for r in caplog.records if r.getMessage() == "request"] == []
    with caplog.at_level(logging.DEBUG, logger="autoglm.web.server"):
        requests.get(server.url + "/echo")
    records = [r for r in caplog.records if r.getMessage() == "request"]
    assert records
    assert (records[-1].path, records[-1].status) == ("/echo", 200)


# --- basic auth and TLS with real certificates ---------------------------------------------


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    folder = tmp_path_factory.mktemp("pki")
    ca = ScratchCA(folder)
    stranger_ca = ScratchCA(folder, "stranger CA")
    return {
        "dir": folder,
        "ca": ca.cert_file,
        "server": ca.server(),
        "scraper": ca.client("scraper", "scraper.example"),
        "intruder": ca.client("intruder", "intruder.example"),
        "stranger": stranger_ca.client("stranger", "scraper.example"),
    }


def web_config(folder: Path, data: dict[str, object]) -> WebConfig:
    path = folder / "web-config.yml"
    path.write_text(yaml.safe_dump(data))
    return WebConfig.load(path)


def tls_section(pki: dict[str, object], **extra: object) -> dict[str, object]:
    server: CertFiles = pki["server"]  # type: ignore[assignment]
    return {"cert_file": str(server.cert), "key_file": str(server.key), **extra}


def basic(user: str, password: str) -> dict[str, str]:
    token = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {"Authorization": f"Basic {token}"}


def test_basic_auth_over_tls(tmp_path: Path, pki: dict[str, object]) -> None:
    hashed = bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()
    config = web_config(
        tmp_path,
        {
            "tls_server_config": tls_section(pki),
            "basic_auth_users": {"prometheus": hashed},
            "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
        },
    )
    registry = CollectorRegistry()
    routes = {"/metrics": registry_route(registry), "/healthz": lambda r: Response.text("ok")}
    with HTTPServer("127.0.0.1:0", routes, config, component="exporter", registry=registry) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        with requests.Session() as s:
            s.trust_env = False  # REQUESTS_CA_BUNDLE would override s.verify
            s.verify = str(pki["ca"])
            denied = s.get(srv.url + "/metrics")
            assert denied.status_code == 401
            assert denied.headers["WWW-Authenticate"] == 'Basic realm="exporter"'
            assert (
                s.get(srv.url + "/metrics", headers=basic("prometheus", "wrong")).status_code == 401
            )
            assert s.get(srv.url + "/healthz").status_code == 401
            assert s.get(srv.url + "/unknown").status_code == 401
            ok = s.get(srv.url + "/metrics", headers=basic("prometheus", "s3cret"))
            assert ok.status_code == 200
            assert ok.headers["X-Content-Type-Options"] == "nosniff"
            assert "autoglm_http_requests_total" in ok.text
        with pytest.raises(requests.exceptions.ConnectionError):
            requests.get(srv.url.replace("https", "http") + "/metrics", timeout=10)
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(srv.url + "/metrics", timeout=10)  # the CA is not trusted by default
        wait_until(
            lambda: registry.get_sample_value("autoglm_http_tls_handshake_errors_total") == 2,
            timeout=10,
            what="two handshake errors counted",
            interval=0.01,
        )
        # A TCP probe (connect, close) is no error: a tcpSocket probe every few seconds would
        # otherwise keep the counter rising on every healthy pod.
        for _ in range(3):
            socket.create_connection(("127.0.0.1", srv.port), timeout=10).close()
        ok = requests.get(srv.url + "/healthz", verify=str(pki["ca"]), timeout=10)
        assert ok.status_code == 401  # served after the probes
        assert registry.get_sample_value("autoglm_http_tls_handshake_errors_total") == 2


def test_open_paths_skip_auth(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    config = web_config(tmp_path, {"basic_auth_users": {"u": hashed}})
    routes = {"/metrics": lambda r: Response.text("m"), "/healthz": lambda r: Response.text("ok")}
    with HTTPServer("127.0.0.1:0", routes, config, open_paths={"/healthz"}) as srv:
        assert requests.get(srv.url + "/healthz").status_code == 200
        assert requests.get(srv.url + "/metrics").status_code == 401


def test_min_version_is_enforced(tmp_path: Path, pki: dict[str, object]) -> None:
    config = web_config(tmp_path, {"tls_server_config": tls_section(pki, min_version="TLS13")})
    with HTTPServer("127.0.0.1:0", {"/x": lambda r: Response.text("x")}, config) as srv:
        client = ssl.create_default_context(cafile=str(pki["ca"]))
        client.maximum_version = ssl.TLSVersion.TLSv1_2
        with pytest.raises(ssl.SSLError), socket.create_connection(("127.0.0.1", srv.port)) as raw:
            client.wrap_socket(raw, server_hostname="localhost")
        client.maximum_version = ssl.TLSVersion.TLSv1_3
        with (
            socket.create_connection(("127.0.0.1", srv.port)) as raw,
            client.wrap_socket(raw, server_hostname="localhost") as tls,
        ):
            assert tls.version() == "TLSv1.3"


def cert_pair(pki: dict[str, object], name: str) -> tuple[str, str]:
    files: CertFiles = pki[name]  # type: ignore[assignment]
    return str(files.cert), str(files.key)


def mtls_get(url: str, pki: dict[str, object], cert: str | None) -> requests.Response:
    return requests.get(
        url, verify=str(pki["ca"]), cert=cert_pair(pki, cert) if cert else None, timeout=10
    )


def test_client_certificate_required(tmp_path: Path, pki: dict[str, object]) -> None:
    config = web_config(
        tmp_path,
        {
            "tls_server_config": tls_section(
                pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki["ca"])
            )
        },
    )
    with HTTPServer("127.0.0.1:0", {"/x": lambda r: Response.text("x")}, config) as srv:
        assert mtls_get(srv.url + "/x", pki, "scraper").text == "x\n"
        with pytest.raises(requests.exceptions.RequestException):
            mtls_get(srv.url + "/x", pki, None)
        with pytest.raises(requests.exceptions.RequestException):
            mtls_get(srv.url + "/x", pki, "stranger")
        assert mtls_get(srv.url + "/x", pki, "scraper").status_code == 200


def test_client_allowed_sans(tmp_path: Path, pki: dict[str, object]) -> None:
    config = web_config(
        tmp_path,
        {
            "tls_server_config": tls_section(
                pki,
                client_auth_type="RequireAndVerifyClientCert",
                client_ca_file=str(pki["ca"]),
                client_allowed_sans=["scraper.example"],
            )
        },
    )
    registry = CollectorRegistry()
    routes = {"/x": lambda r: Response.text("x")}
    with HTTPServer("127.0.0.1:0", routes, config, registry=registry) as srv:
        assert mtls_get(srv.url + "/x", pki, "scraper").status_code == 200
        with pytest.raises(requests.exceptions.RequestException):
            mtls_get(srv.url + "/x", pki, "intruder")
        wait_until(
            lambda: registry.get_sample_value("autoglm_http_tls_handshake_errors_total") == 1,
            timeout=10,
            what="the handshake error counted",
            interval=0.01,
        )


def test_client_certificate_optional(tmp_path: Path, pki: dict[str, object]) -> None:
    config = web_config(
        tmp_path,
        {
            "tls_server_config": tls_section(
                pki, client_auth_type="VerifyClientCertIfGiven", client_ca_file=str(pki["ca"])
            )
        },
    )
    with HTTPServer("127.0.0.1:0", {"/x": lambda r: Response.text("x")}, config) as srv:
        assert mtls_get(srv.url + "/x", pki, None).status_code == 200
        assert mtls_get(srv.url + "/x", pki, "scraper").status_code == 200
        with pytest.raises(requests.exceptions.RequestException):
            mtls_get(srv.url + "/x", pki, "stranger")


# --- certificate rotation without a restart --------------------------------------------------


def presented_serial(url: str, ca: Path) -> int:
    """Serial number of the certificate the server shows a new connection."""
    host, port = url.split("//", 1)[1].rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    with (
        socket.create_connection((host, int(port)), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=host) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    return x509.load_der_x509_certificate(der).serial_number


@dataclass
class Rotation:
    """A web config naming tls.crt/tls.key that a test renews, as cert-manager does."""

    ca: ScratchCA
    first: CertFiles
    renewed: CertFiles
    config: WebConfig
    folder: Path

    def renew(self) -> None:
        (self.folder / "tls.crt").write_bytes(self.renewed.cert.read_bytes())
        (self.folder / "tls.key").write_bytes(self.renewed.key.read_bytes())

    def serial(self, url: str) -> int:
        return presented_serial(url, self.ca.cert_file)

    @staticmethod
    def serial_of(files: CertFiles) -> int:
        return x509.load_pem_x509_certificate(files.cert.read_bytes()).serial_number


@pytest.fixture
def rotation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Rotation:
    monkeypatch.setattr("autoglm.webconfig.reload.RELOAD_CHECK_SECONDS", 0.0)
    ca = ScratchCA(tmp_path)
    first, renewed = ca.server("first"), ca.server("renewed")
    (tmp_path / "tls.crt").write_bytes(first.cert.read_bytes())
    (tmp_path / "tls.key").write_bytes(first.key.read_bytes())
    config = web_config(
        tmp_path, {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}
    )
    return Rotation(ca, first, renewed, config, tmp_path)


def test_a_renewed_certificate_is_served_without_a_restart(rotation: Rotation) -> None:
    registry = CollectorRegistry()
    routes = {"/metrics": registry_route(registry)}
    with HTTPServer("127.0.0.1:0", routes, rotation.config, registry=registry) as srv:
        assert rotation.serial(srv.url) == rotation.serial_of(rotation.first)
        rotation.renew()
        assert rotation.serial(srv.url) == rotation.serial_of(rotation.renewed)
        ca = str(rotation.ca.cert_file)
        text = requests.get(srv.url + "/metrics", verify=ca, timeout=10).text
        assert 'autoglm_web_config_reloads_total{result="success"} 1.0' in text
        assert "autoglm_web_config_last_reload_successful 1.0" in text


def test_asyncio_servers_holding_the_first_context_serve_the_renewed_certificate(
    rotation: Rotation,
) -> None:
    """aiohttp (the batcher) is given the context once at start, as asyncio servers are."""

    async def rotate_and_look() -> list[int]:
        loop = asyncio.get_running_loop()
        context = rotation.config.ssl_context()
        server = await loop.create_server(asyncio.Protocol, "127.0.0.1", 0, ssl=context)
        url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        seen = [await asyncio.to_thread(rotation.serial, url)]
        rotation.renew()
        seen.append(await asyncio.to_thread(rotation.serial, url))
        server.close()
        await server.wait_closed()
        return seen

    expected = [rotation.serial_of(rotation.first), rotation.serial_of(rotation.renewed)]
    assert asyncio.run(rotate_and_look()) == expected


def test_a_silent_tls_client_holds_up_no_one_and_is_dropped(
    tmp_path: Path, pki: dict[str, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("autoglm.web.listener.TLS_HANDSHAKE_TIMEOUT_S", 0.5)
    config = web_config(tmp_path, {"tls_server_config": tls_section(pki)})
    registry = CollectorRegistry()
    routes = {"/x": lambda r: Response.text("x")}
    with (
        HTTPServer("127.0.0.1:0", routes, config, registry=registry) as srv,
        socket.create_connection(("127.0.0.1", srv.port), timeout=30) as silent,
    ):
        assert requests.get(srv.url + "/x", verify=str(pki["ca"]), timeout=10).text == "x\n"
        assert silent.recv(1) == b"", "the server should close a connection that never shakes hands"
        wait_until(
            lambda: registry.get_sample_value("autoglm_http_tls_handshake_errors_total") == 1,
            timeout=10,
            what="the handshake error counted",
            interval=0.01,
        )


def test_accepted_credentials_cost_one_bcrypt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hashed = bcrypt.hashpw(b"pw", bcrypt.gensalt(4)).decode()
    config = web_config(tmp_path, {"basic_auth_users": {"u": hashed}})
    checks = []
    real_checkpw = bcrypt.checkpw

    def counting_checkpw(password: bytes, hashed: bytes) -> bool:
        checks.append(password)
        return real_checkpw(password, hashed)

    monkeypatch.setattr(basic_auth.bcrypt, "checkpw", counting_checkpw)
    with (
        HTTPServer("127.0.0.1:0", {"/x": lambda r: Response.text("x")}, config) as srv,
        requests.Session() as s,
    ):
        for _ in range(3):
            assert s.get(srv.url + "/x", headers=basic("u", "pw")).status_code == 200
        assert s.get(srv.url + "/x", headers=basic("u", "wrong")).status_code == 401
    assert checks == [b"pw", b"wrong"]
