"""JSON responses: documents and OpenAI error bodies."""

from __future__ import annotations

from typing import Final

import msgspec
from aiohttp import web

from shared.errors import ErrorCode, ServingError

_ENCODER: Final = msgspec.json.Encoder()
DEFAULT_RETRY_AFTER_S: Final = "1"  # a core that did not say


def json_response(document: object, status: int = 200) -> web.Response:
    return web.Response(
        body=_ENCODER.encode(document), status=status, content_type="application/json"
    )


def error_response(
    error: ServingError, headers: dict[str, str] | None = None, request_id: str | None = None
) -> web.Response:
    """The OpenAI error document (naming the request); a refusal that waiting may cure says when
    to come back (a full queue always does)."""
    response = json_response(error.to_document(request_id), error.http_status)
    if error.retry_after is not None:
        response.headers["Retry-After"] = str(error.retry_after)
    elif error.code is ErrorCode.RATE_LIMIT_EXCEEDED:
        response.headers["Retry-After"] = DEFAULT_RETRY_AFTER_S
    response.headers.update(headers or {})
    return response
