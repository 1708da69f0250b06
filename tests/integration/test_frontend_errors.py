"""The README's error table over the wire, refusals from the core, and the headers."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from shared.protocol import RejectReason
from tests.conftest import TinyModels
from tests.fixtures.frontend_harness import Serving, eventually, serving, sse_data

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = [{"role": "user", "content": "a"}]
OK_CHAT: dict[str, Any] = {"model": "succ", "messages": MESSAGES, "max_tokens": 2}


@pytest.fixture
async def live(tiny: TinyModels) -> AsyncIterator[Serving]:
    async with serving(tiny.succ, max_body_bytes=4096) as s:
        yield s


async def call(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, aiohttp.typedefs.LooseHeaders]:
    data = body if isinstance(body, bytes) else None
    json_body = None if isinstance(body, bytes) else body
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, json=json_body, data=data, headers=headers) as resp,
    ):
        assert resp.content_type == "application/json", await resp.text()
        return resp.status, await resp.json(), resp.headers


def chat(**fields: Any) -> dict[str, Any]:
    return OK_CHAT | fields


BAD = [
    # (path, body, status, type, code, param)
    (CHAT, chat(temperature=2.5), 400, "invalid_request_error", "invalid_value", "temperature"),
    (CHAT, chat(temperature=-1), 400, "invalid_request_error", "invalid_value", "temperature"),
    (CHAT, chat(temperature="hot"), 400, "invalid_request_error", "invalid_value", "temperature"),
    (CHAT, chat(top_p=0), 400, "invalid_request_error", "invalid_value", "top_p"),
    (CHAT, chat(max_tokens=0), 400, "invalid_request_error", "invalid_value", "max_tokens"),
    (CHAT, chat(stop=list("abcde")), 400, "invalid_request_error", "invalid_value", "stop"),
    (CHAT, b"{not json", 400, "invalid_request_error", "invalid_json", None),
    (CHAT, {"messages": MESSAGES}, 400, "invalid_request_error", "missing_required_parameter", "model"),
    (CHAT, {"model": "succ"}, 400, "invalid_request_error", "missing_required_parameter", "messages"),
    (CHAT, chat(messages=[]), 400, "invalid_request_error", "missing_required_parameter", "messages"),
    (CHAT, chat(max_tokens=2000), 400, "invalid_request_error", "context_length_exceeded", "messages"),
    (CHAT, chat(n=129), 400, "invalid_request_error", "invalid_value", "n"),
    (CHAT, chat(tools=[{"type": "function"}]), 422, "invalid_request_error", "unsupported_parameter", "tools"),
    (CHAT, chat(tool_choice="auto"), 422, "invalid_request_error", "unsupported_parameter", "tool_choice"),
    (CHAT, chat(response_format={"type": "json_object"}), 422, "invalid_request_error", "unsupported_parameter", "response_format"),
    (
        CHAT,
        chat(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
        422, "invalid_request_error", "unsupported_parameter", "messages[0].content",
    ),
    (CHAT, chat(model="gpt-4"), 404, "invalid_request_error", "model_not_found", "model"),
    (CHAT, chat(echo=True), 422, "invalid_request_error", "unsupported_parameter", "echo"),
    (COMPLETIONS, {"model": "succ"}, 400, "invalid_request_error", "missing_required_parameter", "prompt"),
    (COMPLETIONS, {"model": "succ", "prompt": "a", "max_tokens": 1024}, 400, "invalid_request_error", "context_length_exceeded", "prompt"),
    ("/v1/embeddings", {"model": "succ"}, 400, "invalid_request_error", "missing_required_parameter", "input"),
    (CHAT, b"x" * 5000, 413, "invalid_request_error", "request_too_large", None),
]  # fmt: skip


@pytest.mark.parametrize(("path", "body", "status", "kind", "code", "param"), BAD)
async def test_error_table(
    live: Serving, path: str, body: Any, status: int, kind: str, code: str, param: str | None
) -> None:
    got_status, doc, headers = await call("POST", live.api + path, body)
    assert got_status == status
    assert set(doc) == {"error"}
    assert set(doc["error"]) == {"message", "type", "param", "code"}
    assert doc["error"]["message"]
    assert (doc["error"]["type"], doc["error"]["code"], doc["error"]["param"]) == (
        kind,
        code,
        param,
    )
    assert headers["X-Request-Id"]
    assert live.core.submitted() == []  # nothing refused reached the core


@pytest.mark.parametrize(
    ("method", "path", "status", "code"),
    [("GET", "/v1/nope", 404, "not_found"), ("GET", CHAT, 405, "method_not_allowed")],
)
async def test_route_errors(live: Serving, method: str, path: str, status: int, code: str) -> None:
    got, doc, _ = await call(method, live.api + path)
    assert got == status
    assert doc["error"] == {
        "message": doc["error"]["message"],
        "type": "invalid_request_error",
        "param": None,
        "code": code,
    }


async def test_unknown_fields_are_ignored(live: Serving) -> None:
    status, doc, _ = await call("POST", live.api + CHAT, chat(frobnicate=1, user="u"))
    assert status == 200 and doc["choices"][0]["message"]["content"] == "bc"


@pytest.mark.parametrize("value", ["high", "101", "-101", "1.5"])
async def test_bad_priority_header(live: Serving, value: str) -> None:
    status, doc, _ = await call("POST", live.api + CHAT, OK_CHAT, {"X-TL-Priority": value})
    assert status == 400
    assert (doc["error"]["code"], doc["error"]["param"]) == ("invalid_value", "X-TL-Priority")


async def test_kv_handle_is_not_found(live: Serving) -> None:
    status, doc, _ = await call("POST", live.api + CHAT, OK_CHAT, {"X-TL-KV-Handle": "kv-1"})
    assert status == 404
    assert doc["error"]["code"] == "kv_handle_not_found"


async def test_request_id_is_echoed_or_generated(live: Serving) -> None:
    _, _, headers = await call("POST", live.api + CHAT, OK_CHAT, {"X-Request-Id": "trace-42"})
    assert headers["X-Request-Id"] == "trace-42"
    _, _, error_headers = await call("GET", live.api + "/v1/nope", None, {"X-Request-Id": "t-7"})
    assert error_headers["X-Request-Id"] == "t-7"
    _, _, first = await call("GET", live.api + "/v1/models")
    _, _, second = await call("GET", live.api + "/v1/models")
    assert first["X-Request-Id"] and second["X-Request-Id"]
    assert first["X-Request-Id"] != second["X-Request-Id"]
    async with aiohttp.ClientSession() as session:
        body = chat(stream=True)
        async with session.post(live.api + CHAT, json=body, headers={"X-Request-Id": "s-1"}) as r:
            assert r.headers["X-Request-Id"] == "s-1"
        async with session.get(live.health + "/readyz") as r:
            assert r.headers["X-Request-Id"]


@pytest.mark.parametrize(
    ("reason", "status", "kind", "code"),
    [
        (RejectReason.QUEUE_FULL, 429, "rate_limit_error", "rate_limit_exceeded"),
        (RejectReason.NO_CAPACITY, 503, "service_unavailable_error", "no_capacity"),
        (RejectReason.SHUTTING_DOWN, 503, "service_unavailable_error", "shutting_down"),
        (RejectReason.CONTEXT_LENGTH_EXCEEDED, 400, "invalid_request_error", "context_length_exceeded"),
    ],
)  # fmt: skip
@pytest.mark.parametrize("stream", [False, True])
async def test_core_refusals_are_real_statuses(
    live: Serving, reason: RejectReason, status: int, kind: str, code: str, stream: bool
) -> None:
    live.core.reject = reason
    got, doc, headers = await call("POST", live.api + CHAT, chat(stream=stream))
    assert got == status  # a stream waits for the first event before its headers
    assert (doc["error"]["type"], doc["error"]["code"]) == (kind, code)
    assert headers.get("Retry-After") == ("1" if status == 429 else None)
    if code == "context_length_exceeded":
        assert doc["error"]["param"] == "messages"


async def test_full_queue_answers_429_at_once_and_the_queued_one_runs(tiny: TinyModels) -> None:
    fake = {"max_running": 1, "queue_capacity": 1, "step_delay_s": 0.05}
    async with serving(tiny.succ, core=fake) as s, aiohttp.ClientSession() as session:
        running = await session.post(s.api + CHAT, json=chat(max_tokens=6, stream=True))
        assert running.status == 200  # its first token came: it runs
        queued = asyncio.create_task(call("POST", s.api + CHAT, chat(max_tokens=3)))
        await eventually(lambda: len(s.core.submitted()) == 2)
        status, doc, headers = await call("POST", s.api + CHAT, chat())
        assert status == 429
        assert headers["Retry-After"] == "1"
        assert doc["error"]["code"] == "rate_limit_exceeded"
        assert not queued.done()
        status, doc, _ = await queued
        assert (status, doc["choices"][0]["message"]["content"]) == (200, "bcd")
        assert sse_data(await running.text())[-1] == "[DONE]"
        running.release()


async def test_core_not_ready_is_503(tiny: TinyModels) -> None:
    async with serving(tiny.succ, wait_ready=False, core={"silent": True}) as s:
        status, doc, _ = await call("POST", s.api + CHAT, OK_CHAT)
        assert status == 503
        assert doc["error"]["code"] == "engine_unavailable"
        models, doc, _ = await call("GET", s.api + "/v1/models")
        # the context is the core's: none has ever said it
        assert (models, doc["error"]["code"]) == (503, "engine_unavailable")
        async with aiohttp.ClientSession() as session, session.get(s.health + "/readyz") as r:
            assert r.status == 503


async def test_api_keys(tiny: TinyModels) -> None:
    async with serving(tiny.succ, api_keys=("k1", "k2")) as s:
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "k1"}):
            status, doc, _ = await call("POST", s.api + CHAT, OK_CHAT, headers)
            assert status == 401
            assert doc["error"]["code"] == "invalid_api_key"
        status, _, _ = await call("POST", s.api + CHAT, OK_CHAT, {"Authorization": "Bearer k2"})
        assert status == 200
        status, _, _ = await call("GET", s.api + "/healthz")
        assert status == 200
        status, _, _ = await call("GET", s.health + "/readyz")
        assert status == 200


async def test_a_body_trickled_in_too_slowly_gets_408_and_others_are_served(
    tiny: TinyModels,
) -> None:
    async with serving(tiny.succ, body_timeout_s=0.5) as s:
        port = s.api.rsplit(":", 1)[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", int(port))
        body = b'{"model": "succ", "messages": []}'
        writer.write(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:5]  # and the rest never comes
        )
        await writer.drain()
        status, doc, _ = await call("POST", s.api + CHAT, OK_CHAT)  # not held up meanwhile
        assert status == 200, doc
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
        assert head.startswith(b"HTTP/1.1 408 "), head
        length = int(
            next(h for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")).split(
                b":"
            )[1]
        )
        error = json.loads(await reader.readexactly(length))["error"]
        assert (error["type"], error["code"], error["param"]) == (
            "invalid_request_error",
            "request_timeout",
            None,
        )
        writer.close()
