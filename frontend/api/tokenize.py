"""POST /tokenize and /detokenize (also under /v1): what the core would be sent, and back."""

from __future__ import annotations

from aiohttp import web

from frontend.api.json_response import json_response
from frontend.openai import responses as docs
from frontend.openai.conversion import Converter
from frontend.openai.requests import DetokenizeRequest, RequestDecoder, TokenizeRequest


class TokenizeRoutes:
    """POST /tokenize (counted against the context; token strings on request), /detokenize."""

    def __init__(self, converter: Converter, decoder: RequestDecoder) -> None:
        self._converter = converter
        self._decoder = decoder

    async def tokenize(self, request: web.Request) -> web.Response:
        req = self._decoder.decode(await request.read(), TokenizeRequest)
        tokens, welcome = await self._converter.tokenize(req)
        strs = self._converter.token_strs(tokens) if req.return_token_strs else None
        return json_response(
            docs.TokenizeResponse(
                tokens=tokens,
                count=len(tokens),
                max_model_len=welcome.max_model_len,
                token_strs=strs,
            )
        )

    async def detokenize(self, request: web.Request) -> web.Response:
        req = self._decoder.decode(await request.read(), DetokenizeRequest)
        return json_response(docs.DetokenizeResponse(prompt=self._converter.detokenize(req)))
