"""Checking ``Authorization: Basic`` headers against bcrypt hashes, as exporter-toolkit does.

A scrape every second must not cost a bcrypt each time: accepted credentials are remembered,
keyed by a keyed hash of the header so that nothing secret is kept in memory in clear, and
failures are never remembered. An unknown user costs a bcrypt too, so that a wrong user name
takes as long as a wrong password.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
from collections.abc import Mapping

import bcrypt

# bcrypt only reads the first 72 bytes of a password; Go's bcrypt (and htpasswd) truncate.
_BCRYPT_MAX_PASSWORD = 72
# Compared against when the user is unknown so that a wrong user costs as much as a wrong password.
_DUMMY_HASH = b"$2b$10$UxQpLUjTjHKM16nUO0bnmu8OEzHDXo1pTIbiilGQZVqo4MWQp.qOm"  # of a random secret
_AUTH_CACHE_SIZE = 1024


class BasicAuth:
    """The ``basic_auth_users`` of one state of the web config, and the credentials accepted."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        self.users = dict(users)
        self._cache_key = secrets.token_bytes(32)
        self._accepted: dict[bytes, bool] = {}

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
        hashed = stored if stored is not None else _DUMMY_HASH
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
