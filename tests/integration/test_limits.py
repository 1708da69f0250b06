"""Access and limits on the real frontend (and core): API keys, body size, messages, stop
strings, context length, and the idle timeout that drops a client trickling its header."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import pytest

from frontend.server import IDLE_TIMEOUT_S
from tests.conftest import TinyModels
from tests.fixtures.live_server import LiveServer, default_engine, live_server, request

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
KEYS = ("sk-one", "sk-two")
AUTH = {"Authorization": f"Bearer {KEYS[1]}"}
MAX_BODY = 4096
MAX_MESSAGES = 3
MAX_MODEL_LEN = 64


def chat(**fields: Any) -> dict[str, Any]:
    base = {"model": "succ", "messages": [{"role": "user", "content": "a"}], "temperature": 0}
    return base | fields


def error(code: str, param: str | None, kind: str = "invalid_request_error") -> dict[str, Any]:
    """The OpenAI error document, message aside."""
    return {"type": kind, "param": param, "code": code}


def without_message(doc: Any) -> dict[str, Any]:
    assert isinstance(doc["error"].pop("message"), str)
    return dict(doc["error"])


@pytest.fixture(scope="module")
def server(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    engine = default_engine(
        tiny.succ,
        model_id="succ",
        max_body_bytes=MAX_BODY,
        max_messages=MAX_MESSAGES,
        max_model_len=MAX_MODEL_LEN,
    )
    env = {"TL_ENGINE__API_KEYS": '["sk-one", "sk-two"]'}  # a TOML list literal
    with live_server(tmp_path_factory.mktemp("limits"), engine, env) as live:
        yield live


async def post(server: LiveServer, body: Any, path: str = CHAT, **kw: Any) -> tuple[int, Any]:
    reply = await request("POST", server.api + path, body, kw.get("headers", AUTH))
    return reply.status, reply.doc


async def test_api_keys_guard_the_api_not_the_probes(server: LiveServer) -> None:
    refusals = [
        {},
        {"Authorization": "Bearer sk-three"},
        {"Authorization": f"Basic {KEYS[0]}"},
        {"Authorization": "Bearer "},
        {"Authorization": f"Bearer {KEYS[0]}x"},
    ]
    for headers in refusals:
        for method, path, body in (("POST", CHAT, chat()), ("GET", "/v1/models", None)):
            reply = await request(method, server.api + path, body, headers)
            assert reply.status == 401, (headers, path)
            assert without_message(reply.doc) == error("invalid_api_key", None), headers
    for key in KEYS:
        reply = await request(
            "POST", server.api + CHAT, chat(max_tokens=2), {"Authorization": f"Bearer {key}"}
        )
        assert reply.status == 200 and reply.doc["choices"][0]["message"]["content"] == "bc"
    # liveness, readiness and metrics never ask for a key
    assert (await request("GET", server.api + "/healthz")).status == 200
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await request("GET", server.health + path)).status == 200, path


async def test_body_size_limit(server: LiveServer) -> None:
    fits = chat(max_tokens=2, padding="x" * (MAX_BODY - 300))  # unknown fields are ignored
    assert (await post(server, fits))[0] == 200
    status, doc = await post(server, chat(padding="x" * MAX_BODY))
    assert (status, without_message(doc)) == (413, error("request_too_large", None))

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted as it comes
        yield b'{"model": "succ", "padding": "'
        for _ in range(MAX_BODY // 512 + 1):
            yield b"x" * 512
        yield b'"}'

    async with (
        aiohttp.ClientSession() as session,
        session.post(server.api + CHAT, data=chunks(), headers=AUTH) as resp,
    ):
        assert resp.status == 413
        assert without_message(await resp.json()) == error("request_too_large", None)


async def test_message_stop_and_context_limits(server: LiveServer) -> None:
    user = {"role": "user", "content": "a"}
    assert (await post(server, chat(messages=[user] * MAX_MESSAGES, max_tokens=2)))[0] == 200
    status, doc = await post(server, chat(messages=[user] * (MAX_MESSAGES + 1)))
    assert (status, without_message(doc)) == (400, error("invalid_value", "messages"))
    tokenize = {"model": "succ", "messages": [user] * (MAX_MESSAGES + 1)}
    status, doc = await post(server, tokenize, "/v1/tokenize")
    assert (status, without_message(doc)) == (400, error("invalid_value", "messages"))
    # at most 4 stop strings
    assert (await post(server, chat(stop=["x", "y", "z", "w"], max_tokens=2)))[0] == 200
    status, doc = await post(server, chat(stop=["x", "y", "z", "w", "v"]))
    assert (status, without_message(doc)) == (400, error("invalid_value", "stop"))
    # the prompt alone, or with max_tokens, over the context (the template adds nothing)
    long = {"role": "user", "content": "a" * (MAX_MODEL_LEN + 1)}
    for body in (
        chat(messages=[long]),
        chat(messages=[{"role": "user", "content": "a" * 10}], max_tokens=MAX_MODEL_LEN - 9),
    ):
        status, doc = await post(server, body)
        assert (status, without_message(doc)) == (
            400,
            error("context_length_exceeded", "messages"),
        )
    fits = chat(messages=[{"role": "user", "content": "a" * 10}], max_tokens=MAX_MODEL_LEN - 10)
    status, doc = await post(server, fits)
    assert status == 200 and doc["usage"]["total_tokens"] <= MAX_MODEL_LEN


async def held(server: LiveServer, trickle: bytes, limit_s: float) -> float:
    """Seconds until the server drops a connection that sends `trickle`, a byte per 0.5 s."""
    host, port = server.api.removeprefix("http://").rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    t0 = time.monotonic()
    try:
        for i in range(int(limit_s / 0.5)):
            if i < len(trickle):
                writer.write(trickle[i : i + 1])
                await writer.drain()
            try:
                if await asyncio.wait_for(reader.read(1024), 0.5) == b"":
                    return time.monotonic() - t0  # closed by the server
            except TimeoutError:
                continue
    except (ConnectionResetError, BrokenPipeError):
        return time.monotonic() - t0
    finally:
        writer.close()
    raise AssertionError(f"still open after {limit_s} s")


async def test_slow_or_silent_clients_are_dropped(server: LiveServer) -> None:
    header = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n" + b"X-Slow: a\r\n" * 20
    limit_s = IDLE_TIMEOUT_S + 10
    assert len(header) * 0.5 > limit_s  # it never completes its header in time
    slow = asyncio.create_task(held(server, header, limit_s))
    silent = asyncio.create_task(held(server, b"", limit_s))  # connects, sends nothing
    # meanwhile everybody else is served
    for _ in range(3):
        assert (await post(server, chat(max_tokens=2)))[0] == 200
        await asyncio.sleep(1.0)
    for task in (slow, silent):
        seconds = await task
        assert IDLE_TIMEOUT_S - 1 <= seconds <= IDLE_TIMEOUT_S + 3, seconds
