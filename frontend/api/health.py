"""The health port: GET /healthz (also on the API port), /readyz and /metrics; and the probes
vLLM's users call on the API port: /health, /ping, /version."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from importlib import metadata

from aiohttp import web

from frontend.api.drain_gate import DrainGate
from frontend.api.json_response import json_response
from frontend.api.metrics import CONTENT_TYPE, Metrics
from frontend.core.client import CoreClient


class Liveness:
    """GET /healthz: the process answers (draining too, until exit), and it has had a working
    engine core within `unhealthy_after_s`: past that only a restart of the process can help."""

    def __init__(self, core: CoreClient, unhealthy_after_s: float) -> None:
        self._core = core
        self._unhealthy_after_s = unhealthy_after_s  # 0 = never unhealthy

    async def healthz(self, request: web.Request) -> web.Response:
        down = self._core.unready_for()
        if self._unhealthy_after_s and down > self._unhealthy_after_s:
            return json_response({"status": f"no working engine core for {down:.0f} s"}, 503)
        return json_response({"status": "ok"})


async def version(request: web.Request) -> web.Response:
    return json_response({"version": metadata.version("tl-serve")})


class HealthRoutes:
    """The health port: GET /healthz, /readyz and /metrics."""

    def __init__(
        self,
        core: CoreClient,
        drain_gate: DrainGate,
        metrics: Metrics,
        *,
        stats_timeout_s: float = 1.0,
        peers: Callable[[], Awaitable[list[str]]] | None = None,
    ) -> None:
        self._core = core
        self._drain_gate = drain_gate
        self._metrics = metrics
        self._stats_timeout_s = stats_timeout_s
        self._peers = peers  # the /metrics text of the other workers, to add to ours

    async def readyz(self, request: web.Request) -> web.Response:
        """Readiness: 503 while draining or while no core has handshaken. It is also vLLM's
        /health and SageMaker's /ping on the API port (200 while the engine core serves)."""
        if self._drain_gate.draining:
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
