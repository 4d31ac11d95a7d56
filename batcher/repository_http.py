"""The Open Inference Protocol's model repository extension over HTTP, at Triton's paths.

    POST /v2/repository/index                   -> [{"name", "version", "state", "reason"}, ...]
    POST /v2/repository/models/{name}/load      -> 200 once the model serves
    POST /v2/repository/models/{name}/unload    -> 200 once its accepted requests are answered

These are the paths and bodies ``tritonclient.http`` sends (``get_model_repository_index``,
``load_model``, ``unload_model``), so it works unchanged. The index takes an optional
``{"ready": true}`` to list only the models ready for inference. A load's ``config`` and
``file:`` parameters (Triton's override of a model's files) are refused: the models are the
repository folder's. Errors are the protocol's ``{"error": ...}`` body with a status naming the
kind: 404 no such model, 400 a bad model configuration, 409 a load or unload of that model
already under way, 507 the model would not fit in device memory, 500 its factory failed.
"""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from autoglm.web.body import UnreadableBody, closing_if_unreadable, read_whole, refusal_status
from batcher import oip
from batcher.errors import (
    LoadFailed,
    LoadRefused,
    ModelConfigInvalid,
    NotInRepository,
    RepositoryBusy,
    RepositoryError,
)
from batcher.repository import ModelRepository

# A repository refusal -> its HTTP status (the first type that matches; 400 otherwise).
_STATUS: tuple[tuple[type[RepositoryError], int], ...] = (
    (NotInRepository, 404),
    (ModelConfigInvalid, 400),
    (RepositoryBusy, 409),
    (LoadRefused, 507),
    (LoadFailed, 500),
)


def repository_status(error: RepositoryError) -> int:
    """The HTTP status of a repository request that could not be done (for a body that could
    not be read, its own: 400, or 408 when it stopped arriving)."""
    kind_status = next((status for kind, status in _STATUS if isinstance(error, kind)), 400)
    return refusal_status(error, kind_status)


def _error(message: str, status: int) -> web.Response:
    return web.Response(
        status=status, body=oip.error_body(message), content_type="application/json"
    )


async def _document(request: web.Request) -> dict[str, Any]:
    """The request's JSON object (an empty body is an empty object, as tritonclient sends)."""
    try:
        body = await read_whole(request)
    except UnreadableBody as exc:
        raise RepositoryError(str(exc)) from exc
    if not body.strip():
        return {}
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise RepositoryError(f"request body is not JSON ({exc})") from None
    except RecursionError:
        raise RepositoryError("request body is nested too deeply to read") from None
    if not isinstance(document, dict):
        raise RepositoryError("request body must be a JSON object")
    return document


class RepositoryRoutes:
    """The extension's handlers over one :class:`~batcher.repository.ModelRepository`."""

    def __init__(self, models: ModelRepository) -> None:
        self.models = models

    def register(self, app: web.Application) -> None:
        app.router.add_post("/v2/repository/index", self.index)
        app.router.add_post("/v2/repository/models/{name}/load", self.load)
        app.router.add_post("/v2/repository/models/{name}/unload", self.unload)

    async def index(self, request: web.Request) -> web.Response:
        try:
            ready = (await _document(request)).get("ready", False)
        except RepositoryError as exc:
            return closing_if_unreadable(_error(str(exc), repository_status(exc)), exc)
        if not isinstance(ready, bool):
            return _error('"ready" must be true or false', 400)
        entries = [
            {"name": e.name, "version": e.version, "state": e.state, "reason": e.reason}
            for e in self.models.index(ready_only=ready)
        ]
        return web.Response(body=json.dumps(entries).encode(), content_type="application/json")

    async def load(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            parameters = (await _document(request)).get("parameters") or {}
            if not isinstance(parameters, dict):
                raise RepositoryError('"parameters" must be a JSON object')
            overrides = sorted(k for k in parameters if k == "config" or k.startswith("file:"))
            if overrides:
                raise RepositoryError(
                    f"load parameter {overrides[0]!r} is not supported: models are loaded from "
                    "the repository folder; put the model's files and config.yaml there"
                )
            await self.models.load(name)
        except RepositoryError as exc:
            return closing_if_unreadable(_error(str(exc), repository_status(exc)), exc)
        return web.Response(status=200)

    async def unload(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            await _document(request)  # unload_dependents: a model here has no dependents
            await self.models.unload(name)
        except RepositoryError as exc:
            return closing_if_unreadable(_error(str(exc), repository_status(exc)), exc)
        return web.Response(status=200)
