"""The engine core dies (SIGKILL) under load: the frontends survive it. Open streams end at once
with an error event, new requests get 503, /readyz is 503; the owning frontend spawns a new
core and everything serves again, with no restart of any frontend. Real processes, loopback."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import TinyModels
from tests.fixtures.live_server import (
    LiveServer,
    default_engine,
    post,
    process_gone,
    request,
)

# serial: a killed core's streams must end within PROMPT_S, and its respawn (1 s, then a
# start) bounds the window of 503s; once in six two-process runs it failed beside another file
pytestmark = [pytest.mark.integration, pytest.mark.serial]

CHAT = "/v1/chat/completions"
# large, so that neither side's silence rule can explain a prompt reaction to the kill
CLIENT_TIMEOUT_S = 30.0
PROMPT_S = 3.0
_SPAWNED = re.compile(r"engine core spawned: pid (\d+)")


def chat(**fields: Any) -> dict[str, Any]:
    base = {"model": "succ", "messages": [{"role": "user", "content": "a"}], "temperature": 0}
    return base | fields


def unavailable(doc: Any) -> bool:
    """The OpenAI error document of a lost core."""
    error = doc["error"]
    return set(error) == {"message", "type", "param", "code"} and (
        error["type"],
        error["param"],
        error["code"],
    ) == ("service_unavailable_error", None, "engine_unavailable")


async def open_stream(session: aiohttp.ClientSession, url: str) -> aiohttp.ClientResponse:
    resp = await session.post(url + CHAT, json=chat(max_tokens=500, stream=True))
    assert resp.status == 200, await resp.text()
    for _ in range(3):  # role, "b", "c": it is running in the core
        assert (await resp.content.readuntil(b"\n\n")).startswith(b"data: {")
    return resp


async def rest(resp: aiohttp.ClientResponse) -> list[Any]:
    """The remaining data documents of a stream, up to its end."""
    body = (await resp.content.read()).decode()
    assert body.endswith("\n\n"), body[-200:]
    return [json.loads(e[6:]) for e in body[:-2].split("\n\n") if e.startswith("data: {")]


async def wait_ready(server: LiveServer, timeout_s: float) -> float:
    t0 = time.monotonic()
    while (await request("GET", server.health + "/readyz")).status != 200:
        assert time.monotonic() - t0 < timeout_s, f"not ready again:\n{server.log()[-3000:]}"
        await asyncio.sleep(0.05)
    return time.monotonic() - t0


async def test_frontends_survive_a_killed_core(tiny: TinyModels, tmp_path: Path) -> None:
    engine = default_engine(
        tiny.succ, model_id="succ", step_delay_ms=40, client_timeout_s=CLIENT_TIMEOUT_S
    )
    owner = LiveServer(tmp_path / "owner", engine).start()
    attached_engine = default_engine(
        tiny.succ,
        model_id="succ",
        spawn_core=False,
        core_address=engine["core_address"],
        client_timeout_s=CLIENT_TIMEOUT_S,
    )
    attached = LiveServer(tmp_path / "attached", attached_engine)
    try:
        attached.start()
        servers = (owner, attached)
        old_core = owner.core_pid()
        async with aiohttp.ClientSession() as session:
            streams = [await open_stream(session, s.api) for s in (*servers, owner, attached)]
            whole = asyncio.create_task(post(owner.api + CHAT, chat(max_tokens=500)))
            await asyncio.sleep(0.3)
            os.kill(old_core, signal.SIGKILL)
            killed_at = time.monotonic()
            # every open stream ends at once, with an error event and no [DONE]
            for resp in streams:
                docs = await asyncio.wait_for(rest(resp), PROMPT_S)
                assert unavailable(docs[-1]), docs[-1]
                assert all("choices" in d for d in docs[:-1])
            reply = await asyncio.wait_for(whole, PROMPT_S)
            assert reply.status == 503 and unavailable(reply.doc), reply.body
            assert time.monotonic() - killed_at < PROMPT_S
        # until a new core has handshaken (the owner respawns it after 1 s): 503 for new
        # requests, streamed or not, and /readyz
        for server in servers:
            assert (await request("GET", server.health + "/readyz")).status == 503
            for body in (chat(max_tokens=3), chat(max_tokens=3, stream=True)):
                refused = await post(server.api + CHAT, body)
                assert refused.status == 503 and unavailable(refused.doc), refused.body
            assert (await request("GET", server.health + "/healthz")).status == 200
        # the owner spawns a new core; both frontends serve again, in the same processes
        for server in servers:
            # a bound, not a speed: on a cold numba cache (a clean clone) the new core may
            # compile kernels for minutes on this machine kind before it handshakes
            await wait_ready(server, 300.0)
            reply = await post(server.api + CHAT, chat(max_tokens=3))
            assert reply.status == 200, reply.body
            assert reply.doc["choices"][0]["message"]["content"] == "bcd"
            assert server.proc is not None and server.proc.poll() is None
        cores = [int(p) for p in _SPAWNED.findall(owner.log())]
        assert len(cores) == 2 and cores[0] == old_core and process_gone(old_core), cores
        assert "exited with code -9; respawning" in owner.log()
        # and they drain as usual: the attached one first, then the owner and its new core
        for server in (attached, owner):
            server.terminate()
            assert server.wait(30.0) == 0, server.log()[-3000:]
        assert f"engine core (pid {cores[1]}) exited with 0" in owner.log()
        assert process_gone(cores[1])
    finally:
        attached.kill()
        owner.kill()
