"""`frontend --workers 2`: two frontend processes on one API port (SO_REUSEPORT) and one core.
Which process serves a connection is read from /proc, so every case is deterministic."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from unittest import mock

import aiohttp
import pytest

from tests.conftest import TinyModels
from tests.fixtures import live_server as ls
from tests.fixtures.live_server import (
    LiveServer,
    default_engine,
    metrics,
    post,
    process_gone,
    wait_metrics,
)

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
CLIENT_TIMEOUT_S = 2.0
_WORKER = re.compile(r"worker 1 spawned: pid (\d+)")


def chat(**fields: Any) -> dict[str, Any]:
    base = {"model": "succ", "messages": [{"role": "user", "content": "a"}], "temperature": 0}
    return base | fields


@contextmanager
def workers_server(workdir: Path, engine: dict[str, object], n: int = 2) -> Iterator[LiveServer]:
    """A live `frontend --workers n`; on exit it must drain and exit 0, its core with it."""
    argv = ls.frontend_argv
    with (
        mock.patch.object(ls, "frontend_argv", lambda c: [*argv(c), "--workers", str(n)]),
        ls.live_server(workdir, engine) as server,
    ):
        yield server


def worker_pids(server: LiveServer) -> list[int]:
    return [int(p) for p in _WORKER.findall(server.log())]


def server_pid(resp: aiohttp.ClientResponse, pids: list[int]) -> int:
    """Which of `pids` holds the server end of this response's loopback connection."""
    assert resp.connection is not None and resp.connection.transport is not None
    client_port = resp.connection.transport.get_extra_info("sockname")[1]
    server_port = resp.url.port
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
        if (local, remote) == (server_port, client_port):
            inodes.add(f"socket:[{fields[9]}]")
    for pid in pids:
        for fd in Path(f"/proc/{pid}/fd").iterdir():
            try:
                if os.readlink(fd) in inodes:
                    return pid
            except OSError:
                continue  # closed meanwhile
    raise AssertionError(f"no process of {pids} holds the connection from port {client_port}")


async def read_event(resp: aiohttp.ClientResponse) -> Any:
    line = await resp.content.readuntil(b"\n\n")
    assert line, "the stream ended before [DONE]"
    payload = line[len(b"data: ") : -2]
    return payload.decode() if payload == b"[DONE]" else json.loads(payload)


async def stream_on_each(
    sessions: list[aiohttp.ClientSession], url: str, pids: list[int], max_tokens: int
) -> dict[int, aiohttp.ClientResponse]:
    """Open streams (each on a new connection) until each of `pids` serves one; close the rest."""
    owned: dict[int, aiohttp.ClientResponse] = {}
    for _ in range(40):
        session = aiohttp.ClientSession()
        sessions.append(session)
        resp = await session.post(url, json=chat(max_tokens=max_tokens, stream=True))
        assert resp.status == 200, await resp.text()
        await read_event(resp)  # the role chunk: the request runs in the core
        pid = server_pid(resp, pids)
        if pid in owned:
            resp.close()
        else:
            owned[pid] = resp
        if len(owned) == len(pids):
            return owned
    raise AssertionError(f"40 connections and not one on each of {pids}: {list(owned)}")


async def test_two_workers_share_the_port_the_core_and_the_metrics(
    tiny: TinyModels, tmp_path: Path
) -> None:
    engine = default_engine(tiny.succ, model_id="succ", step_delay_ms=20)
    with workers_server(tmp_path / "w", engine) as server:
        assert server.proc is not None
        pids = [server.proc.pid, *worker_pids(server)]
        assert len(pids) == 2
        server.core_pid()  # one core, spawned by worker 0 only
        # requests on fresh connections until both processes have answered some
        served = dict.fromkeys(pids, 0)
        for _ in range(60):
            async with aiohttp.ClientSession() as session:
                resp = await session.post(server.api + CHAT, json=chat(max_tokens=3, stream=True))
                owner = server_pid(resp, pids)
                body = (await resp.read()).decode()
            assert body.endswith("data: [DONE]\n\n"), body
            served[owner] += 1
            if min(served.values()) >= 2:
                break
        assert min(served.values()) >= 2, served
        # the health port (worker 0) counts the requests of both
        got = await metrics(server.health)
        total = sum(served.values())
        assert got[f"tl_frontend_requests_total{{endpoint={CHAT},status=200}}"] == total, got
        assert got["tl_frontend_e2e_request_latency_seconds_count"] == total
        assert got["tl_engine_active_sequences"] == 0  # the core's gauges, once
        # SIGTERM to worker 0 drains both: the streams they serve run to their end
        sessions: list[aiohttp.ClientSession] = []
        try:
            streams = await stream_on_each(sessions, server.api + CHAT, pids, 60)
            server.terminate()
            deadline = time.monotonic() + 5.0
            while True:  # both listeners close: no process takes new connections
                try:
                    await post(server.api + "/v1/models", {})
                except aiohttp.ClientConnectionError:
                    break
                assert time.monotonic() < deadline, "a listener stayed open"
                await asyncio.sleep(0.05)
            for resp in streams.values():
                events = [await read_event(resp) for _ in range(3)]
                while events[-1] != "[DONE]":
                    events.append(await read_event(resp))
                assert events[-2]["choices"][0]["finish_reason"] == "length"
            assert server.wait(30.0) == 0
        finally:
            for session in sessions:
                await session.close()
        assert all(process_gone(pid) for pid in pids)
        assert "worker 1 exited with 0" in server.log()


async def test_a_killed_worker_loses_its_requests_and_the_other_serves(
    tiny: TinyModels, tmp_path: Path
) -> None:
    engine = default_engine(
        tiny.succ, model_id="succ", step_delay_ms=40, client_timeout_s=CLIENT_TIMEOUT_S
    )
    with workers_server(tmp_path / "w", engine) as server:
        assert server.proc is not None
        pids = [server.proc.pid, worker_pids(server)[0]]
        sessions: list[aiohttp.ClientSession] = []
        try:
            streams = await stream_on_each(sessions, server.api + CHAT, pids, 400)
            await wait_metrics(server.health, {"tl_engine_active_sequences": 2.0}, 5.0)
            os.kill(pids[1], signal.SIGKILL)
            killed_at = time.monotonic()
            with pytest.raises((aiohttp.ClientPayloadError, aiohttp.ClientConnectionError)):
                await asyncio.wait_for(streams[pids[1]].read(), 5.0)  # cut, no [DONE]
            for _ in range(5):  # worker 0's stream goes on
                assert "choices" in await read_event(streams[pids[0]])
            streams[pids[0]].close()  # its abort frees its blocks at once
            await wait_metrics(server.health, {"tl_engine_active_sequences": 1.0}, 1.0)
        finally:
            for session in sessions:
                await session.close()
        # the killed worker's request holds its blocks until the core gives up on it
        busy = await metrics(server.health)
        assert time.monotonic() - killed_at < CLIENT_TIMEOUT_S, "too slow to see the orphan"
        assert busy["tl_engine_kv_blocks{state=used}"] > 0
        idle = {"tl_engine_active_sequences": 0.0, "tl_engine_kv_blocks{state=used}": 0.0}
        await wait_metrics(server.health, idle, CLIENT_TIMEOUT_S + 3.0)
        assert "silent for 2 s: aborting its requests" in server.log()
        # new connections all land on worker 0, then on the respawned worker 1 too
        for _ in range(5):
            reply = await post(server.api + CHAT, chat(max_tokens=3))
            assert reply.doc["choices"][0]["message"]["content"] == "bcd"
        deadline = time.monotonic() + 10.0
        while len(worker_pids(server)) < 2:
            assert time.monotonic() < deadline, "worker 1 was not respawned"
            await asyncio.sleep(0.1)
        assert not process_gone(worker_pids(server)[1])
