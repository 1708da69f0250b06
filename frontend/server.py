"""Server: one frontend's listeners and core, started and drained in order.

Start: the health listener (probes answer while the core starts), the core link (and the
spawned core), then the API listener. Drain: readiness and new requests 503 at once, the API
listener closes, in-flight requests finish (at most drain_timeout_s), the core is told to
stop, and the health listener closes last.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Final

from aiohttp import web

from frontend.api.app import BODY_TIMEOUT_S, Services, make_api_app, make_health_app
from frontend.api.drain_gate import DrainGate
from frontend.api.metrics import Metrics
from frontend.core.client import CoreClient
from frontend.core.process import CoreProcess, core_argv
from frontend.text.served_model import ServedModel
from frontend.workers import WorkerRole, Workers, worker_config
from shared.config import EngineConfig, parse_listen

log = logging.getLogger(__name__)

# after the drain window, handlers still running are cancelled (and their requests aborted)
_HANDLER_GRACE_S: Final = 1.0
# a connection with no complete request header this long after it opened (or after its last
# response) is closed: a client trickling a header cannot hold a connection for longer
IDLE_TIMEOUT_S: Final = 15.0
# workers drain in parallel with worker 0; past this much more, they are killed
_WORKER_GRACE_S: Final = 5.0


class Server:
    """The health listener, the API listener, the core connection and (maybe) the core itself.

    With `workers` > 1 it is worker 0 of a group sharing the API port and its core; with a
    `role` it is one of the others (attached to worker 0's core, health on a unix socket).
    """

    def __init__(
        self,
        config: EngineConfig,
        config_path: str | None = None,
        *,
        argv: Sequence[str] | None = None,
        core_stop_timeout_s: float = 30.0,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
        body_timeout_s: float = BODY_TIMEOUT_S,
        workers: int = 1,
        role: WorkerRole | None = None,
    ) -> None:
        assert workers >= 1 and (role is None or workers == 1)
        if role is not None:
            config = worker_config(config, role)
        model = ServedModel.load(config.model_path, config.served_model_ids, config.chat_template)
        core = CoreClient(
            config.resolved_core_address, keys=config.curve_keys, silence_s=config.client_timeout_s
        )
        process = None
        if config.spawn_core:
            command = core_argv(config_path) if argv is None else argv
            process = CoreProcess(
                command,
                core,
                stop_timeout_s=core_stop_timeout_s,
                stall_timeout_s=config.core_stall_timeout_s,
            )
        self.workers = Workers(workers - 1, config_path) if workers > 1 else None
        peers = None if self.workers is None else self.workers.scrape
        metrics = Metrics(config.served_model_id)
        self.services = Services(config, model, core, DrainGate(), metrics, process, peers)
        self._role = role
        self._reuse_port = workers > 1 or role is not None
        # handler_cancellation: a client that leaves cancels its handler, whose finally aborts
        self._health = web.AppRunner(
            make_health_app(self.services),
            handler_cancellation=True,
            shutdown_timeout=_HANDLER_GRACE_S,
            keepalive_timeout=idle_timeout_s,
        )
        self._api = web.AppRunner(
            make_api_app(self.services, body_timeout_s=body_timeout_s),
            handler_cancellation=True,
            shutdown_timeout=_HANDLER_GRACE_S,
            keepalive_timeout=idle_timeout_s,
        )
        self._api_site: web.TCPSite | None = None
        self.api_port = 0
        self.health_port = 0  # 0 for a worker: its health app is on a unix socket
        self._stopped = False

    async def start(self) -> None:
        """Health first (so probes answer while the core starts), then the API and the core."""
        config = self.services.config
        await self._health.setup()
        if self._role is not None:
            await web.UnixSite(self._health, self._role.health_socket).start()
        else:
            host, port = parse_listen(config.health_listen)
            await web.TCPSite(self._health, host, port).start()
            self.health_port = self._health.addresses[0][1]
        await self._api.setup()  # cleanup_ctx: connect to the core, spawn it if ours
        if self._role is not None:
            # the port is served by the others already: take connections only when ready
            await self.services.core.wait_ready()
        host, port = parse_listen(config.http_listen)
        # None, not False: aiohttp then leaves SO_REUSEPORT alone
        self._api_site = web.TCPSite(self._api, host, port, reuse_port=self._reuse_port or None)
        await self._api_site.start()
        self.api_port = self._api.addresses[0][1]
        if self.workers is not None:
            await self.workers.start(self.api_port, self.services.core.address)
        log.info(
            "serving %s: api port %d, health %s, core %s",
            self.services.model.model_id,
            self.api_port,
            self._role.health_socket if self._role is not None else f"port {self.health_port}",
            self.services.core.address,
        )

    async def wait_failed(self) -> str:
        """Returns (why) only if the spawned core could never start."""
        process = self.services.process
        if process is None:
            await asyncio.Event().wait()  # an attached core is waited for, never given up on
        else:
            await process.failed.wait()
        return "" if process is None else process.failure

    async def drain(self) -> None:
        """/readyz 503 and new requests 503 at once; the listener closes; in-flight finish.

        Workers drain at the same time; the core is told to stop once all of them are gone.
        """
        if self._stopped:
            return
        self._stopped = True
        config, drain_gate = self.services.config, self.services.drain_gate
        workers_gone = None
        if self.workers is not None:
            self.workers.terminate()
            workers_gone = asyncio.create_task(
                self.workers.wait(config.drain_timeout_s + _WORKER_GRACE_S)
            )
        drain_gate.drain()
        if self._api_site is not None:
            await self._api_site.stop()  # new connections are refused from here on
            self._api_site = None
        log.info("draining: %d requests in flight", drain_gate.in_flight)
        if not await drain_gate.wait_idle(config.drain_timeout_s):
            log.warning("drain timeout: cutting %d requests", drain_gate.in_flight)
        if workers_gone is not None:
            await workers_gone
        await self._api.cleanup()  # cleanup_ctx: ShutdownCore to our core, then Bye
        await self._health.cleanup()  # /healthz answers until here
        log.info("drained")

    async def close(self) -> None:
        """Stop now (the core could not start): no drain."""
        if self._stopped:
            return
        self._stopped = True
        self.kill_core()
        if self.workers is not None:
            await self.workers.wait(_WORKER_GRACE_S)
        await self._api.cleanup()
        await self._health.cleanup()

    def kill_core(self) -> None:
        """Kill the spawned core and the workers, if any: never leave an orphan."""
        if self.workers is not None:
            self.workers.kill()
        if self.services.process is not None:
            self.services.process.kill()
