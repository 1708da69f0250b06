"""The two aiohttp applications of a frontend: the OpenAI API and the health port."""

from __future__ import annotations

import asyncio
import hmac
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Handler, Middleware

from frontend.api.admission import Admission
from frontend.api.completions import PING_INTERVAL_S, GenerateRoutes
from frontend.api.json_response import error_response
from frontend.api.metrics import Metrics
from frontend.api.routes_other import ApiRoutes, HealthRoutes, healthz
from frontend.core.client import CoreClient
from frontend.core.process import CoreProcess
from frontend.text.served_model import ServedModel
from frontend.workers import Workers
from shared.config import EngineConfig
from shared.errors import ErrorCode, ServingError

log = logging.getLogger(__name__)

REQUEST_ID_HEADER: Final = "X-Request-Id"
BODY_TIMEOUT_S: Final = 30.0  # to receive a whole request body
REQUEST_ID = web.RequestKey("request_id", str)
CORE = web.AppKey("core", CoreClient)
ADMISSION = web.AppKey("admission", Admission)
METRICS = web.AppKey("metrics", Metrics)
MODEL = web.AppKey("model", ServedModel)

# aiohttp's own refusals (router, body size) -> our codes
_HTTP_ERRORS: Final = {
    404: (ErrorCode.NOT_FOUND, "There is no such route."),
    405: (ErrorCode.METHOD_NOT_ALLOWED, "This route does not take this method."),
    413: (ErrorCode.REQUEST_TOO_LARGE, "The request body is too large."),
}


@dataclass(slots=True)
class Services:
    """What both applications share; one of each per frontend."""

    config: EngineConfig
    model: ServedModel
    core: CoreClient
    admission: Admission
    metrics: Metrics
    process: CoreProcess | None  # the core this frontend spawned, if it did
    workers: Workers | None = None  # worker 0 of `--workers N`: the other N - 1


def _errors(metrics: Metrics | None) -> Middleware:
    """Every failure becomes the OpenAI error document; API responses are counted."""

    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
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

    return errors


def _guard(api_keys: tuple[str, ...], admission: Admission, body_timeout_s: float) -> Middleware:
    """API keys (if any), the drain gate, then the whole body within body_timeout_s (a client
    that trickles it in holds no handler longer); /healthz passes all three."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path == "/healthz":
            return await handler(request)
        if api_keys:
            scheme, _, key = request.headers.get("Authorization", "").partition(" ")
            given = key.strip().encode()
            if scheme.lower() != "bearer" or not any(
                hmac.compare_digest(given, k.encode()) for k in api_keys
            ):
                raise ServingError(ErrorCode.INVALID_API_KEY, "Incorrect API key provided.")
        with admission.admit():
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

    return guard


async def _stamp_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """X-Request-Id on every response, streams and aiohttp's own errors included."""
    request_id = request.get(REQUEST_ID)
    if request_id is None:
        request_id = request[REQUEST_ID] = uuid.uuid4().hex
    response.headers[REQUEST_ID_HEADER] = request_id


def core_context(
    core: CoreClient, process: CoreProcess | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    """The core connection (and the spawned core) live as long as the API application."""

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        await core.start()
        if process is not None:
            await process.start()
        yield
        if process is not None:
            await process.stop()
        await core.close()

    return lifetime


def _share(app: web.Application, services: Services) -> None:
    app[CORE] = services.core
    app[ADMISSION] = services.admission
    app[METRICS] = services.metrics
    app[MODEL] = services.model
    app.on_response_prepare.append(_stamp_request_id)


def make_api_app(
    services: Services,
    *,
    ping_interval_s: float = PING_INTERVAL_S,
    body_timeout_s: float = BODY_TIMEOUT_S,
) -> web.Application:
    """The OpenAI API; it owns the core connection (cleanup_ctx)."""
    app = web.Application(
        client_max_size=services.config.max_body_bytes,
        middlewares=[
            _errors(services.metrics),
            _guard(services.config.api_keys, services.admission, body_timeout_s),
        ],
    )
    _share(app, services)
    max_messages = services.config.max_messages
    generate = GenerateRoutes(
        services.core,
        services.model,
        services.metrics,
        ping_interval_s=ping_interval_s,
        max_messages=max_messages,
    )
    other = ApiRoutes(services.core, services.model, max_messages=max_messages)
    app.router.add_post("/v1/chat/completions", generate.chat)
    app.router.add_post("/v1/completions", generate.completions)
    app.router.add_post("/v1/embeddings", other.embeddings)
    app.router.add_post("/v1/tokenize", other.tokenize)
    app.router.add_get("/v1/models", other.models)
    app.router.add_get("/v1/models/{model_id:.+}", other.model)
    app.router.add_get("/healthz", healthz)
    app.cleanup_ctx.append(core_context(services.core, services.process))
    return app


def make_health_app(services: Services) -> web.Application:
    """The health port: never behind API keys, open until the process exits."""
    app = web.Application(middlewares=[_errors(None)])
    _share(app, services)
    peers = None if services.workers is None else services.workers.scrape
    health = HealthRoutes(services.core, services.admission, services.metrics, peers=peers)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", health.readyz)
    app.router.add_get("/metrics", health.metrics)
    return app
