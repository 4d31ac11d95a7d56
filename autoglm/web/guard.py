"""Basic auth and the configured response headers, as aiohttp middleware over a web config.

When the web config has users, every path needs credentials (as in exporter-toolkit) except the
``open_paths`` a component lists (health checks that a kubelet probes without credentials). A
bcrypt check costs milliseconds of CPU, so it runs on a worker thread and never on the event
loop; credentials already accepted are recognised from the config's cache without that hop.
Each response, refusals included, carries ``http_server_config.headers``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING

from aiohttp import web

from autoglm.webconfig import WebConfig

if TYPE_CHECKING:
    from aiohttp.typedefs import Handler, Middleware

Refusal = Callable[[], web.StreamResponse]


async def authorized(web_config: WebConfig, authorization_header: str | None) -> bool:
    """Whether a request with this ``Authorization`` header may be served."""
    web_config.reload_if_changed()
    if not web_config.auth_required or web_config.recently_authorized(authorization_header):
        return True
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, web_config.authorized, authorization_header)


def guard(
    web_config: WebConfig,
    realm: str,
    refusal: Refusal,
    open_paths: Collection[str] = (),
) -> Middleware:
    """Middleware answering ``refusal()`` (the component's 401 answer, sent with a
    ``WWW-Authenticate`` naming ``realm``) to a request without valid credentials, and adding
    the configured headers to every response."""
    open_set = frozenset(open_paths)

    @web.middleware
    async def check_credentials(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in open_set or await authorized(
            web_config, request.headers.get("Authorization")
        ):
            response = await handler(request)
        else:
            response = refusal()
            response.headers["WWW-Authenticate"] = f'Basic realm="{realm}"'
        response.headers.update(web_config.headers)
        return response

    return check_credentials
