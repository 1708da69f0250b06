"""GET /v1/models and /v1/models/{model_id}: the one model this frontend serves, under each of
its ids."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from frontend.api.json_response import json_response
from frontend.core.client import CoreClient
from frontend.openai import responses as docs
from frontend.text.served_model import ServedModel
from shared.errors import ErrorCode, ServingError

OWNED_BY: Final = "tl-serve"


class ModelRoutes:
    """GET /v1/models and /v1/models/{model_id}; the context is the core's, as of its last
    handshake (503 before the first)."""

    def __init__(self, model: ServedModel, core: CoreClient) -> None:
        self._model = model
        self._core = core

    def _entry(self, model_id: str) -> docs.ModelEntry:
        welcome = self._core.last_welcome
        if welcome is None:
            raise ServingError(ErrorCode.ENGINE_UNAVAILABLE, "The engine core has not started yet.")
        return docs.ModelEntry(
            id=model_id,
            created=self._model.created,
            owned_by=OWNED_BY,
            max_model_len=welcome.max_model_len,
        )

    async def models(self, request: web.Request) -> web.Response:
        """Every id of the served model, the canonical one first."""
        return json_response(docs.model_list([self._entry(i) for i in self._model.model_ids]))

    async def model(self, request: web.Request) -> web.Response:
        model_id = request.match_info["model_id"]
        self._model.check(model_id)
        return json_response(self._entry(model_id))
