"""Web config files for the batcher's TLS and basic-auth tests, written once for every face.

The one-process server (REST and gRPC) and the ``--workers`` front workers (REST and gRPC) are
each tested against the same kind of config: TLS with a certificate from a scratch CA, basic
auth for one user, and for some client certificates from that CA. Writing it here keeps the
four faces tested against one config, and a change to its format reaches them all.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path

import bcrypt
import yaml

from tests.selfsigned import ScratchCA

# The Authorization header of the one basic-auth user (alice, password s3cret).
ALICE = "Basic " + base64.b64encode(b"alice:s3cret").decode()


def web_config_file(
    ca: ScratchCA,
    *,
    basic_auth: bool = True,
    client_sans: Sequence[str] = (),
    headers: dict[str, str] | None = None,
) -> Path:
    """A web config in ``ca``'s folder: TLS with a server certificate from ``ca``; with
    ``client_sans``, a client certificate from ``ca`` with one of those SANs required; with
    ``basic_auth``, alice's password (:data:`ALICE`) required; ``headers`` added to answers."""
    cert = ca.server()
    tls: dict[str, object] = {"cert_file": str(cert.cert), "key_file": str(cert.key)}
    if client_sans:
        tls |= {
            "client_auth_type": "RequireAndVerifyClientCert",
            "client_ca_file": str(ca.cert_file),
            "client_allowed_sans": list(client_sans),
        }
    config: dict[str, object] = {"tls_server_config": tls}
    if basic_auth:
        config["basic_auth_users"] = {"alice": bcrypt.hashpw(b"s3cret", bcrypt.gensalt(4)).decode()}
    if headers:
        config["http_server_config"] = {"headers": headers}
    path = ca.folder / "web.yml"
    path.write_text(yaml.safe_dump(config))
    return path
