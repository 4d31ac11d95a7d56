"""TLS and basic auth for HTTP endpoints, from a web config file in the exporter-toolkit format.

Operators of Prometheus exporters already keep ``web-config.yml`` files (``--web.config.file``)
with ``tls_server_config``, ``http_server_config.headers`` and ``basic_auth_users`` (bcrypt
hashes); every component here takes the same file so those files can be reused as they are.

One module per job: :mod:`~autoglm.webconfig.parse` reads and validates the file against its schema,
:mod:`~autoglm.webconfig.tls` checks the TLS block and builds the context (with
:mod:`~autoglm.webconfig.sections` for its keys and values), :mod:`~autoglm.webconfig.basic_auth`
checks credentials, :mod:`~autoglm.webconfig.reload` notices changed files, and
:mod:`~autoglm.webconfig.loaded` holds the config a server asks (:class:`WebConfig`).
"""

from autoglm.webconfig.loaded import WebConfig as WebConfig
from autoglm.webconfig.tls import TLSMaterial as TLSMaterial
