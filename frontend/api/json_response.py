"""JSON responses: documents and OpenAI error bodies."""

from __future__ import annotations

from typing import Final

import msgspec
from aiohttp import web

from shared.errors import ErrorCode, ServingError

_ENCODER: Final = msgspec.json.Encoder()
RETRY_AFTER_S: Final = "1"


def json_response(document: object, status: int = 200) -> web.Response:
    return web.Response(
        body=_ENCODER.encode(document), status=status, content_type="application/json"
    )


def error_response(error: ServingError, headers: dict[str, str] | None = None) -> web.Response:
    """The OpenAI error document; a full queue also says when to come back."""
    response = json_response(error.to_document(), error.http_status)
    if error.code is ErrorCode.RATE_LIMIT_EXCEEDED:
        response.headers["Retry-After"] = RETRY_AFTER_S
    response.headers.update(headers or {})
    return response
