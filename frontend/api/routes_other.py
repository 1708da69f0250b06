"""Embeddings, tokenize, models and the health port: everything but generation."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable

from aiohttp import web

from frontend.api.admission import Admission
from frontend.api.json_response import json_response
from frontend.api.metrics import CONTENT_TYPE, Metrics
from frontend.core.client import CoreClient
from frontend.openai import responses as docs
from frontend.openai.requests import EmbeddingRequest, TokenizeRequest, decode_request
from frontend.openai.validation import (
    check_num_messages,
    embedding_inputs,
    invalid,
    template_messages,
    validate_embedding,
    validate_tokenize,
)
from frontend.text.chat_template import TemplateRenderError
from frontend.text.served_model import ServedModel
from shared.errors import ErrorCode, ServingError


async def healthz(request: web.Request) -> web.Response:
    """Liveness: the process answers. Stays 200 while draining, until exit."""
    return json_response({"status": "ok"})


class ApiRoutes:
    """POST /v1/embeddings, POST /v1/tokenize, GET /v1/models and /v1/models/{id}."""

    def __init__(
        self, core: CoreClient, model: ServedModel, *, max_messages: int | None = None
    ) -> None:
        self._core = core
        self._model = model
        self._max_messages = max_messages

    async def embeddings(self, request: web.Request) -> web.Response:
        req = decode_request(await request.read(), EmbeddingRequest)
        validate_embedding(req)
        self._model.check(req.model)
        welcome = self._core.require_welcome()
        inputs: list[list[int]] = []
        for i, item in enumerate(embedding_inputs(req)):
            param = "input" if isinstance(req.input, str) else f"input[{i}]"
            ids = (
                await self._model.encode(item, add_special_tokens=True)
                if isinstance(item, str)
                else item
            )
            if not ids:
                raise invalid(param, f"'{param}' has no tokens.")
            if len(ids) > welcome.max_model_len:
                raise ServingError(
                    ErrorCode.CONTEXT_LENGTH_EXCEEDED,
                    f"This model's maximum context length is {welcome.max_model_len} tokens; "
                    f"'{param}' has {len(ids)}.",
                    param,
                )
            if max(ids) >= welcome.vocab_size:
                raise invalid(param, f"Token ids must be below {welcome.vocab_size}.")
            inputs.append(ids)
        embedded = await self._core.embed(f"embd-{uuid.uuid4().hex}", inputs)
        num_tokens = sum(len(ids) for ids in inputs)
        document = docs.embedding_list(
            self._model.model_id, embedded.vectors, req.encoding_format, num_tokens
        )
        return json_response(document)

    async def tokenize(self, request: web.Request) -> web.Response:
        req = decode_request(await request.read(), TokenizeRequest)
        validate_tokenize(req)
        self._model.check(req.model)
        welcome = self._core.require_welcome()
        if req.messages is not None:
            check_num_messages(len(req.messages), self._max_messages)
            generation_prompt = req.add_generation_prompt is not False
            try:
                text = self._model.template.render(
                    template_messages(req.messages), add_generation_prompt=generation_prompt
                )
            except TemplateRenderError as e:
                raise invalid("messages", e.message) from e
            # what /v1/chat/completions would send: the template wrote its special tokens
            add_special_tokens = bool(req.add_special_tokens)
        else:
            assert req.prompt is not None  # validate_tokenize
            text = req.prompt
            add_special_tokens = req.add_special_tokens is not False
        tokens = await self._model.encode(text, add_special_tokens)
        return json_response(
            docs.TokenizeResponse(
                tokens=tokens, count=len(tokens), max_model_len=welcome.max_model_len
            )
        )

    async def models(self, request: web.Request) -> web.Response:
        return json_response(docs.model_list([self._model.card()]))

    async def model(self, request: web.Request) -> web.Response:
        self._model.check(request.match_info["model_id"])
        return json_response(self._model.card())


class HealthRoutes:
    """The health port: GET /healthz, /readyz and /metrics."""

    def __init__(
        self,
        core: CoreClient,
        admission: Admission,
        metrics: Metrics,
        *,
        stats_timeout_s: float = 1.0,
        peers: Callable[[], Awaitable[list[str]]] | None = None,
    ) -> None:
        self._core = core
        self._admission = admission
        self._metrics = metrics
        self._stats_timeout_s = stats_timeout_s
        self._peers = peers  # the /metrics text of the other workers, to add to ours

    async def readyz(self, request: web.Request) -> web.Response:
        """Readiness: 503 while draining or while no core has handshaken."""
        if self._admission.draining:
            return json_response({"status": "draining"}, 503)
        if not self._core.ready:
            return json_response({"status": "engine core not ready"}, 503)
        return json_response({"status": "ready"})

    async def metrics(self, request: web.Request) -> web.Response:
        stats = await self._core.stats(self._stats_timeout_s)
        peers = [] if self._peers is None else await self._peers()
        return web.Response(
            body=self._metrics.render(stats, peers), headers={"Content-Type": CONTENT_TYPE}
        )
