"""The kernel's HTTP serving on aiohttp, shared by every component.

:mod:`~autoglm.web.binding` turns ``--listen HOST:PORT`` into a bound socket with clear errors;
:mod:`~autoglm.web.listener` accepts connections on it for an aiohttp server (connection limit,
TLS handshake and client-certificate SANs from the web config, counted); :mod:`~autoglm.web.guard`
is the middleware for basic auth and the configured response headers; :mod:`~autoglm.web.body`
reads request bodies, a body that does not decode being the client's 400. The batcher builds its
aiohttp application on these; the other components serve a few fixed, synchronous routes through
:class:`~autoglm.web.server.HTTPServer` (:mod:`~autoglm.web.exchange`, :mod:`~autoglm.web.routes`,
:mod:`~autoglm.web.exposition`).
"""
