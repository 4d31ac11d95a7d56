"""TLS and basic auth for HTTP endpoints, from a web config file in the exporter-toolkit format.

Operators of Prometheus exporters already keep ``web-config.yml`` files (``--web.config.file``)
with ``tls_server_config``, ``http_server_config.headers`` and ``basic_auth_users`` (bcrypt
hashes); every component here takes the same file so those files can be reused as they are.

Everything is validated when the file is loaded: an unknown key, a missing or unreadable
certificate, a hash that is not bcrypt, a version name that does not exist -- each is a
:class:`~autoglm.config.ConfigError` that names the key and says how to fix it. A setting that
Python's ``ssl`` module cannot honour is refused rather than silently ignored.

Differences from exporter-toolkit, by necessity of Python's ``ssl``:

* ``RequestClientCert`` asks for nothing (Python cannot request a certificate without verifying
  it); the server never looks at an unverified certificate anyway, so access is the same.
* ``RequireAnyClientCert`` verifies the certificate against ``client_ca_file`` (stricter).
* ``curve_preferences`` and ``rate_limit`` are refused; ``http2`` is accepted but the server
  speaks HTTP/1.1.

Renewed certificates are picked up without a restart, as exporter-toolkit does: cert-manager and
friends rewrite the certificate every few weeks, and an exporter serving an expired one silently
loses its scrapes. A config loaded from a file watches that file and the certificate, key and CA
files it names (checked at most once per :data:`RELOAD_CHECK_SECONDS`, on a TLS handshake or an
auth check), and swaps in the new certificate, users and headers when they change. A changed
file that does not validate, or that changes what only a restart can change (turning TLS on or
off, TLS versions, ciphers, client authentication), is refused with a logged error and the
previous settings stay in force: a typo during a rotation never opens or closes the door.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import os
import re
import secrets
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from autoglm.config import ConfigError

_TOP_LEVEL_KEYS = {"tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"}
_TLS_KEYS = {
    "cert",
    "key",
    "client_ca",
    "cert_file",
    "key_file",
    "client_auth_type",
    "client_ca_file",
    "client_allowed_sans",
    "min_version",
    "max_version",
    "cipher_suites",
    "prefer_server_cipher_suites",
    "curve_preferences",
}
_HTTP_KEYS = {"http2", "headers"}

_TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}

# client_auth_type -> (what ssl verifies, whether a CA is needed)
_CLIENT_AUTH = {
    "NoClientCert": (ssl.CERT_NONE, False),
    "RequestClientCert": (ssl.CERT_NONE, False),
    "RequireAnyClientCert": (ssl.CERT_REQUIRED, True),
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}
_CLIENT_AUTH_WITH_CERT = {"RequireAnyClientCert", "RequireAndVerifyClientCert"}

# Go's names of the TLS 1.2 suites crypto/tls considers secure -> OpenSSL's names. TLS 1.3 suites
# are not configurable in Go either.
_GO_CIPHER_SUITES = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA": "ECDHE-ECDSA-AES128-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA": "ECDHE-ECDSA-AES256-SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA": "ECDHE-RSA-AES128-SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA": "ECDHE-RSA-AES256-SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}

# Headers exporter-toolkit lets a config set, with the values it accepts (None: any string).
_ALLOWED_HEADERS: dict[str, set[str] | None] = {
    "Content-Security-Policy": None,
    "X-Frame-Options": {"deny", "sameorigin"},
    "X-Content-Type-Options": {"nosniff"},
    "X-XSS-Protection": None,
    "Strict-Transport-Security": None,
}

_BCRYPT_HASH = re.compile(r"^\$2[abxy]\$(\d\d)\$[./A-Za-z0-9]{53}$")
# bcrypt only reads the first 72 bytes of a password; Go's bcrypt (and htpasswd) truncate.
_BCRYPT_MAX_PASSWORD = 72
# Compared against when the user is unknown so that a wrong user costs as much as a wrong password.
_DUMMY_HASH = b"$2b$10$UxQpLUjTjHKM16nUO0bnmu8OEzHDXo1pTIbiilGQZVqo4MWQp.qOm"  # of a random secret
_AUTH_CACHE_SIZE = 1024
# How often, at most, the watched files are looked at (a few stat calls).
RELOAD_CHECK_SECONDS = 1.0

log = logging.getLogger("autoglm.webconfig")


@dataclass(frozen=True)
class TLSMaterial:
    """The server certificate chain, its key and the client CA as PEM, for servers that take no
    :class:`ssl.SSLContext` (gRPC); ``client_auth_type`` as in the file."""

    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None
    client_auth_type: str = "NoClientCert"


@dataclass(frozen=True)
class TLSSettings:
    """The validated ``tls_server_config`` block."""

    context: ssl.SSLContext
    client_auth_type: str = "NoClientCert"
    client_allowed_sans: tuple[str, ...] = ()
    # What a reload may not change on a running server: the block without cert and key.
    restart_only: tuple[tuple[str, str], ...] = ()
    files: tuple[Path, ...] = ()  # certificate, key and client CA files, to watch
    material: TLSMaterial | None = None


@dataclass(frozen=True)
class _Settings:
    """One validated state of the file; replaced whole on reload, so readers never see a mix."""

    tls: TLSSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)


class WebConfig:
    """A loaded web config: the TLS context, response headers and the basic-auth users."""

    def __init__(
        self,
        tls: TLSSettings | None = None,
        users: Mapping[str, bytes] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._settings = _Settings(tls, dict(users or {}), dict(headers or {}))
        self._front_context = tls.context if tls else None
        # Positive results only, keyed by a keyed hash of the Authorization header: a scrape every
        # second must not cost a bcrypt each time, and nothing secret is kept in memory in clear.
        self._cache_key = secrets.token_bytes(32)
        self._authorized_cache: dict[bytes, bool] = {}
        # Set by watch(): the file this config came from and what its files looked like.
        self._path: Path | None = None
        self._stamp: tuple[object, ...] = ()
        self._next_check = 0.0
        self._clock: Callable[[], float] = time.monotonic
        self._reload_lock = threading.Lock()
        self.reloads = 0
        self.reload_failures = 0
        self.last_reload_successful = True

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None) -> WebConfig:
        """Read and validate ``path`` and watch it; ``None`` means plain HTTP without auth."""
        if path is None or str(path) == "":
            return cls()
        config = cls._read(Path(path))
        config.watch(Path(path))
        return config

    @classmethod
    def _read(cls, p: Path) -> WebConfig:
        try:
            text = p.read_text()
        except OSError as exc:
            raise ConfigError(
                f"web config {str(p)!r}: cannot read it ({exc.strerror}); "
                "check the path given to --web-config-file"
            ) from exc
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"web config {str(p)!r} is not valid YAML: {exc}") from exc
        return cls.from_mapping(data or {}, base_dir=p.parent, source=str(p))

    @classmethod
    def from_mapping(
        cls, data: Any, base_dir: Path | None = None, source: str = "web config"
    ) -> WebConfig:
        """Validate an already parsed web config; relative file names resolve from ``base_dir``."""
        where = f"web config {source!r}" if source != "web config" else source
        section = _mapping(data, where, "the file")
        _reject_unknown(section, _TOP_LEVEL_KEYS, where, "")
        if "rate_limit" in section:
            raise ConfigError(
                f"{where}: rate_limit is not supported by this server; remove it "
                "(rate-limit in a proxy in front if you need it)"
            )
        base = base_dir or Path.cwd()
        tls = None
        if section.get("tls_server_config") is not None:
            tls = _load_tls(
                _mapping(section["tls_server_config"], where, "tls_server_config"), base, where
            )
        headers: dict[str, str] = {}
        if section.get("http_server_config") is not None:
            headers = _load_http(
                _mapping(section["http_server_config"], where, "http_server_config"), where
            )
        users: dict[str, bytes] = {}
        if section.get("basic_auth_users") is not None:
            users = _load_users(
                _mapping(section["basic_auth_users"], where, "basic_auth_users"), where
            )
        return cls(tls=tls, users=users, headers=headers)

    # --- reloading ------------------------------------------------------------------------

    def watch(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        """Reload from ``path`` when it or the files it names change (see the module doc)."""
        self._path = path
        self._clock = clock
        self._stamp = self._files_stamp(self._settings)
        self._next_check = clock() + RELOAD_CHECK_SECONDS
        if self._front_context is not None:
            # Servers hold this context for good; each handshake switches to the current one.
            self._front_context.sni_callback = self._on_handshake

    @property
    def watched(self) -> bool:
        """Whether this config follows its file (it came from :meth:`load`)."""
        return self._path is not None

    def reload_if_changed(self) -> bool:
        """Re-read the file if it or its certificate files changed; whether new settings apply.

        Cheap enough for every request: between checks it only reads the clock.
        """
        if self._path is None or self._clock() < self._next_check:
            return False
        if not self._reload_lock.acquire(blocking=False):
            return False  # another thread is checking right now
        try:
            self._next_check = self._clock() + RELOAD_CHECK_SECONDS
            stamp = self._files_stamp(self._settings)
            if stamp == self._stamp:
                return False
            self._stamp = stamp
            return self._reload(self._path)
        finally:
            self._reload_lock.release()

    def _reload(self, path: Path) -> bool:
        try:
            fresh = self._read(path)._settings
            problem = _restart_only_change(self._settings.tls, fresh.tls)
        except ConfigError as exc:
            problem = str(exc)
        if problem:
            self.reload_failures += 1
            self.last_reload_successful = False
            log.error(
                "web config not reloaded; keeping the previous settings",
                extra={"path": str(path), "error": problem},
            )
            return False
        self._settings = fresh
        self._authorized_cache = {}
        self.reloads += 1
        self.last_reload_successful = True
        log.info(
            "web config reloaded",
            extra={"path": str(path), "tls": fresh.tls is not None, "users": len(fresh.users)},
        )
        return True

    def _files_stamp(self, settings: _Settings) -> tuple[object, ...]:
        """What the watched files look like now: a Secret update changes inode or mtime."""
        assert self._path is not None
        files = (self._path, *(settings.tls.files if settings.tls else ()))
        stamp: list[object] = []
        for f in files:
            try:
                st = f.stat()
                stamp.append((str(f), st.st_ino, st.st_mtime_ns, st.st_size))
            except OSError:
                stamp.append((str(f), None))
        return tuple(stamp)

    def _on_handshake(self, connection: Any, _server_name: str | None, context: Any) -> None:
        """SNI callback, run on every handshake (also without SNI): present the current cert."""
        try:
            self.reload_if_changed()
            current = self._settings.tls
            if current is not None and current.context is not context:
                connection.context = current.context
        except Exception:  # an exception here would fail the handshake with an opaque alert
            log.exception("web config check during a TLS handshake failed")

    def collect(self) -> Iterator[Metric]:
        """Reload outcomes as metrics (register the config with a registry to export them)."""
        reloads = CounterMetricFamily(
            "autoglm_web_config_reloads",
            "Web config reloads after its file or certificate files changed, by result.",
            labels=["result"],
        )
        reloads.add_metric(["success"], self.reloads)
        reloads.add_metric(["failure"], self.reload_failures)
        yield reloads
        yield GaugeMetricFamily(
            "autoglm_web_config_last_reload_successful",
            "1 if the last change to the web config was applied, 0 if it was refused and the "
            "previous settings are still in force.",
            value=float(self.last_reload_successful),
        )

    # --- what servers ask -----------------------------------------------------------------

    @property
    def headers(self) -> Mapping[str, str]:
        """Response headers set by ``http_server_config.headers``."""
        return self._settings.headers

    def ssl_context(self) -> ssl.SSLContext | None:
        """The server-side TLS context, or ``None`` for plain HTTP.

        Always the context the server started with; its handshakes switch to a reloaded one.
        """
        return self._front_context

    @property
    def auth_required(self) -> bool:
        """Whether requests need basic-auth credentials."""
        return bool(self._settings.users)

    def recently_authorized(self, authorization_header: str | None) -> bool:
        """Whether these exact credentials were accepted since the last reload: a dictionary
        look-up, cheap enough for an event loop, where :meth:`authorized` may cost a bcrypt."""
        if not authorization_header:
            return False
        fingerprint = hmac.digest(self._cache_key, authorization_header.encode(), hashlib.sha256)
        return bool(self._authorized_cache.get(fingerprint))

    def authorized(self, authorization_header: str | None) -> bool:
        """Check an ``Authorization`` header; always ``True`` when no users are configured."""
        self.reload_if_changed()
        users = self._settings.users
        if not users:
            return True
        if not authorization_header:
            return False
        cache = self._authorized_cache
        fingerprint = hmac.digest(self._cache_key, authorization_header.encode(), hashlib.sha256)
        if cache.get(fingerprint):
            return True
        credentials = _parse_basic(authorization_header)
        if credentials is None:
            return False
        user, password = credentials
        stored = users.get(user)
        hashed = stored if stored is not None else _DUMMY_HASH
        try:
            matches = bcrypt.checkpw(password[:_BCRYPT_MAX_PASSWORD], hashed)
        except ValueError:
            matches = False
        ok = matches and stored is not None
        if ok:
            if len(cache) >= _AUTH_CACHE_SIZE:
                cache.clear()
            cache[fingerprint] = True
        return ok

    def tls_material(self) -> TLSMaterial | None:
        """The current certificate, key and client CA as PEM (None without TLS); the watched
        files are checked first, as on a handshake, so a server polling this serves renewals."""
        self.reload_if_changed()
        tls = self._settings.tls
        return tls.material if tls else None

    def client_certificate_allowed(self, peer_certificate: Mapping[str, Any] | None) -> bool:
        """Check ``client_allowed_sans`` against a verified peer (``SSLSocket.getpeercert()``)."""
        tls = self._settings.tls
        if tls is None or not tls.client_allowed_sans:
            return True
        if not peer_certificate:
            return False
        names = {value for _kind, value in peer_certificate.get("subjectAltName", ())}
        return any(
            any(hmac.compare_digest(allowed.encode(), name.encode()) for name in names)
            for allowed in tls.client_allowed_sans
        )


def _restart_only_change(old: TLSSettings | None, new: TLSSettings | None) -> str | None:
    """Why ``new`` cannot replace ``old`` on a running server, or None if it can."""
    if (old is None) != (new is None):
        return (
            "turning TLS on or off needs a restart (a running server keeps its plain or TLS "
            "listener); restart the component to apply it"
        )
    if old is not None and new is not None and old.restart_only != new.restart_only:
        changed = sorted({k for k, _ in set(old.restart_only) ^ set(new.restart_only)})
        return (
            "tls_server_config." + ", tls_server_config.".join(changed) + " changed: only "
            "the certificate, key, users and headers are reloaded; restart the component to "
            "apply the rest"
        )
    return None


def _parse_basic(header: str) -> tuple[str, bytes] | None:
    scheme, _, encoded = header.strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        decoded = base64.b64decode(encoded.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    user, sep, password = decoded.partition(b":")
    if not sep:
        return None
    try:
        return user.decode("utf-8"), password
    except UnicodeDecodeError:
        return None


def _mapping(value: Any, where: str, key: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {key} must be a mapping of key: value")
    return value


def _reject_unknown(section: Mapping[str, Any], known: set[str], where: str, prefix: str) -> None:
    for key in section:
        if key not in known:
            raise ConfigError(
                f"{where}: unknown key {prefix}{key!s}; valid keys are: "
                + ", ".join(prefix + k for k in sorted(known))
            )


def _string(section: Mapping[str, Any], key: str, where: str, prefix: str) -> str | None:
    value = section.get(key)
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError(f"{where}: {prefix}{key} must be a string")
    return value


def _string_list(section: Mapping[str, Any], key: str, where: str, prefix: str) -> list[str]:
    value = section.get(key)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{where}: {prefix}{key} must be a list of strings")
    return value


def _resolve(base: Path, name: str) -> Path:
    p = Path(name)
    return p if p.is_absolute() else base / p


def _load_tls(section: dict[str, Any], base: Path, where: str) -> TLSSettings:
    prefix = "tls_server_config."
    _reject_unknown(section, _TLS_KEYS, where, prefix)
    if section.get("curve_preferences"):
        raise ConfigError(
            f"{where}: {prefix}curve_preferences is not supported by Python's ssl; remove it "
            "(the OpenSSL defaults are used)"
        )

    cert, cert_file = (_string(section, k, where, prefix) for k in ("cert", "cert_file"))
    key, key_file = (_string(section, k, where, prefix) for k in ("key", "key_file"))
    if cert and cert_file:
        raise ConfigError(f"{where}: set either {prefix}cert or {prefix}cert_file, not both")
    if key and key_file:
        raise ConfigError(f"{where}: set either {prefix}key or {prefix}key_file, not both")
    if not (cert or cert_file):
        raise ConfigError(
            f"{where}: {prefix}cert_file is missing; give the PEM certificate the server presents"
        )
    if not (key or key_file):
        raise ConfigError(f"{where}: {prefix}key_file is missing; give the certificate's PEM key")

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    min_name = _string(section, "min_version", where, prefix) or "TLS12"
    max_name = _string(section, "max_version", where, prefix) or "TLS13"
    for key_name, name in (("min_version", min_name), ("max_version", max_name)):
        if name not in _TLS_VERSIONS:
            raise ConfigError(
                f"{where}: {prefix}{key_name} {name!r} is not one of {', '.join(_TLS_VERSIONS)}"
            )
    if list(_TLS_VERSIONS).index(min_name) > list(_TLS_VERSIONS).index(max_name):
        raise ConfigError(
            f"{where}: {prefix}min_version {min_name} is above max_version {max_name}; swap them"
        )
    try:
        context.minimum_version = _TLS_VERSIONS[min_name]
        context.maximum_version = _TLS_VERSIONS[max_name]
    except (ValueError, ssl.SSLError) as exc:
        raise ConfigError(
            f"{where}: {prefix}min_version/max_version {min_name}..{max_name} is not available "
            f"in this OpenSSL ({exc}); use TLS12 or TLS13"
        ) from exc

    chain, private_key = _load_certificate(
        context, cert, cert_file, key, key_file, base, where, prefix
    )

    auth_type = _string(section, "client_auth_type", where, prefix) or "NoClientCert"
    if auth_type not in _CLIENT_AUTH:
        raise ConfigError(
            f"{where}: {prefix}client_auth_type {auth_type!r} is not one of "
            + ", ".join(_CLIENT_AUTH)
        )
    verify_mode, needs_ca = _CLIENT_AUTH[auth_type]
    client_ca = _string(section, "client_ca", where, prefix)
    client_ca_file = _string(section, "client_ca_file", where, prefix)
    if client_ca and client_ca_file:
        raise ConfigError(
            f"{where}: set either {prefix}client_ca or {prefix}client_ca_file, not both"
        )
    if (client_ca or client_ca_file) and auth_type == "NoClientCert":
        raise ConfigError(
            f"{where}: {prefix}client_ca_file is set but client_auth_type is NoClientCert; "
            "set client_auth_type: RequireAndVerifyClientCert to check client certificates"
        )
    if needs_ca and not (client_ca or client_ca_file):
        raise ConfigError(
            f"{where}: {prefix}client_auth_type {auth_type} needs {prefix}client_ca_file "
            "(the PEM CA that signed the client certificates)"
        )
    if client_ca_file:
        ca_path = _resolve(base, client_ca_file)
        try:
            context.load_verify_locations(cafile=str(ca_path))
        except FileNotFoundError as exc:
            raise ConfigError(
                f"{where}: {prefix}client_ca_file {str(ca_path)!r} does not exist; "
                "fix the path (relative paths start at the web config's folder)"
            ) from exc
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{where}: {prefix}client_ca_file {str(ca_path)!r} is not a PEM CA "
                f"certificate ({exc})"
            ) from exc
    elif client_ca:
        try:
            context.load_verify_locations(cadata=client_ca)
        except (ssl.SSLError, ValueError) as exc:
            raise ConfigError(
                f"{where}: {prefix}client_ca is not a PEM CA certificate ({exc})"
            ) from exc
    context.verify_mode = verify_mode
    if client_ca_file:
        client_ca_pem: bytes | None = _resolve(base, client_ca_file).read_bytes()
    else:
        client_ca_pem = client_ca.encode() if client_ca else None

    sans = _string_list(section, "client_allowed_sans", where, prefix)
    if sans and auth_type not in _CLIENT_AUTH_WITH_CERT:
        raise ConfigError(
            f"{where}: {prefix}client_allowed_sans needs client_auth_type "
            "RequireAndVerifyClientCert (or RequireAnyClientCert)"
        )

    suites = _string_list(section, "cipher_suites", where, prefix)
    if suites:
        unknown = [s for s in suites if s not in _GO_CIPHER_SUITES]
        if unknown:
            raise ConfigError(
                f"{where}: {prefix}cipher_suites: {unknown[0]!r} is not a supported suite; "
                "use names such as " + ", ".join(sorted(_GO_CIPHER_SUITES)[:2]) + ", ..."
            )
        try:
            context.set_ciphers(":".join(_GO_CIPHER_SUITES[s] for s in suites))
        except ssl.SSLError as exc:
            raise ConfigError(
                f"{where}: {prefix}cipher_suites: none is available in this OpenSSL ({exc})"
            ) from exc
    prefer_server = section.get("prefer_server_cipher_suites", True)
    if not isinstance(prefer_server, bool):
        raise ConfigError(f"{where}: {prefix}prefer_server_cipher_suites must be true or false")
    if prefer_server:
        context.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    else:
        context.options &= ~ssl.OP_CIPHER_SERVER_PREFERENCE

    reloadable = {"cert", "key", "cert_file", "key_file", "client_allowed_sans"}
    return TLSSettings(
        context=context,
        client_auth_type=auth_type,
        client_allowed_sans=tuple(sans),
        restart_only=tuple(sorted((k, repr(v)) for k, v in section.items() if k not in reloadable)),
        files=tuple(_resolve(base, name) for name in (cert_file, key_file, client_ca_file) if name),
        material=TLSMaterial(chain, private_key, client_ca_pem, auth_type),
    )


def _load_certificate(
    context: ssl.SSLContext,
    cert: str | None,
    cert_file: str | None,
    key: str | None,
    key_file: str | None,
    base: Path,
    where: str,
    prefix: str,
) -> tuple[bytes, bytes]:
    """Load the server certificate, and return it and its key as PEM; inline PEM goes through a
    private, deleted temp folder."""
    with tempfile.TemporaryDirectory(prefix="autoglm-tls-") as tmp:
        paths = {}
        for name, inline, file_name in (("cert", cert, cert_file), ("key", key, key_file)):
            if inline is not None:
                path = Path(tmp) / name
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with os.fdopen(fd, "w") as out:
                    out.write(inline)
                paths[name] = path
            else:
                assert file_name is not None
                path = _resolve(base, file_name)
                if not path.is_file():
                    raise ConfigError(
                        f"{where}: {prefix}{name}_file {str(path)!r} does not exist; fix the path "
                        "(relative paths start at the web config's folder)"
                    )
                paths[name] = path
        try:
            context.load_cert_chain(certfile=str(paths["cert"]), keyfile=str(paths["key"]))
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(
                f"{where}: cannot use {prefix}cert_file/key_file as a TLS certificate ({exc}); "
                "give a PEM certificate and its matching PEM private key (unencrypted)"
            ) from exc
        return paths["cert"].read_bytes(), paths["key"].read_bytes()


def _load_http(section: dict[str, Any], where: str) -> dict[str, str]:
    prefix = "http_server_config."
    _reject_unknown(section, _HTTP_KEYS, where, prefix)
    http2 = section.get("http2", True)
    if not isinstance(http2, bool):
        raise ConfigError(f"{where}: {prefix}http2 must be true or false")
    headers_in = section.get("headers") or {}
    if not isinstance(headers_in, dict):
        raise ConfigError(f"{where}: {prefix}headers must be a mapping of header: value")
    headers: dict[str, str] = {}
    lowered = {name.lower(): name for name in _ALLOWED_HEADERS}
    for name, value in headers_in.items():
        canonical = lowered.get(str(name).lower())
        if canonical is None:
            raise ConfigError(
                f"{where}: {prefix}headers.{name} cannot be set; allowed headers are: "
                + ", ".join(_ALLOWED_HEADERS)
            )
        if value is None or value == "":
            continue
        if not isinstance(value, str) or "\n" in value or "\r" in value:
            raise ConfigError(f"{where}: {prefix}headers.{name} must be a one-line string")
        accepted = _ALLOWED_HEADERS[canonical]
        if accepted is not None and value.lower() not in accepted:
            raise ConfigError(
                f"{where}: {prefix}headers.{name} {value!r} is not one of "
                + ", ".join(sorted(accepted))
            )
        headers[canonical] = value
    return headers


def _load_users(section: dict[str, Any], where: str) -> dict[str, bytes]:
    users: dict[str, bytes] = {}
    for user, hashed in section.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise ConfigError(
                f"{where}: basic_auth_users: user name {user!r} must be a non-empty string "
                "without ':'"
            )
        match = _BCRYPT_HASH.match(hashed) if isinstance(hashed, str) else None
        if match is None or not 4 <= int(match.group(1)) <= 31:
            raise ConfigError(
                f"{where}: basic_auth_users.{user} is not a bcrypt hash; make one with "
                "`htpasswd -nBC 10 \"\" | tr -d ':\\n'` or "
                "`python -c 'import bcrypt,getpass; "
                "print(bcrypt.hashpw(getpass.getpass().encode(), bcrypt.gensalt()).decode())'`"
            )
        users[user] = hashed.encode()
    return users
