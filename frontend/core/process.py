"""CoreProcess: the engine core as a child of the frontend that spawned it."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import logging
import os
import secrets
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

from frontend.core.client import CoreClient

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1
_MAX_RESPAWN_DELAY_S = 30.0


def backed_off(delay: float) -> float:
    """The wait before the next try of a process that failed again: twice the last one, at
    most half a minute (the core's and the workers' respawns)."""
    return min(2 * delay, _MAX_RESPAWN_DELAY_S)


def core_argv(config_path: str | None) -> list[str]:
    """`python -m enginecore [--config PATH]` with this interpreter; same environment. The
    core reads its owner token (what its ShutdownCore must carry) from stdin."""
    argv = [sys.executable, "-m", "enginecore", "--owner-stdin"]
    return argv if config_path is None else [*argv, "--config", config_path]


def die_with_parent() -> Callable[[], None] | None:
    """A hook run in the child before exec: the kernel kills it when the frontend dies, however."""
    if sys.platform != "linux":
        return None
    prctl = ctypes.CDLL(None, use_errno=True).prctl  # resolved before fork, only called after
    parent = os.getpid()

    def hook() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the frontend died before prctl took effect
            os._exit(1)

    return hook


async def respawn(
    spawn: Callable[[], Awaitable[None]], delay: float, stopping: asyncio.Event, what: str
) -> bool:
    """`spawn()` after `delay` seconds; a spawn that raises OSError (no fork, the executable
    gone for a while) is tried again, the delay doubled up to half a minute: a watcher that
    died of it would never respawn anything again. False if `stopping` came first."""
    while True:
        await asyncio.sleep(delay)
        if stopping.is_set():
            return False
        try:
            await spawn()
            return True
        except OSError as e:
            delay = backed_off(max(delay, 0.5))  # at least 1 s: never a spin
            log.error("cannot respawn %s: %s; retrying in %.0f s", what, e, delay)


class CoreProcess:
    """Spawns the core, respawns it after a crash, and drains it on stop; never leaves an orphan.

    A core that exits before its first handshake ever means the frontend cannot serve
    (bad model, bad config): `failed` is set, and the frontend exits non-zero. A core that
    handshook and then goes `stall_timeout_s` with work but no step (wedged in a step, or a
    loop that no longer schedules) is killed, and so respawned like one that crashed.
    """

    def __init__(
        self,
        argv: Sequence[str],
        client: CoreClient,
        *,
        respawn_delay_s: float = 1.0,
        stop_timeout_s: float = 30.0,
        stall_timeout_s: float = 0.0,  # 0 = never killed for lack of progress
    ) -> None:
        self._argv = list(argv)
        self._client = client
        self._token = secrets.token_hex(16)  # only this frontend can tell the core to stop
        self._respawn_delay_s = respawn_delay_s
        self._stop_timeout_s = stop_timeout_s
        self._stall_timeout_s = stall_timeout_s
        self._proc: asyncio.subprocess.Process | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._supervisor: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()
        self._pre_exec = die_with_parent()
        self.failed = asyncio.Event()
        self.failure = ""

    @property
    def pid(self) -> int | None:
        return None if self._proc is None else self._proc.pid

    @property
    def returncode(self) -> int | None:
        return None if self._proc is None else self._proc.returncode

    async def start(self) -> None:
        assert self._watcher is None
        await self._spawn()
        self._watcher = asyncio.create_task(self._watch(), name="core-process")
        if self._stall_timeout_s > 0:
            self._supervisor = asyncio.create_task(self._supervise(), name="core-supervisor")

    async def stop(self) -> None:
        """Drain the core (ShutdownCore, or SIGTERM if it never answered), kill it after a timeout."""
        self._stopping.set()
        proc = self._proc
        if proc is not None and proc.returncode is None:
            if self._client.ready:
                self._client.shutdown_core(self._token)
            else:
                proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), self._stop_timeout_s)
            except TimeoutError:
                log.warning("engine core (pid %d) did not exit in time: killed", proc.pid)
                proc.kill()
                await proc.wait()
            log.info("engine core (pid %d) exited with %s", proc.pid, proc.returncode)
        tasks = [t for t in (self._watcher, self._supervisor) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._watcher = self._supervisor = None

    def kill(self) -> None:
        """Last resort on an abnormal exit of the frontend."""
        self._stopping.set()
        if self._proc is not None and self._proc.returncode is None:
            self._proc.kill()

    async def _spawn(self) -> None:
        self._proc = await asyncio.create_subprocess_exec(
            *self._argv, stdin=asyncio.subprocess.PIPE, preexec_fn=self._pre_exec
        )
        assert self._proc.stdin is not None
        self._proc.stdin.write(f"{self._token}\n".encode())
        with contextlib.suppress(ConnectionError):  # a core that died at once is seen later
            await self._proc.stdin.drain()
        self._proc.stdin.close()
        log.info("engine core spawned: pid %d: %s", self._proc.pid, " ".join(self._argv))

    async def _supervise(self) -> None:
        """Kill a core that handshook and has since gone stall_timeout_s without progress."""
        tick = min(1.0, self._stall_timeout_s / 4)
        while not self._stopping.is_set():
            await asyncio.sleep(tick)
            proc, welcome = self._proc, self._client.last_welcome
            if proc is None or proc.returncode is not None or self._stopping.is_set():
                continue
            if welcome is None or welcome.core_pid != proc.pid:
                continue  # still starting: compiling and loading may take minutes
            stalled = self._client.stalled_for()
            if stalled > self._stall_timeout_s:
                log.error(
                    "engine core (pid %d) made no progress for %.1f s: killing it",
                    proc.pid,
                    stalled,
                )
                proc.kill()
                await proc.wait()  # _watch respawns it

    async def _watch(self) -> None:
        delay = self._respawn_delay_s
        while True:
            proc = self._proc
            assert proc is not None
            code = await proc.wait()
            if self._stopping.is_set():
                return
            welcome = self._client.last_welcome
            handshook = welcome is not None and welcome.core_pid == proc.pid
            self._client.lose(f"the engine core exited with code {code}")
            if welcome is None:
                self.failure = f"the engine core exited with code {code} before its handshake"
                log.error("%s; giving up", self.failure)
                self.failed.set()
                return
            # a core that crashes again before answering backs off, up to half a minute
            delay = self._respawn_delay_s if handshook else backed_off(delay)
            log.error("engine core (pid %d) exited with code %d; respawning", proc.pid, code)
            if not await respawn(self._spawn, delay, self._stopping, "the engine core"):
                return
