"""POST /v1/embeddings: decode, convert to token ids, embed in the core, answer."""

from __future__ import annotations

import uuid

from aiohttp import web

from frontend.api.json_response import json_response
from frontend.core.client import CoreClient
from frontend.openai import responses as docs
from frontend.openai.conversion import Converter
from frontend.openai.requests import EmbeddingRequest, RequestDecoder
from frontend.text.served_model import ServedModel


class EmbeddingRoutes:
    """POST /v1/embeddings: one mean-pooled, normalized vector per input, in order."""

    def __init__(
        self, core: CoreClient, model: ServedModel, converter: Converter, decoder: RequestDecoder
    ) -> None:
        self._core = core
        self._model = model
        self._converter = converter
        self._decoder = decoder

    async def embeddings(self, request: web.Request) -> web.Response:
        req = self._decoder.decode(await request.read(), EmbeddingRequest)
        inputs = await self._converter.embeddings(req)
        embedded = await self._core.embed(f"embd-{uuid.uuid4().hex}", inputs)
        num_tokens = sum(len(ids) for ids in inputs)
        document = docs.embedding_list(
            self._model.model_id, embedded.vectors, req.encoding_format, num_tokens
        )
        return json_response(document)
