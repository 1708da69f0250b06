"""The two aiohttp applications of a frontend, route table by route table: the OpenAI API and
the health port."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import web

from frontend.api.completions import CompletionRoutes
from frontend.api.drain_gate import DrainGate
from frontend.api.embeddings import EmbeddingRoutes
from frontend.api.health import HealthRoutes, Liveness, version
from frontend.api.metrics import Metrics
from frontend.api.middleware import (
    cors_headers,
    cors_middleware,
    error_middleware,
    guard_middleware,
    stamp_request_id,
)
from frontend.api.models import ModelRoutes
from frontend.api.tokenize import TokenizeRoutes
from frontend.core.client import CoreClient
from frontend.core.process import CoreProcess
from frontend.openai.conversion import Converter
from frontend.openai.requests import RequestDecoder
from frontend.text.served_model import ServedModel
from shared.config import EngineConfig

BODY_TIMEOUT_S: Final = 30.0  # to receive a whole request body


@dataclass(slots=True)
class Services:
    """What both applications share; one of each per frontend."""

    config: EngineConfig
    model: ServedModel
    core: CoreClient
    drain_gate: DrainGate
    metrics: Metrics
    process: CoreProcess | None  # the core this frontend spawned, if it did
    # worker 0 of `--workers N`: the /metrics texts of the other N - 1, added to its own
    peers: Callable[[], Awaitable[list[str]]] | None = None


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


def make_api_app(services: Services, *, body_timeout_s: float = BODY_TIMEOUT_S) -> web.Application:
    """The OpenAI API (and the routes vLLM's users expect beside it); it owns the core
    connection (cleanup_ctx)."""
    config, core, model = services.config, services.core, services.model
    app = web.Application(
        client_max_size=config.max_body_bytes,
        middlewares=[
            error_middleware(services.metrics),
            cors_middleware(config.cors_origins),
            guard_middleware(config.api_keys, services.drain_gate, body_timeout_s),
        ],
    )
    app.on_response_prepare.append(stamp_request_id)
    if config.cors_origins:
        app.on_response_prepare.append(cors_headers(config.cors_origins))
    decoder = RequestDecoder()
    converter = Converter(
        model,
        core.require_welcome,
        max_messages=config.max_messages,
        max_embedding_inputs=config.max_embedding_inputs,
        max_embedding_tokens=config.max_embedding_tokens,
    )
    completions = CompletionRoutes(
        core,
        model,
        converter,
        services.metrics,
        decoder,
        ping_interval_s=config.sse_ping_interval_s,
        force_include_usage=config.force_include_usage,
    )
    embeddings = EmbeddingRoutes(core, model, converter, decoder)
    tokenize = TokenizeRoutes(converter, decoder)
    models = ModelRoutes(model, core)
    health = health_routes(services)
    liveness = Liveness(core, config.unhealthy_after_s)
    app.router.add_post("/v1/chat/completions", completions.chat)
    app.router.add_post("/v1/completions", completions.completions)
    app.router.add_post("/v1/embeddings", embeddings.embeddings)
    for prefix in ("", "/v1"):
        app.router.add_post(f"{prefix}/tokenize", tokenize.tokenize)
        app.router.add_post(f"{prefix}/detokenize", tokenize.detokenize)
    app.router.add_get("/v1/models", models.models)
    app.router.add_get("/v1/models/{model_id:.+}", models.model)
    app.router.add_get("/healthz", liveness.healthz)
    app.router.add_get("/health", health.readyz)
    app.router.add_get("/ping", health.readyz)  # SageMaker probes with GET or POST
    app.router.add_post("/ping", health.readyz)
    app.router.add_get("/version", version)
    if config.metrics_on_api_port:
        app.router.add_get("/metrics", health.metrics)
    app.cleanup_ctx.append(core_context(core, services.process))
    return app


def health_routes(services: Services) -> HealthRoutes:
    return HealthRoutes(services.core, services.drain_gate, services.metrics, peers=services.peers)


def make_health_app(services: Services) -> web.Application:
    """The health port: never behind API keys, open until the process exits."""
    app = web.Application(middlewares=[error_middleware(None)])
    app.on_response_prepare.append(stamp_request_id)
    health = health_routes(services)
    liveness = Liveness(services.core, services.config.unhealthy_after_s)
    app.router.add_get("/healthz", liveness.healthz)
    app.router.add_get("/readyz", health.readyz)
    app.router.add_get("/metrics", health.metrics)
    return app
