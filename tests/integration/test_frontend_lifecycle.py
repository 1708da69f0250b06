"""Disconnects, drain, a core that hangs or dies, and a spawned core that is respawned."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import zmq

from frontend.server import Server
from shared.config import EngineConfig
from tests.conftest import TinyModels
from tests.fixtures.frontend_harness import (
    Serving,
    engine_config,
    eventually,
    free_port,
    serving,
    sse_data,
)

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
REPO = Path(__file__).resolve().parents[2]


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "succ", "messages": [{"role": "user", "content": "a"}]} | extra


async def readyz(health: str) -> int:
    async with aiohttp.ClientSession() as session, session.get(health + "/readyz") as r:
        return r.status


async def probes(s: Serving) -> list[int]:
    """The statuses of /readyz on the health port and of vLLM's probes on the API port."""
    async with aiohttp.ClientSession() as session:
        out = [await readyz(s.health)]
        for method, path in (("GET", "/health"), ("GET", "/ping"), ("POST", "/ping")):
            async with session.request(method, s.api + path) as r:
                out.append(r.status)
    return out


async def test_stream_disconnect_aborts_in_the_core(tiny: TinyModels) -> None:
    async with serving(tiny.succ, core={"step_delay_s": 0.05}) as s:
        session = aiohttp.ClientSession()
        resp = await session.post(s.api + CHAT, json=chat(max_tokens=500, stream=True))
        first = await resp.content.readuntil(b"\n\n")
        rid = sse_data(first.decode())[0]["id"].removeprefix("chatcmpl-")
        await resp.content.readuntil(b"\n\n")
        resp.close()  # the client goes away mid-stream
        await session.close()
        await eventually(lambda: rid in s.core.aborted(), timeout=2.0)
        stats = await s.server.services.core.stats(1.0)
        assert stats is not None and stats.active_sequences == 0
        assert s.server.services.drain_gate.in_flight == 0


async def test_non_stream_disconnect_aborts_in_the_core(tiny: TinyModels) -> None:
    async with serving(tiny.succ, core={"step_delay_s": 0.05}) as s:

        async def forever() -> None:
            async with aiohttp.ClientSession() as session:
                await session.post(s.api + CHAT, json=chat(max_tokens=500))

        client = asyncio.create_task(forever())
        await eventually(lambda: len(s.core.submitted()) == 1)
        await asyncio.sleep(0.1)
        client.cancel()  # closes the connection: aiohttp cancels the handler
        rid = s.core.submitted()[0].rid
        await eventually(lambda: rid in s.core.aborted(), timeout=2.0)


async def test_drain_finishes_in_flight_and_refuses_new(tiny: TinyModels) -> None:
    async with serving(tiny.succ, core={"step_delay_s": 0.05}) as s:
        kept = aiohttp.ClientSession()  # one keep-alive connection, opened before the drain
        async with kept.get(s.api + "/v1/models") as r:
            assert r.status == 200
        streaming = aiohttp.ClientSession()
        stream = await streaming.post(s.api + CHAT, json=chat(max_tokens=30, stream=True))
        drain = asyncio.create_task(s.server.drain())
        await eventually(lambda: s.server.services.drain_gate.draining)
        assert await readyz(s.health) == 503
        async with aiohttp.ClientSession() as session, session.get(s.health + "/healthz") as r:
            assert r.status == 200  # alive until exit
        with pytest.raises(aiohttp.ClientConnectionError):
            async with aiohttp.ClientSession() as fresh:
                await fresh.get(s.api + "/v1/models")  # the listener is closed
        async with kept.post(s.api + CHAT, json=chat(max_tokens=2)) as r:
            assert r.status == 503
            assert (await r.json())["error"]["code"] == "shutting_down"
            assert r.headers["Retry-After"] == "1"  # another replica may serve it
        assert not drain.done()  # the stream is still in flight
        events = sse_data(await stream.text())
        assert events[-1] == "[DONE]"
        assert "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-1]) == (
            "bcdefghijklmnopqrstuvwxyz"  # then EOS: finish "stop"
        )
        await asyncio.wait_for(drain, 5)
        await kept.close()
        await streaming.close()


async def test_hung_core_fails_requests_then_recovers(tiny: TinyModels) -> None:
    fake = {"step_delay_s": 0.05}
    async with serving(tiny.succ, core=fake, client_timeout_s=1.0) as s:
        session = aiohttp.ClientSession()
        stream = await session.post(s.api + CHAT, json=chat(max_tokens=500, stream=True))
        plain = asyncio.create_task(session.post(s.api + CHAT, json=chat(max_tokens=500)))
        await eventually(lambda: len(s.core.submitted()) == 2)
        s.core.silent = True
        events = sse_data(await stream.text())
        assert events[-1]["error"]["code"] == "engine_unavailable"  # an error event, no [DONE]
        resp = await plain
        assert resp.status == 503
        assert (await resp.json())["error"]["code"] == "engine_unavailable"
        assert await probes(s) == [503] * 4  # the engine does not work
        s.core.silent = False  # it wakes up and finds the new connection's Hello
        await eventually(lambda: s.server.services.core.ready)
        assert await probes(s) == [200] * 4
        async with session.post(s.api + CHAT, json=chat(max_tokens=2)) as r:
            assert (await r.json())["choices"][0]["message"]["content"] == "bc"
        await session.close()


async def lost_and_back(s: Serving) -> None:
    """The link is lost (as when the core dies); a new connection handshakes and serves."""
    client = s.server.services.core
    client.lose("the test dropped it")
    await client.wait_ready(10)
    body = chat(max_tokens=2)
    async with aiohttp.ClientSession() as session, session.post(s.api + CHAT, json=body) as r:
        assert (await r.json())["choices"][0]["message"]["content"] == "bc"


async def test_a_new_connection_gets_its_monitor_while_old_ones_are_reaped(
    tiny: TinyModels,
) -> None:
    # pyzmq names a monitor's endpoint after the socket's file descriptor, which the next
    # socket reuses at once, while zmq unbinds the closed socket's endpoint only when it
    # reaps it: about one connection in a thousand failed there, and the frontend never
    # connected again (CI, stop 47). Every such name is held here, as if none were reaped.
    async with serving(tiny.succ) as s:
        held = s.server.services.core._context.socket(zmq.PAIR)
        try:
            for fd in range(1024):
                held.bind(f"inproc://monitor.s-{fd}")
            await lost_and_back(s)
            await lost_and_back(s)
        finally:
            held.close(linger=0)


async def test_a_connection_that_cannot_be_set_up_is_retried(
    tiny: TinyModels, caplog: pytest.LogCaptureFixture
) -> None:
    async with serving(tiny.succ) as s:
        client = s.server.services.core
        following = int(client.identity.rsplit("-", 1)[1]) + 1
        held = client._context.socket(zmq.PAIR)
        try:
            held.bind(f"inproc://core-monitor-{following}")  # the next connection's monitor
            await lost_and_back(s)
        finally:
            held.close(linger=0)
        assert "cannot connect to the engine core" in caplog.text
        assert client.identity.endswith(f"-{following + 1}")


@pytest.mark.parametrize("task", ["read", "write", "monitor"])
async def test_a_link_task_that_fails_is_logged_and_the_link_reconnects(
    tiny: TinyModels, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch, task: str
) -> None:
    # a reader, writer or monitor task that raised ended quietly: the connection stayed up
    # with no one reading (or writing) it, and the frontend unready for good; now it is
    # logged and the link lost, and the next connection handshakes
    async with serving(tiny.succ) as s:
        client = s.server.services.core
        first = client.identity
        broken = {"read": "_read", "write": "_write", "monitor": "_hang_up"}[task]

        async def fails(*_: object) -> None:
            raise RuntimeError(f"the {task} task broke")

        monkeypatch.setattr(client, broken, fails)
        client.lose("the test dropped it")  # the next connection's task fails at once
        await eventually(lambda: f"the {task} task broke" in caplog.text, 10)
        monkeypatch.undo()
        await lost_and_back(s)
        assert f"core-client-{task} failed" in caplog.text
        assert client.identity != first


def test_an_address_zmq_cannot_connect_to_is_refused_at_start(tiny: TinyModels) -> None:
    for address in ("tcp://127.0.0.1:core", "tcp://127.0.0.1"):
        with pytest.raises(ValueError, match="cannot connect to the engine core at"):
            Server(engine_config(tiny.succ, address))


def write_config(path: Path, engine: dict[str, Any]) -> Path:
    def value(v: Any) -> str:
        return (
            str(v).lower()
            if isinstance(v, bool)
            else repr(v)
            if not isinstance(v, str)
            else f'"{v}"'
        )

    path.write_text("[engine]\n" + "".join(f"{k} = {value(v)}\n" for k, v in engine.items()))
    return path


FAKE_CORE = [sys.executable, "-m", "tests.fixtures.fake_core"]


def spawning(model_dir: Path, tmp_path: Path) -> tuple[EngineConfig, Path]:
    """A frontend's config that spawns its core, and the runtime.toml the core reads."""
    address = f"tcp://127.0.0.1:{free_port()}"
    settings = {"spawn_core": True, "step_delay_ms": 50}
    path = write_config(
        tmp_path / "runtime.toml",
        {"model_dir": str(model_dir), "core_address": address, "model_id": "succ"} | settings,
    )
    return engine_config(model_dir, address, **settings), path


async def test_spawned_core_is_respawned_and_drained(
    tiny: TinyModels, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # (INFO: a failure shows each spawn, connection and handshake; CI saw the respawned
    # core not handshake within 30 s twice, with nothing logged at WARNING or above)
    caplog.set_level(logging.INFO, logger="frontend")
    config, path = spawning(tiny.succ, tmp_path)
    argv = [*FAKE_CORE, "--config", str(path)]
    server = Server(config, str(path), argv=argv, core_stop_timeout_s=5)
    process = server.services.process
    assert process is not None
    try:
        await server.start()
        await server.services.core.wait_ready(30)
        api, health = (
            f"http://127.0.0.1:{server.api_port}",
            f"http://127.0.0.1:{server.health_port}",
        )
        first_pid = process.pid
        assert first_pid is not None
        async with aiohttp.ClientSession() as session:
            stream = await session.post(api + CHAT, json=chat(max_tokens=500, stream=True))
            await stream.content.readuntil(b"\n\n")
            os.kill(first_pid, signal.SIGKILL)
            events = sse_data(await stream.text())
            assert events[-1]["error"]["code"] == "engine_unavailable"
            assert await readyz(health) == 503
            await server.services.core.wait_ready(30)  # a new core, a new handshake
            assert process.pid != first_pid
            assert await readyz(health) == 200
            async with session.post(api + CHAT, json=chat(max_tokens=2)) as r:
                assert (await r.json())["choices"][0]["message"]["content"] == "bc"
        await server.drain()
        assert process.returncode == 0  # ShutdownCore: it drained and exited by itself
    finally:
        server.kill_core()
        await server.close()


async def test_a_core_that_cannot_be_respawned_is_tried_again(
    tiny: TinyModels, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # the core's executable is gone for a while (an upgrade replacing the environment)
    config, path = spawning(tiny.succ, tmp_path)
    script, away = tmp_path / "core", tmp_path / "core.away"
    script.write_text(f'#!/bin/sh\nexec {" ".join(FAKE_CORE)} "$@"\n')
    script.chmod(0o755)
    server = Server(config, str(path), argv=[str(script), "--config", str(path)])
    process = server.services.process
    assert process is not None
    try:
        await server.start()
        await server.services.core.wait_ready(30)
        first_pid = process.pid
        assert first_pid is not None
        script.rename(away)
        os.kill(first_pid, signal.SIGKILL)
        await eventually(lambda: "cannot respawn the engine core" in caplog.text, 10)
        away.rename(script)
        await server.services.core.wait_ready(30)
        assert process.pid != first_pid
        assert not process.failed.is_set()
    finally:
        server.kill_core()
        await server.close()


async def test_core_that_never_starts_fails_the_frontend(tiny: TinyModels) -> None:
    config = engine_config(tiny.succ, f"tcp://127.0.0.1:{free_port()}", spawn_core=True)
    server = Server(config, argv=[sys.executable, "-c", "raise SystemExit(3)"])
    try:
        await server.start()
        failure = await asyncio.wait_for(server.wait_failed(), 10)
        assert "code 3" in failure
        assert await readyz(f"http://127.0.0.1:{server.health_port}") == 503
    finally:
        await server.close()


async def test_frontend_process_drains_on_sigterm(tiny: TinyModels, tmp_path: Path) -> None:
    api_port, health_port = free_port(), free_port()
    engine = {
        "model_dir": str(tiny.succ),
        "model_id": "succ",
        "http_listen": f"127.0.0.1:{api_port}",
        "health_listen": f"127.0.0.1:{health_port}",
        "core_address": f"tcp://127.0.0.1:{free_port()}",
        "spawn_core": False,
        "step_delay_ms": 50,
    }
    path = str(write_config(tmp_path / "runtime.toml", engine))
    core = await asyncio.create_subprocess_exec(*FAKE_CORE, "--config", path, cwd=REPO)
    frontend = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "frontend", "--config", path, cwd=REPO
    )
    api, health = f"http://127.0.0.1:{api_port}", f"http://127.0.0.1:{health_port}"
    try:

        async def ready() -> bool:
            try:
                return await readyz(health) == 200
            except aiohttp.ClientConnectionError:
                return False

        for _ in range(300):
            if await ready():
                break
            await asyncio.sleep(0.1)
        assert await ready()
        async with aiohttp.ClientSession() as session:
            stream = await session.post(api + CHAT, json=chat(max_tokens=20, stream=True))
            await stream.content.readuntil(b"\n\n")
            frontend.send_signal(signal.SIGTERM)
            for _ in range(50):
                if await readyz(health) == 503:
                    break
                await asyncio.sleep(0.02)
            assert await readyz(health) == 503
            with pytest.raises(aiohttp.ClientConnectionError):
                async with aiohttp.ClientSession() as fresh:
                    await fresh.get(api + "/v1/models")  # the listener is closed
            events = sse_data((await stream.read()).decode())  # the rest of the stream
            assert events[-1] == "[DONE]"
            assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert await asyncio.wait_for(frontend.wait(), 15) == 0
    finally:
        for proc in (frontend, core):
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
