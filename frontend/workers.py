"""Workers: the extra frontend processes of `frontend --workers N`, run and drained by worker 0.

Worker 0 is the process the user started: it spawns the core and owns the health port. Each
other worker is `frontend --worker ROLE`: it attaches to worker 0's core (as `spawn_core =
false` would), serves the same API port (SO_REUSEPORT: the kernel spreads new connections
over the live listeners) and serves its health app on a unix socket that only worker 0 reads,
to add the worker's request metrics to its own.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import msgspec

from frontend.core.process import backed_off, die_with_parent, respawn
from shared.config import EngineConfig, parse_listen

log = logging.getLogger(__name__)

_STABLE_S = 60.0  # a worker that lived this long is respawned without back-off


class WorkerRole(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """What worker 0 tells each worker it spawns (JSON on the worker's command line)."""

    index: int
    api_port: int
    core_address: str
    health_socket: str  # path of the unix socket its health app listens on


def worker_config(config: EngineConfig, role: WorkerRole) -> EngineConfig:
    """The worker's config: worker 0's, attached to worker 0's core, on the port it bound."""
    host, _ = parse_listen(config.http_listen)
    return msgspec.structs.replace(
        config,
        spawn_core=False,
        core_address=role.core_address,
        http_listen=f"[{host}]:{role.api_port}" if ":" in host else f"{host}:{role.api_port}",
    )


@dataclass(slots=True)
class _Worker:
    role: WorkerRole
    proc: asyncio.subprocess.Process | None = None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.returncode is None


class Workers:
    """Spawns workers 1..count, respawns one that dies, drains them, and scrapes their metrics.

    A worker's counters die with it: one that is respawned starts again from zero.
    """

    def __init__(
        self,
        count: int,
        config_path: str | None,
        *,
        respawn_delay_s: float = 1.0,
        scrape_timeout_s: float = 1.0,
    ) -> None:
        assert count >= 1
        self._count = count
        self._config_path = config_path
        self._respawn_delay_s = respawn_delay_s
        self._scrape_timeout_s = scrape_timeout_s
        self._workers: list[_Worker] = []
        self._watchers: list[asyncio.Task[None]] = []
        self._stopping = asyncio.Event()
        self._dir: Path | None = None
        self._pre_exec = die_with_parent()  # worker 0 killed -> its workers die too

    @property
    def pids(self) -> list[int]:
        return [w.proc.pid for w in self._workers if w.proc is not None and w.alive]

    async def start(self, api_port: int, core_address: str) -> None:
        assert self._dir is None
        self._dir = Path(tempfile.mkdtemp(prefix="tl-serve-workers-"))
        for index in range(1, self._count + 1):
            socket = str(self._dir / f"worker-{index}.sock")
            worker = _Worker(WorkerRole(index, api_port, core_address, socket))
            self._workers.append(worker)
            await self._spawn(worker)
            self._watchers.append(asyncio.create_task(self._watch(worker), name=f"worker-{index}"))

    def terminate(self) -> None:
        """SIGTERM each worker: each drains as worker 0 does (listener closed, in-flight finish)."""
        self._stopping.set()
        for worker in self._workers:
            if worker.proc is not None and worker.alive:
                worker.proc.terminate()

    async def wait(self, timeout: float) -> None:
        """Until every worker has exited; those still running after `timeout` are killed."""
        procs = [w.proc for w in self._workers if w.proc is not None]
        if procs:
            waits = [asyncio.create_task(p.wait()) for p in procs]
            await asyncio.wait(waits, timeout=timeout)
            for proc in procs:
                if proc.returncode is None:
                    log.warning("worker (pid %d) did not exit in time: killed", proc.pid)
                    proc.kill()
            await asyncio.gather(*waits)
            for worker in self._workers:
                assert worker.proc is not None
                level = logging.INFO if worker.proc.returncode == 0 else logging.WARNING
                log.log(
                    level, "worker %d exited with %s", worker.role.index, worker.proc.returncode
                )
        await self._stop_watching()

    def kill(self) -> None:
        """Last resort on an abnormal exit of worker 0."""
        self._stopping.set()
        for worker in self._workers:
            if worker.proc is not None and worker.alive:
                worker.proc.kill()

    async def scrape(self) -> list[str]:
        """The /metrics text of each live worker that answers in time."""
        texts = await asyncio.gather(*(self._scrape(w) for w in self._workers if w.alive))
        return [text for text in texts if text is not None]

    async def _scrape(self, worker: _Worker) -> str | None:
        timeout = aiohttp.ClientTimeout(total=self._scrape_timeout_s)
        connector = aiohttp.UnixConnector(worker.role.health_socket)
        try:
            async with (
                aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
                session.get("http://worker/metrics") as resp,
            ):
                if resp.status == 200:
                    return await resp.text()
                log.warning("worker %d: /metrics answered %d", worker.role.index, resp.status)
        except (aiohttp.ClientError, TimeoutError) as e:
            log.warning("worker %d: no /metrics: %r", worker.role.index, e)
        return None

    def _argv(self, role: WorkerRole) -> list[str]:
        argv = [sys.executable, "-m", "frontend"]
        if self._config_path is not None:
            argv += ["--config", self._config_path]
        return [*argv, "--worker", msgspec.json.encode(role).decode()]

    async def _spawn(self, worker: _Worker) -> None:
        argv = self._argv(worker.role)
        worker.proc = await asyncio.create_subprocess_exec(*argv, preexec_fn=self._pre_exec)
        log.info("worker %d spawned: pid %d", worker.role.index, worker.proc.pid)
        if self._stopping.is_set():  # terminate() came while it was being spawned
            worker.proc.terminate()

    async def _watch(self, worker: _Worker) -> None:
        loop = asyncio.get_running_loop()
        delay = 0.0
        while True:
            assert worker.proc is not None
            started = loop.time()
            code = await worker.proc.wait()
            if self._stopping.is_set():
                return
            # one that keeps dying soon after its start backs off, up to half a minute
            quick = loop.time() - started < _STABLE_S
            delay = backed_off(delay) if quick and delay else self._respawn_delay_s
            log.error(
                "worker %d (pid %d) exited with code %d; respawning in %.0f s",
                worker.role.index,
                worker.proc.pid,
                code,
                delay,
            )
            if not await respawn(
                lambda: self._spawn(worker), delay, self._stopping, f"worker {worker.role.index}"
            ):
                return

    async def _stop_watching(self) -> None:
        for task in self._watchers:
            task.cancel()
        await asyncio.gather(*self._watchers, return_exceptions=True)
        self._watchers.clear()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
