"""The shared Prometheus client (autoglm.prometheus_api) and the config fields that build it.

Queries, chunking, TLS, client certificates, basic auth and error kinds run against real
Prometheus servers (/usr/bin/prometheus): one plain, one behind its own web config with TLS from a
throw-away CA, a required client certificate and basic auth. Prometheus cannot check bearer tokens
or record headers, so those go to a small HTTP server (autoglm.web.server) that records what
arrives and answers in the API's format.
"""

from __future__ import annotations

import argparse
import base64
import os
from pathlib import Path

import bcrypt
import numpy as np
import pytest
import requests
import yaml
from prometheus_client.parser import text_string_to_metric_families

from autoglm.config import ConfigError, add_config_arguments, config_from_args
from autoglm.prometheus_api import PrometheusAccessConfig, PrometheusClient, PrometheusError
from autoglm.web.exchange import Request, Response
from autoglm.web.server import HTTPServer
from autoscaler.config import AutoscalerConfig
from predictor.config import PredictorConfig
from tests.live import Prometheus, free_port
from tests.selfsigned import ScratchCA

pytestmark = [pytest.mark.live, pytest.mark.timeout(120)]

USER, PASSWORD = "reader", "s3cret"
T0 = 1_700_000_000.0


# --- servers ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A real Prometheus without auth; expressions of time() need no stored data."""
    with Prometheus(tmp_path_factory.mktemp("plain"), scrape_configs=[]) as prom:
        yield prom


class SecuredPrometheus:
    """A real Prometheus whose web config asks for TLS, a client certificate and basic auth."""

    def __init__(self, folder: Path) -> None:
        self.ca = ScratchCA(folder)
        server_cert = self.ca.server()
        self.client_cert = self.ca.client("client", dns="autoglm-client")
        self.password_file = folder / "password"
        self.password_file.write_text(PASSWORD + "\n")
        hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
        self.prometheus = Prometheus(
            folder / "prometheus",
            scrape_configs=[],
            web_config={
                "tls_server_config": {
                    "cert_file": str(server_cert.cert),
                    "key_file": str(server_cert.key),
                    "client_auth_type": "RequireAndVerifyClientCert",
                    "client_ca_file": str(self.ca.cert_file),
                },
                "basic_auth_users": {USER: hashed},
            },
            request_options={
                "verify": str(self.ca.cert_file),
                "cert": (str(self.client_cert.cert), str(self.client_cert.key)),
                "auth": (USER, PASSWORD),
            },
        )
        self.url = self.prometheus.url

    def client(self, **overrides) -> PrometheusClient:
        options = {
            "ca_file": str(self.ca.cert_file),
            "cert_file": str(self.client_cert.cert),
            "key_file": str(self.client_cert.key),
            "username": USER,
            "password_file": str(self.password_file),
            "timeout": 5.0,
            **overrides,
        }
        return PrometheusClient(self.url, **options)


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    prom = SecuredPrometheus(tmp_path_factory.mktemp("secured"))
    with prom.prometheus:
        yield prom


class Recorder:
    """Records each request's headers; answers /api/v1/query with the scalar 1, and
    /broken/api/v1/query with a page that is not JSON (as a misrouted proxy would)."""

    def __init__(self) -> None:
        self.headers: list[dict[str, str]] = []
        self.server = HTTPServer(
            "127.0.0.1:0",
            {
                "POST /api/v1/query": self._answer,
                "POST /broken/api/v1/query": lambda _: Response.text("<html>proxy</html>"),
            },
        )

    def _answer(self, request: Request) -> Response:
        self.headers.append(dict(request.headers))
        return Response.json(
            {"status": "success", "data": {"resultType": "scalar", "result": [T0, "1"]}}
        )


@pytest.fixture
def recorder():
    rec = Recorder()
    rec.server.start()
    try:
        yield rec
    finally:
        rec.server.stop()


# --- queries and chunking --------------------------------------------------------------------


def _range_requests(prom: Prometheus) -> float:
    """How many range queries Prometheus has answered, from its own /metrics."""
    text = requests.get(f"{prom.url}/metrics", timeout=10).text
    for family in text_string_to_metric_families(text):
        if family.name == "prometheus_http_requests":
            return sum(
                s.value
                for s in family.samples
                if s.name.endswith("_total") and s.labels.get("handler") == "/api/v1/query_range"
            )
    return 0.0


def test_instant_query_at_a_given_time(plain):
    with PrometheusClient(plain.url) as client:
        result = client.query("time()", at=T0)
        vector = client.query('label_replace(vector(2), "s", "x", "", "")', at=T0)
    assert result.result_type == "scalar"
    assert [s.value for s in result.samples] == [T0]
    assert vector.result_type == "vector"
    assert [(dict(s.labels), s.value) for s in vector.samples] == [({"s": "x"}, 2.0)]


def test_a_range_beyond_prometheus_point_limit_is_split_and_joined(plain):
    points = 25_000  # Prometheus refuses more than 11,000 points in one request
    end = T0 + points - 1
    with (
        PrometheusClient(plain.url, max_points_per_query=30_000) as unsplit,
        pytest.raises(PrometheusError, match="exceeded maximum resolution") as refused,
    ):
        unsplit.query_range("vector(time())", T0, end, 1)
    assert refused.value.kind == "query"

    before = _range_requests(plain)
    with PrometheusClient(plain.url) as client:
        (series,) = client.query_range("vector(time())", T0, end, 1)
    assert _range_requests(plain) - before == 3  # ceil(25,000 / 11,000)
    expected = T0 + np.arange(points)
    np.testing.assert_array_equal(series.timestamps, expected)
    np.testing.assert_array_equal(series.values, expected)


def test_several_series_are_joined_by_labels_across_chunks(plain):
    promql = (
        'label_replace(vector(time()), "s", "a", "", "")'
        ' or label_replace(vector(2 * time()), "s", "b", "", "")'
    )
    with PrometheusClient(plain.url, max_points_per_query=7) as client:
        series = client.query_range(promql, T0, T0 + 99, 1)
    by_label = {s.labels["s"]: s for s in series}
    assert sorted(by_label) == ["a", "b"]
    expected = T0 + np.arange(100)
    np.testing.assert_array_equal(by_label["a"].timestamps, expected)
    np.testing.assert_array_equal(by_label["b"].values, 2 * expected)


def test_an_empty_range_asks_nothing(plain):
    with PrometheusClient(plain.url) as client:
        assert client.query_range("vector(1)", T0, T0 - 1, 1) == ()


# --- error kinds -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("promql", "message"),
    [("sum(", "HTTP 400, bad_data"), ("vector(1)[1m:]", "returned a matrix")],
)
def test_bad_promql_and_wrong_result_types_are_query_errors(plain, promql, message):
    with (
        PrometheusClient(plain.url) as client,
        pytest.raises(PrometheusError, match=message) as err,
    ):
        client.query(promql)
    assert err.value.kind == "query"


def test_an_error_status_without_a_query_error_is_an_http_error(plain):
    with (
        PrometheusClient(plain.url + "/not-prometheus") as client,
        pytest.raises(PrometheusError, match="HTTP 404") as err,
    ):
        client.query("vector(1)")
    assert err.value.kind == "http"


def test_a_closed_port_is_unreachable():
    with (
        PrometheusClient(f"http://127.0.0.1:{free_port()}", timeout=2) as client,
        pytest.raises(PrometheusError) as err,
    ):
        client.query_range("vector(1)", T0, T0 + 10, 1)
    assert err.value.kind == "unreachable"


@pytest.mark.parametrize("option", ["ca_file", "cert_file"])
def test_a_tls_file_gone_since_startup_is_unreachable_not_an_oserror(tmp_path, option):
    """requests loads the CA bundle and client certificate per request and raises a plain
    OSError when one is missing: a counted error, not a traceback in the caller's loop."""
    with (
        PrometheusClient(
            f"https://127.0.0.1:{free_port()}", timeout=2, **{option: str(tmp_path / "gone")}
        ) as client,
        pytest.raises(PrometheusError) as err,
    ):
        client.query("vector(1)")
    assert err.value.kind == "unreachable"
    assert "gone" in str(err.value)


def test_a_password_in_the_url_never_reaches_an_error_text():
    """The message of a failed query ends up in logs, the autoscaler's status and Kubernetes
    Events; a password written into the URL must not."""
    with (
        PrometheusClient(f"http://admin:s3cret@127.0.0.1:{free_port()}", timeout=2) as client,
        pytest.raises(PrometheusError) as err,
    ):
        client.query("vector(1)")
    assert "s3cret" not in str(err.value)
    assert "admin:***@127.0.0.1" in str(err.value)


def test_a_success_status_without_json_is_a_response_error(recorder):
    with (
        PrometheusClient(recorder.server.url + "/broken") as client,
        pytest.raises(PrometheusError, match="not JSON") as err,
    ):
        client.query("vector(1)")
    assert err.value.kind == "response"


def test_an_unreadable_token_file_is_a_credentials_error_and_nothing_is_sent(recorder, tmp_path):
    missing = tmp_path / "token"
    with (
        PrometheusClient(recorder.server.url, bearer_token_file=str(missing)) as client,
        pytest.raises(PrometheusError, match="cannot read bearer token file") as err,
    ):
        client.query("vector(1)")
    assert err.value.kind == "credentials"
    assert recorder.headers == []


# --- auth headers ----------------------------------------------------------------------------


def test_bearer_token_and_extra_headers_are_sent(recorder):
    headers = {"X-Scope-OrgID": "team-a"}
    with PrometheusClient(recorder.server.url, bearer_token="abc", headers=headers) as client:
        client.query("vector(1)")
    (seen,) = recorder.headers
    assert seen["Authorization"] == "Bearer abc"
    assert seen["X-Scope-OrgID"] == "team-a"


def test_token_and_password_files_are_read_at_every_query(recorder, tmp_path):
    token, password = tmp_path / "token", tmp_path / "password"
    token.write_text("first\n")
    password.write_text("old\n")
    with (
        PrometheusClient(recorder.server.url, bearer_token_file=str(token)) as bearer,
        PrometheusClient(recorder.server.url, username=USER, password_file=str(password)) as basic,
    ):
        bearer.query("vector(1)")
        basic.query("vector(1)")
        token.write_text("rotated\n")
        password.write_text("new\n")
        bearer.query("vector(1)")
        basic.query("vector(1)")
    sent = [h["Authorization"] for h in recorder.headers]
    assert sent[0::2] == ["Bearer first", "Bearer rotated"]
    assert [base64.b64decode(a.removeprefix("Basic ")).decode() for a in sent[1::2]] == [
        f"{USER}:old",
        f"{USER}:new",
    ]


def test_conflicting_auth_options_are_refused():
    with pytest.raises(ValueError, match="not both"):
        PrometheusClient("http://127.0.0.1:9", bearer_token="t", username=USER, password="p")
    with pytest.raises(ValueError, match="client key needs"):
        PrometheusClient("http://127.0.0.1:9", key_file="client.key")


# --- TLS, client certificates and basic auth against a real Prometheus -----------------------


def test_ca_client_certificate_and_basic_auth_reach_a_secured_prometheus(secured):
    with secured.client() as client:
        assert [s.value for s in client.query("vector(7)").samples] == [7.0]
        (series,) = client.query_range("vector(time())", T0, T0 + 4, 1)
    np.testing.assert_array_equal(series.values, T0 + np.arange(5))


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
def test_insecure_skip_verify_accepts_the_unknown_ca(secured):
    with secured.client(ca_file="", insecure_skip_verify=True) as client:
        assert client.query("vector(1)").samples[0].value == 1.0


@pytest.mark.parametrize(
    "overrides",
    [
        pytest.param({"ca_file": ""}, id="server certificate from an unknown CA"),
        pytest.param({"cert_file": "", "key_file": ""}, id="no client certificate"),
    ],
)
def test_failed_tls_is_unreachable(secured, overrides):
    with (
        secured.client(**overrides) as client,
        pytest.raises(PrometheusError) as err,
    ):
        client.query("vector(1)")
    assert err.value.kind == "unreachable"


def test_a_wrong_password_is_an_http_error(secured, tmp_path):
    wrong = tmp_path / "password"
    wrong.write_text("wrong")
    with (
        secured.client(password_file=str(wrong)) as client,
        pytest.raises(PrometheusError, match="HTTP 401") as err,
    ):
        client.query("vector(1)")
    assert err.value.kind == "http"


# --- the components' config fields -----------------------------------------------------------


def _tls_flags(secured: SecuredPrometheus) -> list[str]:
    return [
        f"--prometheus-url={secured.url}",
        f"--prometheus-ca-file={secured.ca.cert_file}",
        f"--prometheus-cert-file={secured.client_cert.cert}",
        f"--prometheus-key-file={secured.client_cert.key}",
        f"--prometheus-username={USER}",
        f"--prometheus-password-file={secured.password_file}",
    ]


def _parse(cls: type, argv: list[str]):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser, cls)
    return config_from_args(cls, parser.parse_args(argv))


def test_predictor_and_autoscaler_flags_build_the_same_working_client(secured, tmp_path):
    predictor_file = tmp_path / "predictor.yaml"
    predictor_file.write_text(
        yaml.safe_dump(
            {
                "prometheus_headers": {"X-Scope-OrgID": "team-a"},
                "targets": [{"name": "r", "query": "vector(1)", "step": "1m", "horizons": [1]}],
            }
        )
    )
    predictor = _parse(
        PredictorConfig,
        [f"--config={predictor_file}", "--prometheus-timeout=5s", *_tls_flags(secured)],
    )
    autoscaler = _parse(AutoscalerConfig, ["--prometheus-timeout=5", *_tls_flags(secured)])
    for config, timeout in ((predictor, predictor.timeout_seconds), (autoscaler, 5.0)):
        with config.prometheus_client(timeout) as client:
            assert client.timeout == 5.0
            assert client.query("vector(3)").samples[0].value == 3.0
    with predictor.prometheus_client(5) as client:
        assert client.headers == {"X-Scope-OrgID": "team-a"}


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"prometheus_url": "prometheus:9090"}, "must start with http://"),
        (
            {"prometheus_url": "http://admin:s3cret@prometheus:9090"},
            r"'http://admin:\*\*\*@prometheus:9090' carries a password.*--prometheus-password-file",
        ),
        ({"prometheus_username": USER}, "needs prometheus_password_file"),
        ({"prometheus_password_file": "p"}, "needs prometheus_username"),
        ({"prometheus_key_file": "k"}, "needs prometheus_cert_file"),
        (
            {
                "prometheus_bearer_token_file": "t",
                "prometheus_username": "u",
                "prometheus_password_file": "p",
            },
            "not both",
        ),
        ({"prometheus_headers": {"X-Org": 1}}, "string values"),
    ],
)
def test_bad_access_settings_name_the_fix(values, message):
    with pytest.raises(ConfigError, match=message):
        PrometheusAccessConfig(**values)


def test_an_unreadable_token_file_stops_the_component_at_startup(tmp_path):
    config = PrometheusAccessConfig(prometheus_bearer_token_file=str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match=r"cannot read bearer token file .*missing"):
        config.prometheus_client(timeout=5)


@pytest.mark.parametrize(
    "name", ["prometheus_ca_file", "prometheus_cert_file", "prometheus_key_file"]
)
@pytest.mark.parametrize("problem", ["missing", "directory", "unreadable"])
def test_a_tls_file_that_cannot_be_read_is_refused_at_startup(tmp_path, name, problem):
    path = tmp_path / "tls.pem"
    if problem == "directory":
        path.mkdir()
    elif problem == "unreadable":
        path.write_text("x")
        path.chmod(0)
        if os.access(path, os.R_OK):
            pytest.skip("running as root: every file is readable")
    values = {name: str(path)}
    if name == "prometheus_key_file":
        cert = tmp_path / "cert.pem"
        cert.write_text("x")
        values["prometheus_cert_file"] = str(cert)
    flag = "--" + name.replace("_", "-")
    with pytest.raises(ConfigError, match=rf"^{flag} \({name}\) '.*tls.pem': .*can read$"):
        PrometheusAccessConfig(**values)


@pytest.mark.parametrize(
    ("component", "flags"),
    [
        ("predictor", ["--config", "CONFIG"]),
        ("autoscaler", []),
    ],
)
def test_a_missing_ca_file_stops_the_component_with_one_line(tmp_path, capsys, component, flags):
    config = tmp_path / "predictor.yaml"
    config.write_text(yaml.safe_dump({"targets": [{"name": "r", "query": "vector(1)"}]}))
    argv = [str(config) if f == "CONFIG" else f for f in flags]
    argv += ["--prometheus-ca-file", str(tmp_path / "nope")]
    if component == "predictor":
        from predictor.cli import main
    else:
        from autoscaler.cli import main
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "--prometheus-ca-file" in line and "nope" in line
