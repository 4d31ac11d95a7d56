"""``tls_server_config``: validated into a server :class:`ssl.SSLContext` and the PEM material.

Everything is checked when the file is loaded: a missing or unreadable certificate, a version
name that does not exist, a client CA without a client auth type that uses it -- each is a
:class:`~autoglm.config.ConfigError` naming the key. A setting that Python's ``ssl`` module
cannot honour is refused rather than silently ignored:

* ``RequestClientCert`` asks for nothing (Python cannot request a certificate without verifying
  it); the server never looks at an unverified certificate anyway, so access is the same.
* ``RequireAnyClientCert`` verifies the certificate against ``client_ca_file`` (stricter).
* ``curve_preferences`` is refused.

What a running server may take from a changed file is the certificate, its key and
``client_allowed_sans`` (but not an empty list in place of a non-empty one, which would let in
every certificate the client CA signed); :func:`restart_only_change` says why anything else
needs a restart.
"""

from __future__ import annotations

import hmac
import os
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoglm.config import ConfigError
from autoglm.webconfig.sections import optional_string, reject_unknown, resolve, string_list

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


@dataclass(frozen=True)
class TLSMaterial:
    """The server certificate chain, its key and the client CA as PEM, for servers that take no
    :class:`ssl.SSLContext` (gRPC); ``client_auth_type`` as in the file."""

    certificate_chain: bytes
    private_key: bytes
    client_ca: bytes | None = None
    client_auth_type: str = "NoClientCert"
    # What such a server must refuse to serve if it cannot enforce it.
    min_version: str = "TLS12"
    max_version: str = "TLS13"
    cipher_suites: tuple[str, ...] = ()


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


def restart_only_change(old: TLSSettings | None, new: TLSSettings | None) -> str | None:
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
    if old and new and old.client_allowed_sans and not new.client_allowed_sans:
        return (
            "tls_server_config.client_allowed_sans would be left empty, letting in every "
            "certificate the client CA signed (a truncated or half-written file?); a reload "
            "never widens who gets in: to drop the list on purpose, restart the component with "
            "the new file"
        )
    return None


def client_certificate_allowed(
    tls: TLSSettings | None, peer_certificate: Mapping[str, Any] | None
) -> bool:
    """Check ``client_allowed_sans`` against a verified peer (``SSLSocket.getpeercert()``)."""
    if tls is None or not tls.client_allowed_sans:
        return True
    if not peer_certificate:
        return False
    names = {value for _kind, value in peer_certificate.get("subjectAltName", ())}
    return any(
        any(hmac.compare_digest(allowed.encode(), name.encode()) for name in names)
        for allowed in tls.client_allowed_sans
    )


def load_tls(section: dict[str, Any], base: Path, where: str) -> TLSSettings:
    """Validate ``tls_server_config`` and build the server context; files resolve from ``base``."""
    prefix = "tls_server_config."
    reject_unknown(section, _TLS_KEYS, where, prefix)
    if section.get("curve_preferences"):
        raise ConfigError(
            f"{where}: {prefix}curve_preferences is not supported by Python's ssl; remove it "
            "(the OpenSSL defaults are used)"
        )

    cert, cert_file = (optional_string(section, k, where, prefix) for k in ("cert", "cert_file"))
    key, key_file = (optional_string(section, k, where, prefix) for k in ("key", "key_file"))
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
    min_name = optional_string(section, "min_version", where, prefix) or "TLS12"
    max_name = optional_string(section, "max_version", where, prefix) or "TLS13"
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

    auth_type = optional_string(section, "client_auth_type", where, prefix) or "NoClientCert"
    if auth_type not in _CLIENT_AUTH:
        raise ConfigError(
            f"{where}: {prefix}client_auth_type {auth_type!r} is not one of "
            + ", ".join(_CLIENT_AUTH)
        )
    verify_mode, needs_ca = _CLIENT_AUTH[auth_type]
    client_ca = optional_string(section, "client_ca", where, prefix)
    client_ca_file = optional_string(section, "client_ca_file", where, prefix)
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
        ca_path = resolve(base, client_ca_file)
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
        client_ca_pem: bytes | None = resolve(base, client_ca_file).read_bytes()
    else:
        client_ca_pem = client_ca.encode() if client_ca else None

    sans = string_list(section, "client_allowed_sans", where, prefix)
    if sans and auth_type not in _CLIENT_AUTH_WITH_CERT:
        raise ConfigError(
            f"{where}: {prefix}client_allowed_sans needs client_auth_type "
            "RequireAndVerifyClientCert (or RequireAnyClientCert)"
        )

    suites = string_list(section, "cipher_suites", where, prefix)
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
        files=tuple(resolve(base, name) for name in (cert_file, key_file, client_ca_file) if name),
        material=TLSMaterial(
            chain, private_key, client_ca_pem, auth_type, min_name, max_name, tuple(suites)
        ),
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
                path = resolve(base, file_name)
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
