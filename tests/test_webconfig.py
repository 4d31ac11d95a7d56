"""The exporter-toolkit web config: what loads, what is refused and how passwords are checked."""

from __future__ import annotations

import base64
import ssl
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml
from prometheus_client import CollectorRegistry

from autoglm.config import ConfigError
from autoglm.web.exposition import registry_route
from autoglm.web.server import HTTPServer
from autoglm.webconfig import WebConfig, basic_auth, loaded, reload
from autoglm.webconfig.parse import Settings
from tests.selfsigned import ScratchCA


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def htpasswd_style_hash(password: str, cost: int = 4) -> str:
    """A ``$2y$`` hash as htpasswd writes it (cost 4 keeps the tests fast)."""
    hashed = bcrypt.hashpw(password.encode(), bcrypt.gensalt(cost)).decode()
    return hashed.replace("$2b$", "$2y$", 1)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("pki")
    ca = ScratchCA(folder)
    server = ca.server()
    other = ScratchCA(folder, "other CA").server("other-server")
    return {
        "ca": ca.cert_file,
        "cert": server.cert,
        "key": server.key,
        "other_key": other.key,
        "dir": folder,
    }


def write_config(folder: Path, data: object) -> Path:
    path = folder / "web-config.yml"
    path.write_text(yaml.safe_dump(data))
    return path


def load(folder: Path, data: object) -> WebConfig:
    return WebConfig.load(write_config(folder, data))


def test_no_file_means_plain_http_without_auth() -> None:
    config = WebConfig.load(None)
    assert config.ssl_context() is None
    assert not config.auth_required
    assert config.authorized(None)
    assert config.headers == {}


def test_empty_file_is_plain_http(tmp_path: Path) -> None:
    path = tmp_path / "web.yml"
    path.write_text("")
    assert WebConfig.load(path).ssl_context() is None


def test_full_config_builds_tls_context_headers_and_users(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    config = load(
        tmp_path,
        {
            "tls_server_config": {
                "cert_file": str(pki["cert"]),
                "key_file": str(pki["key"]),
                "client_auth_type": "RequireAndVerifyClientCert",
                "client_ca_file": str(pki["ca"]),
                "min_version": "TLS13",
            },
            "http_server_config": {
                "http2": True,
                "headers": {"X-Frame-Options": "deny", "Content-Security-Policy": "default-src"},
            },
            "basic_auth_users": {"alice": htpasswd_style_hash("wonderland")},
        },
    )
    context = config.ssl_context()
    assert isinstance(context, ssl.SSLContext)
    assert context.minimum_version is ssl.TLSVersion.TLSv1_3
    assert context.maximum_version is ssl.TLSVersion.TLSv1_3
    assert context.verify_mode is ssl.CERT_REQUIRED
    assert config.headers == {"X-Frame-Options": "deny", "Content-Security-Policy": "default-src"}
    assert config.auth_required


def test_default_tls_versions_and_no_client_cert(tmp_path: Path, pki: dict[str, Path]) -> None:
    config = load(
        tmp_path,
        {"tls_server_config": {"cert_file": str(pki["cert"]), "key_file": str(pki["key"])}},
    )
    context = config.ssl_context()
    assert context is not None
    assert context.minimum_version is ssl.TLSVersion.TLSv1_2
    assert context.verify_mode is ssl.CERT_NONE


def test_relative_paths_resolve_from_the_config_folder(pki: dict[str, Path]) -> None:
    config = load(
        pki["dir"],
        {"tls_server_config": {"cert_file": pki["cert"].name, "key_file": pki["key"].name}},
    )
    assert config.ssl_context() is not None


def test_inline_pem_certificate_and_key(tmp_path: Path, pki: dict[str, Path]) -> None:
    config = load(
        tmp_path,
        {
            "tls_server_config": {
                "cert": pki["cert"].read_text(),
                "key": pki["key"].read_text(),
                "client_auth_type": "VerifyClientCertIfGiven",
                "client_ca": pki["ca"].read_text(),
            }
        },
    )
    context = config.ssl_context()
    assert context is not None
    assert context.verify_mode is ssl.CERT_OPTIONAL


def test_cipher_suites_use_go_names(tmp_path: Path, pki: dict[str, Path]) -> None:
    config = load(
        tmp_path,
        {
            "tls_server_config": {
                "cert_file": str(pki["cert"]),
                "key_file": str(pki["key"]),
                "max_version": "TLS12",
                "cipher_suites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
            }
        },
    )
    context = config.ssl_context()
    assert context is not None
    tls12 = {c["name"] for c in context.get_ciphers() if c["protocol"] == "TLSv1.2"}
    assert tls12 == {"ECDHE-ECDSA-AES128-GCM-SHA256"}


def test_password_check(tmp_path: Path) -> None:
    config = load(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("wonderland")}})
    assert config.authorized(basic("alice", "wonderland"))
    assert not config.authorized(basic("alice", "wonderlanD"))
    assert not config.authorized(basic("bob", "wonderland"))
    assert not config.authorized(None)
    assert not config.authorized("")
    assert not config.authorized("Bearer abc")
    assert not config.authorized("Basic not-base64!")
    assert not config.authorized("Basic " + base64.b64encode(b"no-colon").decode())


def test_password_with_colon_and_unicode(tmp_path: Path) -> None:
    config = load(tmp_path, {"basic_auth_users": {"jörg": htpasswd_style_hash("a:b:ç")}})
    assert config.authorized(basic("jörg", "a:b:ç"))
    assert not config.authorized(basic("jörg", "a:b"))


def test_long_password_is_truncated_like_go_bcrypt(tmp_path: Path) -> None:
    password = "p" * 72
    config = load(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash(password)}})
    assert config.authorized(basic("alice", password + "ignored by bcrypt"))


@pytest.fixture
def bcrypt_checks(monkeypatch: pytest.MonkeyPatch) -> list[tuple[bytes, bytes]]:
    """Every (password, hash) that basic auth hands to bcrypt, which still does the check."""
    checks: list[tuple[bytes, bytes]] = []
    real_checkpw = bcrypt.checkpw

    def recording_checkpw(password: bytes, hashed: bytes) -> bool:
        checks.append((password, hashed))
        return real_checkpw(password, hashed)

    monkeypatch.setattr(basic_auth.bcrypt, "checkpw", recording_checkpw)
    return checks


def test_successful_checks_are_cached_failures_are_not(
    tmp_path: Path, bcrypt_checks: list[tuple[bytes, bytes]]
) -> None:
    config = load(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("wonderland")}})
    for _ in range(5):
        assert config.authorized(basic("alice", "wonderland"))
    assert len(bcrypt_checks) == 1
    for _ in range(3):
        assert not config.authorized(basic("alice", "guess"))
    assert len(bcrypt_checks) == 4


def test_unknown_user_still_costs_a_bcrypt(
    tmp_path: Path, bcrypt_checks: list[tuple[bytes, bytes]]
) -> None:
    config = load(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("wonderland")}})
    assert not config.authorized(basic("mallory", "wonderland"))
    assert len(bcrypt_checks) == 1


def cost_of(hashed: bytes) -> int:
    return int(hashed.split(b"$")[2])


def test_unknown_users_cost_a_bcrypt_at_the_highest_cost_of_the_hashes_loaded(
    tmp_path: Path, bcrypt_checks: list[tuple[bytes, bytes]], caplog: pytest.LogCaptureFixture
) -> None:
    """A stand-in of a fixed cost made an unknown user answer slower (or faster) than a wrong
    password whenever the users' hashes had another cost: user names could be told apart."""
    users = {"alice": htpasswd_style_hash("a", 4), "bob": htpasswd_style_hash("b", 6)}
    path = write_config(tmp_path, {"basic_auth_users": users})
    config, clock = watched(path)
    assert "different bcrypt costs" in caplog.records[-1].getMessage()
    assert caplog.records[-1].costs == [4, 6]
    assert not config.authorized(basic("bob", "wrong"))
    assert not config.authorized(basic("mallory", "b"))
    (_, bob_hash), (_, stand_in) = bcrypt_checks
    assert cost_of(stand_in) == cost_of(bob_hash) == 6
    assert stand_in.decode() not in users.values()
    # The stand-in follows the costs of the file in force.
    rewrite(path, {"basic_auth_users": {"alice": htpasswd_style_hash("a", 5)}})
    clock.tick()
    assert config.reload_if_changed()
    bcrypt_checks.clear()
    assert not config.authorized(basic("alice", "wrong"))
    assert not config.authorized(basic("mallory", "a"))
    assert [cost_of(hashed) for _, hashed in bcrypt_checks] == [5, 5]
    # Successes are still remembered, failures never.
    assert config.authorized(basic("alice", "a"))
    assert config.authorized(basic("alice", "a"))
    assert not config.authorized(basic("mallory", "a"))
    assert len(bcrypt_checks) == 4


def test_cache_is_bounded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(basic_auth, "_AUTH_CACHE_SIZE", 3)
    users = {f"user{i}": htpasswd_style_hash(f"pw{i}") for i in range(5)}
    config = load(tmp_path, {"basic_auth_users": users})
    for i in range(5):
        assert config.authorized(basic(f"user{i}", f"pw{i}"))
        assert len(config._auth._accepted) <= 3


def test_client_allowed_sans(tmp_path: Path, pki: dict[str, Path]) -> None:
    config = load(
        tmp_path,
        {
            "tls_server_config": {
                "cert_file": str(pki["cert"]),
                "key_file": str(pki["key"]),
                "client_auth_type": "RequireAndVerifyClientCert",
                "client_ca_file": str(pki["ca"]),
                "client_allowed_sans": ["scraper.example"],
            }
        },
    )
    allowed = {"subjectAltName": (("DNS", "scraper.example"),)}
    other = {"subjectAltName": (("DNS", "intruder.example"),)}
    assert config.client_certificate_allowed(allowed)
    assert not config.client_certificate_allowed(other)
    assert not config.client_certificate_allowed(None)
    assert WebConfig().client_certificate_allowed(None)


BAD_CONFIGS = [
    pytest.param({"tls_config": {}}, "unknown key tls_config", id="unknown-top-level-key"),
    pytest.param(
        {"tls_server_config": {"cert_file": "x", "key_file": "y", "certfile": "z"}},
        "unknown key tls_server_config.certfile",
        id="unknown-tls-key",
    ),
    pytest.param(
        {"tls_server_config": {"cert_file": "missing.crt", "key_file": "missing.key"}},
        "tls_server_config.cert_file",
        id="missing-cert-file",
    ),
    pytest.param(
        {"tls_server_config": {"key_file": "k"}},
        "tls_server_config.cert_file is missing",
        id="no-cert",
    ),
    pytest.param(
        {"basic_auth_users": {"alice": "plaintext"}},
        "basic_auth_users.alice is not a bcrypt hash",
        id="plain-password",
    ),
    pytest.param(
        {"basic_auth_users": {"alice": "$2y$10$short"}},
        "htpasswd -nBC 10",
        id="truncated-hash",
    ),
    pytest.param({"basic_auth_users": ["alice"]}, "basic_auth_users must be a mapping", id="list"),
    pytest.param(
        {"http_server_config": {"headers": {"Server": "x"}}},
        "http_server_config.headers.Server cannot be set",
        id="header-not-allowed",
    ),
    pytest.param(
        {"http_server_config": {"headers": {"X-Frame-Options": "allow"}}},
        "is not one of deny, sameorigin",
        id="bad-header-value",
    ),
    pytest.param(
        {"http_server_config": {"http2": "yes please"}},
        "http2 must be true or false",
        id="bad-http2",
    ),
    pytest.param(
        {"rate_limit": {"interval": "1s", "burst": 20}},
        "rate_limit is not supported",
        id="rate-limit",
    ),
    pytest.param(["a"], "must be a mapping", id="not-a-mapping"),
]


@pytest.mark.parametrize(("data", "message"), BAD_CONFIGS)
def test_bad_config_names_the_key(tmp_path: Path, data: object, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("$", r"\$").replace(".", r"\.")):
        load(tmp_path, data)


def tls(pki: dict[str, Path], **extra: object) -> dict[str, object]:
    return {
        "tls_server_config": {"cert_file": str(pki["cert"]), "key_file": str(pki["key"])} | extra
    }


BAD_TLS = [
    pytest.param({"client_auth_type": "Always"}, "client_auth_type 'Always'", id="auth-type"),
    pytest.param(
        {"client_auth_type": "RequireAndVerifyClientCert"},
        "needs tls_server_config.client_ca_file",
        id="verify-without-ca",
    ),
    pytest.param({"min_version": "TLS14"}, "min_version 'TLS14' is not one of", id="version"),
    pytest.param(
        {"min_version": "TLS13", "max_version": "TLS12"}, "above max_version", id="min-above-max"
    ),
    pytest.param({"cipher_suites": ["AES128"]}, "'AES128' is not a supported suite", id="cipher"),
    pytest.param({"curve_preferences": ["X25519"]}, "curve_preferences", id="curves"),
    pytest.param(
        {"client_allowed_sans": ["a"]}, "client_allowed_sans needs client_auth_type", id="sans"
    ),
    pytest.param(
        {"prefer_server_cipher_suites": "yes"},
        "prefer_server_cipher_suites must be true or false",
        id="prefer",
    ),
]


@pytest.mark.parametrize(("extra", "message"), BAD_TLS)
def test_bad_tls_settings(
    tmp_path: Path, pki: dict[str, Path], extra: dict[str, object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, tls(pki, **extra))


def test_client_ca_without_auth_type_is_refused(tmp_path: Path, pki: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match="set client_auth_type: RequireAndVerifyClientCert"):
        load(tmp_path, tls(pki, client_ca_file=str(pki["ca"])))


def test_missing_client_ca_file(tmp_path: Path, pki: dict[str, Path]) -> None:
    with pytest.raises(ConfigError, match=r"client_ca_file .*nope\.crt.* does not exist"):
        load(
            tmp_path,
            tls(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file="nope.crt"),
        )


def test_key_that_does_not_match_the_certificate(tmp_path: Path, pki: dict[str, Path]) -> None:
    data = {"tls_server_config": {"cert_file": str(pki["cert"]), "key_file": str(pki["other_key"])}}
    with pytest.raises(ConfigError, match="matching PEM private key"):
        load(tmp_path, data)


def test_unreadable_and_invalid_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read it"):
        WebConfig.load(tmp_path / "absent.yml")
    broken = tmp_path / "broken.yml"
    broken.write_text("tls_server_config: [unclosed")
    with pytest.raises(ConfigError, match="not valid YAML"):
        WebConfig.load(broken)
    latin1 = tmp_path / "latin1.yml"
    latin1.write_bytes(b"# caf\xe9\nheaders: {}\n")
    with pytest.raises(ConfigError, match=r"latin1\.yml' is not UTF-8 text") as info:
        WebConfig.load(latin1)
    assert "\n" not in str(info.value)


# --- reloading ---------------------------------------------------------------------------------


class Clock:
    """A hand-moved monotonic clock, so reload checks happen exactly when a test says."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def tick(self) -> None:
        self.now += reload.RELOAD_CHECK_SECONDS


def watched(path: Path) -> tuple[WebConfig, Clock]:
    config = WebConfig.load(path)
    clock = Clock()
    config.watch(path, clock)
    return config, clock


def rewrite(path: Path, data: object) -> None:
    """Write new content the way a Secret volume update looks: a new inode."""
    fresh = path.with_suffix(".new")
    fresh.write_text(yaml.safe_dump(data))
    fresh.replace(path)


def test_changed_users_apply_after_the_next_check_and_old_passwords_stop_working(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("a")}})
    config, clock = watched(path)
    assert config.authorized(basic("alice", "a"))
    rewrite(path, {"basic_auth_users": {"bob": htpasswd_style_hash("b")}})
    assert config.authorized(basic("alice", "a")), "checked only once per interval"
    clock.tick()
    assert not config.authorized(basic("alice", "a")), "the cached success must not survive"
    assert config.authorized(basic("bob", "b"))
    assert (config.reloads, config.reload_failures) == (1, 0)


def test_unchanged_files_are_not_re_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write_config(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("a")}})
    config, clock = watched(path)
    monkeypatch.setattr(loaded, "read_settings", None)  # any re-read would fail
    clock.tick()
    assert not config.reload_if_changed()
    assert config.reloads == 0


def test_an_invalid_change_keeps_the_previous_settings_and_is_counted(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("a")}})
    config, clock = watched(path)
    rewrite(path, {"basic_auth_users": {"alice": "plain-text-password"}})
    clock.tick()
    assert not config.reload_if_changed()
    assert config.authorized(basic("alice", "a"))
    assert (config.reloads, config.reload_failures, config.last_reload_successful) == (0, 1, False)
    assert "not a bcrypt hash" in caplog.records[-1].error
    # Fixed later: applied, and the gauge says so again.
    rewrite(path, {"basic_auth_users": {"alice": htpasswd_style_hash("new")}})
    clock.tick()
    assert config.reload_if_changed()
    assert config.last_reload_successful
    assert config.authorized(basic("alice", "new"))


def test_a_deleted_file_keeps_the_previous_settings(tmp_path: Path) -> None:
    path = write_config(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("a")}})
    config, clock = watched(path)
    path.unlink()
    clock.tick()
    assert not config.reload_if_changed()
    assert config.auth_required and config.reload_failures == 1


@pytest.mark.parametrize(
    "change, message",
    [
        ({"tls_server_config": None}, "turning TLS on or off needs a restart"),
        ({"min_version": "TLS13"}, "tls_server_config.min_version changed"),
        (
            {"client_auth_type": "RequireAndVerifyClientCert", "client_ca_file": "ca"},
            "tls_server_config.client_auth_type, tls_server_config.client_ca_file changed",
        ),
    ],
)
def test_tls_changes_other_than_the_certificate_need_a_restart(
    tmp_path: Path,
    pki: dict[str, Path],
    change: dict,
    message: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    tls = {"cert_file": str(pki["cert"]), "key_file": str(pki["key"])}
    path = write_config(tmp_path, {"tls_server_config": tls})
    config, clock = watched(path)
    before = config.ssl_context()
    if "tls_server_config" in change:
        rewrite(path, change)
    else:
        ca = {"client_ca_file": str(pki["ca"])} if "client_ca_file" in change else {}
        rewrite(path, {"tls_server_config": {**tls, **change, **ca}})
    clock.tick()
    assert not config.reload_if_changed()
    assert config.reload_failures == 1
    assert config.ssl_context() is before
    assert message in caplog.records[-1].error
    families = {m.name: m for m in config.collect()}
    assert families["autoglm_web_config_last_reload_successful"].samples[0].value == 0


def watched_certificate(folder: Path, pki: dict[str, Path]) -> tuple[WebConfig, Clock, Path, Path]:
    """A watched config naming tls.crt and tls.key in ``folder``, as a mounted Secret does."""
    cert, key = folder / "tls.crt", folder / "tls.key"
    cert.write_bytes(pki["cert"].read_bytes())
    key.write_bytes(pki["key"].read_bytes())
    path = write_config(
        folder, {"tls_server_config": {"cert_file": "tls.crt", "key_file": "tls.key"}}
    )
    config, clock = watched(path)
    return config, clock, cert, key


def test_a_renewed_certificate_is_watched_through_the_files_the_config_names(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    """cert-manager rewrites tls.crt/tls.key; the web config itself does not change."""
    config, clock, cert, key = watched_certificate(tmp_path, pki)
    renewed = ScratchCA(tmp_path, "renewing CA").server("renewed")
    cert.write_bytes(renewed.cert.read_bytes())
    key.write_bytes(renewed.key.read_bytes())
    clock.tick()
    assert config.reload_if_changed()
    families = {m.name: m for m in config.collect()}
    assert {
        s.labels["result"]: s.value for s in families["autoglm_web_config_reloads"].samples
    } == {
        "success": 1,
        "failure": 0,
    }


def test_a_certificate_and_key_that_do_not_match_mid_rotation_are_refused(
    tmp_path: Path, pki: dict[str, Path]
) -> None:
    """The certificate written before its key: refuse, and take the pair once both are there."""
    config, clock, cert, key = watched_certificate(tmp_path, pki)
    renewed = ScratchCA(tmp_path, "renewing CA").server("renewed")
    cert.write_bytes(renewed.cert.read_bytes())
    clock.tick()
    assert not config.reload_if_changed()
    key.write_bytes(renewed.key.read_bytes())
    clock.tick()
    assert config.reload_if_changed()
    assert (config.reloads, config.reload_failures) == (1, 1)


def test_recently_authorized_knows_only_accepted_credentials_of_the_current_file(
    tmp_path: Path,
) -> None:
    path = write_config(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("a")}})
    config, clock = watched(path)
    assert not config.recently_authorized(basic("alice", "a"))
    assert config.authorized(basic("alice", "a"))
    assert config.recently_authorized(basic("alice", "a"))
    assert not config.authorized(basic("alice", "b"))
    assert not config.recently_authorized(basic("alice", "b"))
    assert not config.recently_authorized(None)
    rewrite(path, {"basic_auth_users": {"alice": htpasswd_style_hash("new")}})
    clock.tick()
    assert config.reload_if_changed()
    assert not config.recently_authorized(basic("alice", "a"))


# --- reloads that would open the door: a truncated or half-written file -------------------------


def refusal(caplog: pytest.LogCaptureFixture) -> str:
    """The error of the last refused reload, as logged."""
    records = [
        r
        for r in caplog.records
        if r.name == "autoglm.webconfig"
        and r.getMessage() == "web config not reloaded; keeping the previous settings"
    ]
    assert records, "no refused reload was logged"
    assert records[-1].levelname == "ERROR"
    error: str = records[-1].error
    assert "restart the component" in error, "says how to do it on purpose"
    return error


def truncate(path: Path) -> None:
    """``: > web-config.yml``: the same file, emptied in place."""
    with path.open("w"):
        pass


def test_a_truncated_file_keeps_basic_auth_on(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("a")}})
    config, clock = watched(path)
    truncate(path)
    clock.tick()
    assert not config.reload_if_changed()
    assert config.auth_required
    assert not config.authorized(None)
    assert config.authorized(basic("alice", "a"))
    assert (config.reloads, config.reload_failures, config.last_reload_successful) == (0, 1, False)
    assert "the file is empty or sets nothing" in refusal(caplog)
    # Only comments is as empty; the failure is counted again, the previous settings stay.
    path.write_text("# basic_auth_users:\n")
    clock.tick()
    assert not config.reload_if_changed()
    assert config.auth_required and config.reload_failures == 2


def test_a_truncated_file_keeps_answering_401_over_http(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The audit's reproduction, through a real server: 401, truncate the file, still 401."""
    monkeypatch.setattr(reload, "RELOAD_CHECK_SECONDS", 0.0)  # every request looks at the file
    path = write_config(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("a")}})
    registry = CollectorRegistry()
    routes = {"/metrics": registry_route(registry)}
    with HTTPServer("127.0.0.1:0", routes, WebConfig.load(path), registry=registry) as srv:
        assert requests.get(srv.url + "/metrics", timeout=10).status_code == 401
        truncate(path)
        assert requests.get(srv.url + "/metrics", timeout=10).status_code == 401
        metrics = requests.get(srv.url + "/metrics", auth=("alice", "a"), timeout=10)
    assert metrics.status_code == 200
    assert 'autoglm_web_config_reloads_total{result="failure"} 1.0' in metrics.text
    assert 'autoglm_web_config_reloads_total{result="success"} 0.0' in metrics.text
    assert "autoglm_web_config_last_reload_successful 0.0" in metrics.text
    assert "the file is empty or sets nothing" in refusal(caplog)


@pytest.mark.parametrize("text", ["false\n", "[]\n", "0\n", "- basic_auth_users\n", "basic_auth\n"])
def test_a_file_that_is_not_a_mapping_is_refused(
    tmp_path: Path, text: str, caplog: pytest.LogCaptureFixture
) -> None:
    path = write_config(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("a")}})
    config, clock = watched(path)
    path.write_text(text)
    clock.tick()
    assert not config.reload_if_changed()
    assert config.auth_required and config.reload_failures == 1
    assert "the file must be a mapping of key: value" in caplog.records[-1].error
    with pytest.raises(ConfigError, match="the file must be a mapping of key: value"):
        WebConfig.load(path)


@pytest.mark.parametrize(
    "users", [{}, {"basic_auth_users": None}, {"basic_auth_users": {}}], ids=["gone", "null", "{}"]
)
@pytest.mark.parametrize("client_certificates", [False, True], ids=["tls", "mutual-tls"])
def test_a_file_that_keeps_tls_but_loses_its_users_is_refused(
    tmp_path: Path,
    pki: dict[str, Path],
    users: dict[str, object],
    client_certificates: bool,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Also where client certificates are required: they would be the only check left."""
    tls = tls_block(pki, client_certificates)
    path = write_config(
        tmp_path,
        {"tls_server_config": tls, "basic_auth_users": {"alice": htpasswd_style_hash("a")}},
    )
    config, clock = watched(path)
    rewrite(path, {"tls_server_config": tls, **users})
    clock.tick()
    assert not config.reload_if_changed()
    assert config.auth_required and config.authorized(basic("alice", "a"))
    assert not config.authorized(None)
    assert config.reload_failures == 1
    assert "basic_auth_users would be left with no users" in refusal(caplog)


def tls_block(pki: dict[str, Path], client_certificates: bool = True) -> dict[str, object]:
    tls: dict[str, object] = {"cert_file": str(pki["cert"]), "key_file": str(pki["key"])}
    if client_certificates:
        tls |= {
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(pki["ca"]),
            "client_allowed_sans": ["prometheus.monitoring.svc", "scraper"],
        }
    return tls


def peer(name: str) -> dict[str, object]:
    return {"subjectAltName": (("DNS", name),)}


def test_emptying_client_allowed_sans_is_refused_changing_them_is_not(
    tmp_path: Path, pki: dict[str, Path], caplog: pytest.LogCaptureFixture
) -> None:
    tls = tls_block(pki)
    path = write_config(tmp_path, {"tls_server_config": tls})
    config, clock = watched(path)
    rewrite(path, {"tls_server_config": {**tls, "client_allowed_sans": ["scraper"]}})
    clock.tick()
    assert config.reload_if_changed()
    assert not config.client_certificate_allowed(peer("prometheus.monitoring.svc"))
    for emptied in (
        {**tls, "client_allowed_sans": []},
        {k: v for k, v in tls.items() if k != "client_allowed_sans"},
    ):
        rewrite(path, {"tls_server_config": emptied})
        clock.tick()
        assert not config.reload_if_changed()
        assert not config.client_certificate_allowed(peer("intruder"))
        assert "client_allowed_sans would be left empty" in refusal(caplog)
    assert (config.reloads, config.reload_failures) == (1, 2)


@pytest.mark.parametrize("users_first", [False, True], ids=["users-last", "users-first"])
def test_no_part_of_a_file_being_written_opens_the_door(
    tmp_path: Path, pki: dict[str, Path], users_first: bool
) -> None:
    """Whatever prefix of the file a reload reads: TLS stays on, a password is still needed and
    the client certificates' names are still checked."""
    data = {
        "tls_server_config": tls_block(pki),
        "http_server_config": {"headers": {"X-Content-Type-Options": "nosniff"}},
        "basic_auth_users": {"alice": htpasswd_style_hash("a"), "bob": htpasswd_style_hash("b")},
    }
    full = yaml.safe_dump(data, sort_keys=users_first)  # sorted: basic_auth_users comes first
    path = tmp_path / "web-config.yml"
    path.write_text(full)
    config, clock = watched(path)
    # Cut at and around every line end, key and list item, and every 16th character between.
    cuts = set(range(0, len(full), 16)) | {len(full)}
    for i, char in enumerate(full):
        if char in "\n:-":
            cuts |= {i, i + 1, i + 2}
    for end in sorted(cuts):
        path.write_text(full[:end])  # in place, as a writer that truncates, then writes
        clock.tick()
        config.reload_if_changed()
        written = f"after a reload of {full[:end]!r}"
        assert config.tls_material() is not None, written
        assert config.auth_required and not config.authorized(None), written
        assert not config.client_certificate_allowed(peer("intruder")), written
    assert config.last_reload_successful  # the whole file, once written
    assert config.authorized(basic("bob", "b"))


def test_a_file_written_while_it_is_read_is_read_again_not_applied_half(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_config(tmp_path, {"basic_auth_users": {"alice": htpasswd_style_hash("a")}})
    config, clock = watched(path)
    new_users = {"alice": htpasswd_style_hash("new"), "bob": htpasswd_style_hash("b")}
    full = yaml.safe_dump({"basic_auth_users": new_users})
    half = full[: full.index("  bob:")]  # alice's new line: a file that validates on its own
    path.write_text(half)
    real_read = loaded.read_settings

    def read_while_the_writer_finishes(p: Path) -> Settings:
        settings = real_read(p)
        path.write_text(full)
        return settings

    monkeypatch.setattr(loaded, "read_settings", read_while_the_writer_finishes)
    clock.tick()
    assert not config.reload_if_changed()
    assert config.authorized(basic("alice", "a")), "half the new file must not apply"
    assert (config.reloads, config.reload_failures, config.last_reload_successful) == (0, 0, True)
    monkeypatch.setattr(loaded, "read_settings", real_read)
    clock.tick()
    assert config.reload_if_changed()
    assert config.authorized(basic("alice", "new")) and config.authorized(basic("bob", "b"))
    assert not config.authorized(basic("alice", "a"))
