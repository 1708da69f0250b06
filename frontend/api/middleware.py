"""What every request passes through: the OpenAI error document, API keys, the drain gate, the
body deadline, and the X-Request-Id it is answered with."""

from __future__ import annotations

import asyncio
import hmac
import logging
import uuid
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from frontend.api.drain_gate import DrainGate
from frontend.api.json_response import error_response
from frontend.api.metrics import Metrics
from shared.errors import ErrorCode, ServingError

log = logging.getLogger(__name__)

REQUEST_ID_HEADER: Final = "X-Request-Id"
REQUEST_ID = web.RequestKey("request_id", str)

# aiohttp's own refusals (router, body size) -> our codes
_HTTP_ERRORS: Final = {
    404: (ErrorCode.NOT_FOUND, "There is no such route."),
    405: (ErrorCode.METHOD_NOT_ALLOWED, "This route does not take this method."),
    413: (ErrorCode.REQUEST_TOO_LARGE, "The request body is too large."),
}


def error_middleware(metrics: Metrics | None) -> Middleware:
    """Every failure becomes the OpenAI error document; API responses are counted."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        request[REQUEST_ID] = request.headers.get(REQUEST_ID_HEADER) or uuid.uuid4().hex
        try:
            response = await handler(request)
        except ServingError as e:
            response = error_response(e)
        except web.HTTPException as e:
            if e.status not in _HTTP_ERRORS:
                raise
            code, message = _HTTP_ERRORS[e.status]
            allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
            response = error_response(ServingError(code, message), allow)
        except Exception:
            log.exception("request %s failed", request[REQUEST_ID])
            response = error_response(
                ServingError(ErrorCode.INTERNAL_ERROR, "The server failed on this request.")
            )
        if metrics is not None:
            resource = request.match_info.route.resource
            endpoint = resource.canonical if resource is not None else "unmatched"
            metrics.count_request(endpoint, response.status)
        return response

    return middleware


def guard_middleware(
    api_keys: tuple[str, ...], drain_gate: DrainGate, body_timeout_s: float
) -> Middleware:
    """API keys (if any), the drain gate, then the whole body within body_timeout_s (a client
    that trickles it in holds no handler longer); /healthz passes all three."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        if api_keys:
            scheme, _, key = request.headers.get("Authorization", "").partition(" ")
            given = key.strip().encode()
            if scheme.lower() != "bearer" or not any(
                hmac.compare_digest(given, k.encode()) for k in api_keys
            ):
                raise ServingError(ErrorCode.INVALID_API_KEY, "Incorrect API key provided.")
        with drain_gate.admit():
            if request.body_exists:
                try:
                    async with asyncio.timeout(body_timeout_s):
                        await request.read()  # kept: the handler's read() returns it
                except TimeoutError:
                    raise ServingError(
                        ErrorCode.REQUEST_TIMEOUT,
                        f"The request body did not arrive within {body_timeout_s:g} s.",
                    ) from None
            return await handler(request)

    return middleware


async def stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """X-Request-Id on every response, streams and aiohttp's own errors included."""
    request_id = request.get(REQUEST_ID)
    if request_id is None:
        request_id = request[REQUEST_ID] = uuid.uuid4().hex
    response.headers[REQUEST_ID_HEADER] = request_id
