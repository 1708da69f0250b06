"""What every request passes through: the OpenAI error document, CORS, API keys, the drain gate,
the body deadline, and the X-Request-Id it is answered with (and logged under)."""

from __future__ import annotations

import asyncio
import contextvars
import hmac
import logging
import re
import uuid
from collections.abc import Callable
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from frontend.api.drain_gate import DrainGate
from frontend.api.json_response import error_response
from frontend.api.metrics import Metrics
from shared.errors import ErrorCode, ServingError

log = logging.getLogger(__name__)

REQUEST_ID_HEADER: Final = "X-Request-Id"
REQUEST_ID = web.RequestKey("request_id", str)
# a client's X-Request-Id becomes the core's id of the request: printable, bounded
REQUEST_ID_PATTERN: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:/+=-]{0,127}")
# the request a log line is written for (each aiohttp handler runs in a task of its own)
CURRENT_REQUEST: Final = contextvars.ContextVar[str]("current_request", default="-")
# the routes that probes and scrapers call: never behind API keys or the drain gate (each
# answers for itself while draining)
PROBES: Final = frozenset({"/healthz", "/health", "/ping", "/version", "/metrics"})
_CORS_HEADERS: Final = "Authorization, Content-Type, X-Request-Id, X-TL-Priority, X-TL-KV-Handle"
_CORS_MAX_AGE_S: Final = "600"


class RequestIdFilter(logging.Filter):
    """Adds `request_id` (the request being served, or "-") to every log record."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = CURRENT_REQUEST.get()
        return True


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
        given = request.headers.get(REQUEST_ID_HEADER)
        valid = given is None or REQUEST_ID_PATTERN.fullmatch(given) is not None
        rid = request[REQUEST_ID] = given if given is not None and valid else uuid.uuid4().hex
        CURRENT_REQUEST.set(rid)
        try:
            if not valid:
                raise ServingError(
                    ErrorCode.INVALID_VALUE,
                    f"{REQUEST_ID_HEADER} must be 1 to 128 letters, digits or ._:/+=- "
                    "(starting with a letter or digit).",
                    REQUEST_ID_HEADER,
                )
            response = await handler(request)
        except ServingError as e:
            response = error_response(e, request_id=rid)
        except web.HTTPException as e:
            if e.status not in _HTTP_ERRORS:
                raise
            code, message = _HTTP_ERRORS[e.status]
            allow = {"Allow": e.headers["Allow"]} if "Allow" in e.headers else None
            response = error_response(ServingError(code, message), allow, rid)
        except Exception:
            log.exception("request %s failed", rid)
            response = error_response(
                ServingError(ErrorCode.INTERNAL_ERROR, "The server failed on this request."),
                request_id=rid,
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
    that trickles it in holds no handler longer); the probes pass all three."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PROBES:
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


def cors_middleware(origins: tuple[str, ...]) -> Middleware:
    """Answers a browser's preflight (OPTIONS) from an allowed origin before the API keys are
    asked for; `cors_headers` marks the responses."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        preflight = (
            request.method == "OPTIONS" and "Access-Control-Request-Method" in request.headers
        )
        if not preflight or allowed_origin(origins, request) is None:
            return await handler(request)
        asked = request.headers.get("Access-Control-Request-Headers")
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
                "Access-Control-Allow-Headers": asked or _CORS_HEADERS,
                "Access-Control-Max-Age": _CORS_MAX_AGE_S,
            },
        )

    return middleware


def allowed_origin(origins: tuple[str, ...], request: web.Request) -> str | None:
    """The request's Origin if it may call (`*` allows any), else None."""
    origin = request.headers.get("Origin")
    if origin is None or not (origin in origins or "*" in origins):
        return None
    return origin


def cors_headers(origins: tuple[str, ...]) -> Callable[[web.Request, web.StreamResponse], Any]:
    """An on_response_prepare hook: an allowed origin may read the response (streams too)."""

    async def hook(request: web.Request, response: web.StreamResponse) -> None:
        origin = allowed_origin(origins, request)
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Access-Control-Expose-Headers"] = "X-Request-Id, Retry-After"
            response.headers["Vary"] = "Origin"

    return hook


async def stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """X-Request-Id on every response, streams and aiohttp's own errors included."""
    request_id = request.get(REQUEST_ID)
    if request_id is None:
        request_id = request[REQUEST_ID] = uuid.uuid4().hex
    response.headers[REQUEST_ID_HEADER] = request_id
