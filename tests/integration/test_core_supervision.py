"""Progress supervision: the frontend that spawned a core kills and respawns it when it has
work but makes no step; /healthz fails once no working core has been up for too long."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from frontend.server import Server
from shared.config import load
from tests.conftest import TinyModels
from tests.fixtures.faulty_core import SLOW_S
from tests.fixtures.frontend_harness import eventually, serving
from tests.fixtures.live_server import default_engine, write_runtime_toml

pytestmark = pytest.mark.integration

# a prompt [0, id, ...] is poisoned (tests/fixtures/faulty_core.py)
HANG, STALL, SLOW = 251, 252, 253
STALL_TIMEOUT_S = 2.0


@asynccontextmanager
async def supervised(tiny: TinyModels, workdir: Path, **overrides: object) -> AsyncIterator[Server]:
    """An in-process frontend that spawns the faulty core and supervises its progress."""
    settings = {"model_id": "tiny", "core_stall_timeout_s": STALL_TIMEOUT_S, **overrides}
    engine = default_engine(tiny.hf, **settings)
    path = write_runtime_toml(workdir / "runtime.toml", engine)
    faults = f"hang={HANG},stall={STALL},slow={SLOW}"
    # --owner-stdin: the core takes the spawner's token, so that its ShutdownCore is obeyed at
    # the end (without it the core ignored it and was killed after the stop timeout)
    argv = [sys.executable, "-m", "tests.fixtures.faulty_core", "--faults", faults, "--owner-stdin"]
    server = Server(load(path).engine, str(path), argv=[*argv, "--config", str(path)])
    try:
        await server.start()
        await server.services.core.wait_ready(120)
        yield server
        await server.drain()
    finally:
        server.kill_core()
        await server.close()


async def complete(server: Server, prompt: list[int]) -> tuple[int, Any]:
    url = f"http://127.0.0.1:{server.api_port}/v1/completions"
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        return resp.status, await resp.json()


@pytest.mark.parametrize("fault", [HANG, STALL], ids=["wedged-in-a-step", "never-schedules"])
async def test_a_core_with_work_and_no_step_is_killed_and_respawned(
    tiny: TinyModels, tmp_path: Path, fault: int
) -> None:
    async with supervised(tiny, tmp_path) as server:
        process = server.services.process
        assert process is not None
        first_pid = process.pid
        status, doc = await complete(server, [0, fault, 7, 8])
        assert status == 503, doc
        assert doc["error"]["code"] == "engine_unavailable"
        await server.services.core.wait_ready(120)  # the respawned core's handshake
        assert process.pid != first_pid
        status, doc = await complete(server, [9, 10, 11])
        assert status == 200, doc
        assert doc["usage"]["completion_tokens"] == 4


async def test_a_step_longer_than_the_client_timeout_loses_nothing(
    tiny: TinyModels, tmp_path: Path
) -> None:
    # a 5 s step against 2 s of patience on both sides: the core says Busy while it steps,
    # and reads the frontend's heartbeats of that time before it judges the frontend silent
    timeout_s = 2.0
    assert 2 * timeout_s < SLOW_S
    async with supervised(
        tiny, tmp_path, client_timeout_s=timeout_s, core_stall_timeout_s=30.0
    ) as server:
        process = server.services.process
        assert process is not None
        pid = process.pid
        started = time.monotonic()
        status, doc = await complete(server, [0, SLOW, 7, 8])
        assert status == 200, doc
        assert doc["usage"]["completion_tokens"] == 4
        assert time.monotonic() - started >= SLOW_S  # the slow step did run
        assert process.pid == pid  # the same core, never lost nor respawned
        status, doc = await complete(server, [9, 10, 11])
        assert status == 200, doc


async def healthz(*urls: str) -> list[int]:
    async with aiohttp.ClientSession() as session:
        statuses = []
        for url in urls:
            async with session.get(url + "/healthz") as resp:
                statuses.append(resp.status)
        return statuses


async def test_healthz_fails_after_too_long_without_a_core(tiny: TinyModels) -> None:
    # a core that never answers the handshake: no working core, on either port
    fake = {"silent": True}
    async with serving(tiny.succ, core=fake, wait_ready=False, unhealthy_after_s=0.3) as s:
        deadline = time.monotonic() + 10
        while await healthz(s.health, s.api) != [503, 503]:
            assert time.monotonic() < deadline, "/healthz still 200 without a core"
            await asyncio.sleep(0.05)
        s.core.silent = False  # it wakes up and answers the Hello
        await eventually(lambda: s.server.services.core.ready)
        assert await healthz(s.health, s.api) == [200, 200]
