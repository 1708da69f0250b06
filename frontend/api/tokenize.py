"""POST /v1/tokenize: the token ids of a prompt, or of messages through the chat template."""

from __future__ import annotations

from aiohttp import web

from frontend.api.json_response import json_response
from frontend.openai import responses as docs
from frontend.openai.conversion import Converter
from frontend.openai.requests import TokenizeRequest, decode_request


class TokenizeRoutes:
    """POST /v1/tokenize: what the core would be sent, counted against the context."""

    def __init__(self, converter: Converter) -> None:
        self._converter = converter

    async def tokenize(self, request: web.Request) -> web.Response:
        req = decode_request(await request.read(), TokenizeRequest)
        tokens, welcome = await self._converter.tokenize(req)
        return json_response(
            docs.TokenizeResponse(
                tokens=tokens, count=len(tokens), max_model_len=welcome.max_model_len
            )
        )
