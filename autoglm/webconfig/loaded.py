"""A loaded web config: what servers ask of it, and its reloads while they run.

Renewed certificates are picked up without a restart, as exporter-toolkit does: an exporter
serving an expired certificate silently loses its scrapes. A config loaded from a file watches
that file and the certificate, key and CA files it names (:mod:`autoglm.webconfig.reload`, on
a TLS handshake or an auth check), and swaps in the new certificate, users and headers when they
change. A changed file that does not validate, or that changes what only a restart can change,
is refused with a logged error and the previous settings stay in force: a typo during a rotation
never opens or closes the door. Only a restart can (:func:`refused_change`):

* turn TLS on or off, or change TLS versions, ciphers or client authentication;
* take an empty file (or one that sets nothing) in place of one that set something;
* leave ``basic_auth_users`` without users where it had some, turning basic auth off -- also
  where client certificates are required, which would then be the only check left;
* leave ``client_allowed_sans`` empty where it named some, letting in every certificate the
  client CA signed.

A truncated or half-written file is refused that way, or fails to validate, or (valid on its own:
the first of two users) narrows who gets in until the rest is written and read at the next
check; one that is written while it is read is read again at the next check
(:meth:`~autoglm.webconfig.reload.FileWatch.still_as_seen`) rather than applied or refused.
"""

from __future__ import annotations

import logging
import os
import ssl
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from autoglm.config import ConfigError
from autoglm.webconfig.basic_auth import BasicAuth
from autoglm.webconfig.parse import Settings, read_settings
from autoglm.webconfig.reload import FileWatch
from autoglm.webconfig.tls import (
    TLSMaterial,
    TLSSettings,
    client_certificate_allowed,
    restart_only_change,
)

log = logging.getLogger("autoglm.webconfig")


class WebConfig:
    """A loaded web config: the TLS context, response headers and the basic-auth users."""

    def __init__(
        self,
        tls: TLSSettings | None = None,
        users: Mapping[str, bytes] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self._settings = Settings(tls, dict(users or {}), dict(headers or {}))
        self._auth = BasicAuth(self._settings.users)
        self._front_context = tls.context if tls else None
        self._watch: FileWatch | None = None  # set by watch()
        self.reloads = 0
        self.reload_failures = 0
        self.last_reload_successful = True

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None) -> WebConfig:
        """Read and validate ``path`` and watch it; ``None`` means plain HTTP without auth."""
        if path is None or str(path) == "":
            return cls()
        settings = read_settings(Path(path))
        config = cls(settings.tls, settings.users, settings.headers)
        config.watch(Path(path))
        _warn_of_mixed_costs(config._auth, Path(path))
        return config

    # --- reloading ------------------------------------------------------------------------

    def watch(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        """Reload from ``path`` when it or the files it names change (see the module doc)."""
        self._watch = FileWatch(path, self._watched_files(), clock)
        if self._front_context is not None:
            # Servers hold this context for good; each handshake switches to the current one.
            self._front_context.sni_callback = self._on_handshake

    @property
    def watched(self) -> bool:
        """Whether this config follows its file (it came from :meth:`load`)."""
        return self._watch is not None

    def reload_if_changed(self) -> bool:
        """Re-read the file if it or its certificate files changed; whether new settings apply.

        Cheap enough for every request: between checks it only reads the clock.
        """
        watch = self._watch
        if watch is None or not watch.changed(self._watched_files()):
            return False
        return self._reload(watch)

    def _watched_files(self) -> tuple[Path, ...]:
        tls = self._settings.tls
        return tls.files if tls else ()

    def _reload(self, watch: FileWatch) -> bool:
        path = watch.path
        fresh: Settings | None = None
        try:
            fresh = read_settings(path)
            problem = refused_change(self._settings, fresh)
        except ConfigError as exc:
            problem = str(exc)
        if not watch.still_as_seen(self._watched_files()):
            # Written while it was read: neither apply nor refuse half a file; read it again.
            log.info(
                "web config changed while it was read; reading it again at the next check",
                extra={"path": str(path)},
            )
            return False
        if problem or fresh is None:
            self.reload_failures += 1
            self.last_reload_successful = False
            log.error(
                "web config not reloaded; keeping the previous settings",
                extra={"path": str(path), "error": problem},
            )
            return False
        self._settings = fresh
        self._auth = BasicAuth(fresh.users)  # accepted credentials do not outlive a change
        self.reloads += 1
        self.last_reload_successful = True
        log.info(
            "web config reloaded",
            extra={"path": str(path), "tls": fresh.tls is not None, "users": len(fresh.users)},
        )
        _warn_of_mixed_costs(self._auth, path)
        return True

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
        return self._auth.required

    def recently_authorized(self, authorization_header: str | None) -> bool:
        """Whether these exact credentials were accepted since the last reload: a dictionary
        look-up, cheap enough for an event loop, where :meth:`authorized` may cost a bcrypt."""
        return self._auth.recently_accepted(authorization_header)

    def authorized(self, authorization_header: str | None) -> bool:
        """Check an ``Authorization`` header; always ``True`` when no users are configured."""
        self.reload_if_changed()
        return self._auth.check(authorization_header)

    def tls_material(self) -> TLSMaterial | None:
        """The current certificate, key and client CA as PEM (None without TLS); the watched
        files are checked first, as on a handshake, so a server polling this serves renewals."""
        self.reload_if_changed()
        tls = self._settings.tls
        return tls.material if tls else None

    def client_certificate_allowed(self, peer_certificate: Mapping[str, Any] | None) -> bool:
        """Check ``client_allowed_sans`` against a verified peer (``SSLSocket.getpeercert()``)."""
        return client_certificate_allowed(self._settings.tls, peer_certificate)


def refused_change(old: Settings, new: Settings) -> str | None:
    """Why a running server may not take ``new`` in place of ``old``, or None if it may; the
    reason says how to apply it on purpose (restart the component with the new file)."""
    problem = restart_only_change(old.tls, new.tls)
    if problem:
        return problem
    if _sets_nothing(new) and not _sets_nothing(old):
        return (
            "the file is empty or sets nothing (a truncated or half-written file?); a reload "
            "never turns basic auth or the headers off: to run without them on purpose, "
            "restart the component with the new file"
        )
    if old.users and not new.users:
        return (
            "basic_auth_users would be left with no users, turning basic auth off (a truncated "
            "or half-written file?); a reload never turns basic auth off: to do it on purpose, "
            "restart the component with the new file"
        )
    return None


def _sets_nothing(settings: Settings) -> bool:
    return settings.tls is None and not settings.users and not settings.headers


def _warn_of_mixed_costs(auth: BasicAuth, path: Path) -> None:
    """Unknown users are checked at the highest cost: users whose hashes cost less answer
    faster, which tells that they exist."""
    costs = auth.costs
    if len(costs) > 1:
        log.warning(
            "basic_auth_users hashes have different bcrypt costs; a wrong password for a user "
            "whose hash costs less than the highest answers faster than an unknown user does, "
            "which tells that the user exists: give every hash the same cost",
            extra={"path": str(path), "costs": sorted(costs)},
        )
