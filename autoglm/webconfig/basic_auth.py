"""Checking ``Authorization: Basic`` headers against bcrypt hashes, as exporter-toolkit does.

A scrape every second must not cost a bcrypt each time: accepted credentials are remembered,
keyed by a keyed hash of the header so that nothing secret is kept in memory in clear, and
failures are never remembered. An unknown user costs a bcrypt too, so that a wrong user name
takes as long as a wrong password: it is checked against a stand-in hash of a random secret at
the highest cost among the configured hashes (the cost is in the hash: ``$2y$12$...``), made
when the users are loaded. Where the costs differ, users whose hashes cost less still answer
faster than an unknown user; :mod:`autoglm.webconfig.loaded` warns of it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import secrets
import threading
from collections.abc import Mapping

import bcrypt

# bcrypt only reads the first 72 bytes of a password; Go's bcrypt (and htpasswd) truncate.
_BCRYPT_MAX_PASSWORD = 72
_AUTH_CACHE_SIZE = 1024
# The cost of a bcrypt hash, as Go's bcrypt, htpasswd and Python's bcrypt write it.
_COST = re.compile(rb"^\$2[abxy]\$(\d\d)\$")
# The stand-in's cost where a hash's cannot be read (hashes in a file are validated to have one).
_DEFAULT_COST = 10
# Stand-in hashes by cost, made once per process: a reload that keeps the highest cost pays no
# bcrypt for it, one that raises it pays one (on the thread that reloads).
_stand_ins: dict[int, bytes] = {}
_stand_ins_lock = threading.Lock()


class BasicAuth:
    """The ``basic_auth_users`` of one state of the web config, and the credentials accepted."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self.users = dict(users)
        self._cache_key = secrets.token_bytes(32)
        self._accepted: dict[bytes, bool] = {}
        self.costs = frozenset(bcrypt_cost(hashed) for hashed in self.users.values())
        # Compared against when the user is unknown, so that a wrong user costs as much as a
        # wrong password for the users whose hashes cost the most.
        self.stand_in = stand_in_hash(max(self.costs)) if self.costs else None

    @property
    def required(self) -> bool:
        """Whether requests need credentials (any user is configured)."""
        return bool(self.users)

    def recently_accepted(self, authorization_header: str | None) -> bool:
        """Whether these exact credentials were accepted before: a dictionary look-up."""
        if not authorization_header:
            return False
        return bool(self._accepted.get(self._fingerprint(authorization_header)))

    def check(self, authorization_header: str | None) -> bool:
        """Check an ``Authorization`` header; always ``True`` when no users are configured."""
        if not self.users:
            return True
        if not authorization_header:
            return False
        fingerprint = self._fingerprint(authorization_header)
        if self._accepted.get(fingerprint):
            return True
        credentials = parse_basic(authorization_header)
        if credentials is None:
            return False
        user, password = credentials
        stored = self.users.get(user)
        hashed = stored if stored is not None else self.stand_in
        assert hashed is not None  # there are users, so there is a stand-in
        try:
            matches = bcrypt.checkpw(password[:_BCRYPT_MAX_PASSWORD], hashed)
        except ValueError:
            matches = False
        ok = matches and stored is not None
        if ok:
            if len(self._accepted) >= _AUTH_CACHE_SIZE:
                self._accepted.clear()
            self._accepted[fingerprint] = True
        return ok

    def _fingerprint(self, authorization_header: str) -> bytes:
        return hmac.digest(self._cache_key, authorization_header.encode(), hashlib.sha256)


def bcrypt_cost(hashed: bytes) -> int:
    """The cost written in a bcrypt hash (``$2y$12$...``: 12); the default cost when none is."""
    match = _COST.match(hashed)
    return int(match.group(1)) if match else _DEFAULT_COST


def stand_in_hash(cost: int) -> bytes:
    """A bcrypt hash of a random secret at ``cost``: checking a password against it costs what
    checking one against a user's hash of that cost does, and no password matches it."""
    cost = min(max(cost, 4), 31)  # what bcrypt accepts; a file's hashes are validated to it
    with _stand_ins_lock:
        hashed = _stand_ins.get(cost)
        if hashed is None:
            secret = secrets.token_urlsafe(32).encode()
            hashed = _stand_ins[cost] = bcrypt.hashpw(secret, bcrypt.gensalt(cost))
        return hashed


def parse_basic(header: str) -> tuple[str, bytes] | None:
    """``(user, password)`` from a ``Basic`` header; None when it is not one."""
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
