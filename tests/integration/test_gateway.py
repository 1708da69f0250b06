"""deploy/nginx/nginx.conf.template, filled in and run by a real nginx in front of two real
frontends (one spawns the core, the other attaches to it): streams pass through unbuffered,
429 and its Retry-After reach the client, and a draining frontend takes no new requests."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import TinyModels
from tests.fixtures.live_server import (
    REPO,
    LiveServer,
    default_engine,
    free_port,
    metrics,
    post,
    request,
    wait_metrics,
)

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
TEMPLATE = REPO / "deploy" / "nginx" / "nginx.conf.template"
STEP_DELAY_MS = 40
SERVED = f"tl_frontend_requests_total{{endpoint={CHAT},status=200}}"


def chat(**fields: Any) -> dict[str, Any]:
    base = {"model": "succ", "messages": [{"role": "user", "content": "a"}], "temperature": 0}
    return base | fields


@pytest.fixture(scope="module")
def nginx_binary() -> str:
    found = shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx", "/usr/local/sbin/nginx") if Path(p).exists()), None
    )
    if found is None:
        why = "nginx is not installed (apt-get install nginx-light)"
        if os.environ.get("CI"):
            pytest.fail(f"{why}: CI must install it (.ci/run)")
        pytest.skip(why)
    return found


@pytest.fixture(scope="module")
def frontends(
    tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[LiveServer, LiveServer]]:
    """Frontend A spawns the core; B attaches to it. Two sequences run at once, one may wait."""
    root = tmp_path_factory.mktemp("frontends")
    engine = default_engine(
        tiny.succ, model_id="succ", max_num_seqs=2, queue_capacity=1, step_delay_ms=STEP_DELAY_MS
    )
    a = LiveServer(root / "a", engine).start()
    b = LiveServer(
        root / "b",
        default_engine(
            tiny.succ, model_id="succ", spawn_core=False, core_address=engine["core_address"]
        ),
    )
    try:
        b.start()
        yield a, b
        for server in (b, a):  # b may have drained already
            if server.proc is not None and server.proc.poll() is None:
                server.terminate()
            assert server.wait() == 0, server.log()[-3000:]
    finally:
        b.kill()
        a.kill()


@pytest.fixture(scope="module")
def gateway(
    nginx_binary: str,
    frontends: tuple[LiveServer, LiveServer],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[str]:
    """nginx (not a daemon) on a free loopback port, its files in a temp dir; its base URL."""
    run_dir = tmp_path_factory.mktemp("nginx")
    listen = f"127.0.0.1:{free_port()}"
    values = {
        "TL_LISTEN": listen,
        "TL_UPSTREAM_1": frontends[0].api.removeprefix("http://"),
        "TL_UPSTREAM_2": frontends[1].api.removeprefix("http://"),
        "TL_RUN_DIR": str(run_dir),
    }
    conf = TEMPLATE.read_text()
    for name, value in values.items():
        conf = conf.replace("${" + name + "}", value)
    assert "${TL_" not in conf
    (run_dir / "nginx.conf").write_text(conf)
    argv = [nginx_binary, "-p", str(run_dir), "-c", str(run_dir / "nginx.conf")]
    argv += ["-e", str(run_dir / "error.log"), "-g", "daemon off;"]
    check = subprocess.run([*argv, "-t"], capture_output=True, timeout=30, check=False)
    assert check.returncode == 0, check.stderr.decode()
    with (run_dir / "stderr.log").open("wb") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    try:
        host, port = listen.split(":")
        deadline = time.monotonic() + 10.0
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                break
            except OSError:
                assert proc.poll() is None, (run_dir / "error.log").read_text()
                assert time.monotonic() < deadline, "nginx does not listen"
                time.sleep(0.05)
        yield "http://" + listen
    finally:
        proc.send_signal(signal.SIGQUIT)  # graceful
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


async def test_stream_passes_through_unbuffered(gateway: str) -> None:
    n = 30  # ~1.2 s of steps
    arrivals: list[float] = []
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            gateway + CHAT,
            json=chat(max_tokens=n, stream=True),
            headers={"Accept-Encoding": "gzip, deflate"},
        ) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert "Content-Encoding" not in resp.headers
        events = []
        while not events or events[-1] != b"data: [DONE]\n\n":
            events.append(await resp.content.readuntil(b"\n\n"))
            arrivals.append(time.monotonic())
    assert len(events) == n + 2  # role, one chunk per token, [DONE]
    # the first token reaches the client long before the last: nothing waits for the end
    assert arrivals[-1] - arrivals[1] > 0.6 * n * STEP_DELAY_MS / 1000, arrivals
    assert len({round(t, 2) for t in arrivals}) > n // 2  # not in a few bursts


async def test_full_queue_429_and_retry_after_pass_through(
    gateway: str, frontends: tuple[LiveServer, LiveServer]
) -> None:
    a, _ = frontends
    async with aiohttp.ClientSession() as s1, aiohttp.ClientSession() as s2:
        running = [
            await s.post(gateway + CHAT, json=chat(max_tokens=500, stream=True)) for s in (s1, s2)
        ]
        assert [r.status for r in running] == [200, 200]
        await wait_metrics(a.health, {"tl_engine_active_sequences": 2.0}, 5.0)
        queued = asyncio.create_task(post(gateway + CHAT, chat(max_tokens=3)))
        await wait_metrics(a.health, {"tl_engine_queue_depth": 1.0}, 5.0)
        for body in (chat(max_tokens=3), chat(max_tokens=3, stream=True)):
            refused = await post(gateway + CHAT, body)
            assert refused.status == 429, refused.body
            assert 1 <= int(refused.headers["Retry-After"]) <= 60  # the core's estimate
            assert refused.headers["Content-Type"].startswith("application/json")
            assert refused.doc == {
                "error": {
                    "message": refused.doc["error"]["message"],
                    "type": "rate_limit_error",
                    "param": None,
                    "code": "rate_limit_exceeded",
                }
            }
        for resp in running:
            resp.close()  # nginx closes its upstream connection: the frontend aborts
        done = await asyncio.wait_for(queued, 10.0)
    assert done.status == 200 and done.doc["choices"][0]["message"]["content"] == "bcd"
    idle = {"tl_engine_active_sequences": 0.0, "tl_engine_queue_depth": 0.0}
    await wait_metrics(a.health, idle, 5.0)


async def test_a_draining_frontend_takes_no_new_requests(
    gateway: str, frontends: tuple[LiveServer, LiveServer]
) -> None:
    a, b = frontends
    for _ in range(6):  # nginx now keeps connections to both frontends
        assert (await post(gateway + CHAT, chat(max_tokens=2))).status == 200
    served_by_a = (await metrics(a.health))[SERVED]
    async with aiohttp.ClientSession() as session:
        # a stream on B itself keeps B draining for a few seconds
        stream = await session.post(b.api + CHAT, json=chat(max_tokens=100, stream=True))
        assert stream.status == 200
        b.terminate()
        deadline = time.monotonic() + 5.0
        while (await request("GET", b.health + "/readyz")).status != 503:
            assert time.monotonic() < deadline, "B never started draining"
            await asyncio.sleep(0.05)
        for _ in range(8):
            reply = await post(gateway + CHAT, chat(max_tokens=3))
            assert reply.status == 200, reply.body
            assert reply.doc["choices"][0]["message"]["content"] == "bcd"
        assert b.proc is not None and b.proc.poll() is None  # all of that while B drained
        assert (await metrics(a.health))[SERVED] == served_by_a + 8  # all of it on A
        assert (await stream.read()).endswith(b"data: [DONE]\n\n")
    assert b.wait(30.0) == 0
    for _ in range(4):  # B is gone: connection refused, A answers
        reply = await post(gateway + CHAT, chat(max_tokens=3))
        assert reply.status == 200, reply.body
