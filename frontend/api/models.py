"""GET /v1/models and /v1/models/{model_id}: the one model this frontend serves."""

from __future__ import annotations

from typing import Final

from aiohttp import web

from frontend.api.json_response import json_response
from frontend.openai import responses as docs
from frontend.text.served_model import ServedModel

OWNED_BY: Final = "tl-serve"


class ModelRoutes:
    """GET /v1/models and /v1/models/{model_id}."""

    def __init__(self, model: ServedModel) -> None:
        self._model = model
        self._entry = docs.ModelEntry(id=model.model_id, created=model.created, owned_by=OWNED_BY)

    async def models(self, request: web.Request) -> web.Response:
        return json_response(docs.model_list([self._entry]))

    async def model(self, request: web.Request) -> web.Response:
        self._model.check(request.match_info["model_id"])
        return json_response(self._entry)
