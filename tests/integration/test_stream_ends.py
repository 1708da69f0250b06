"""Every way a stream can end: with `[DONE]`, with an error event, or with the connection reset
by the server. Never a clean end of the chunked body without one of the two events: a client
would take a truncated answer for a whole one."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import pytest

from frontend.text.generation import Generation
from tests.conftest import TinyModels
from tests.fixtures.frontend_harness import Serving, eventually, serving, sse_data

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
SLOW = {"step_delay_s": 0.05}  # 500 tokens take 25 s: the stream is surely still open
DONE = "done"
RESET = "reset"


def chat(content: str = "a", **extra: Any) -> dict[str, Any]:
    message = {"role": "user", "content": content}
    return {"model": "succ", "messages": [message], "stream": True} | extra


async def read_ending(resp: aiohttp.ClientResponse) -> str:
    """How the stream ended, as the client sees it: done, error <code>, reset or truncated."""
    try:
        body = (await resp.read()).decode()
    except aiohttp.ClientPayloadError:
        return RESET  # the chunked body never got its end
    last = sse_data(body)[-1]
    if last == "[DONE]":
        return DONE
    if isinstance(last, dict) and "error" in last:
        return f"error {last['error']['code']}"
    return "truncated: " + body[-200:]


async def first_events(resp: aiohttp.ClientResponse, n: int) -> list[Any]:
    """The first n events, read one by one (the role chunk is the first)."""
    assert resp.status == 200, await resp.text()
    return [sse_data((await resp.content.readuntil(b"\n\n")).decode())[0] for _ in range(n)]


async def ending_of(s: Serving, body: dict[str, Any]) -> str:
    async with aiohttp.ClientSession() as session, session.post(s.api + CHAT, json=body) as resp:
        assert resp.status == 200, await resp.text()
        return await read_ending(resp)


async def ending_after(
    s: Serving, body: dict[str, Any], then: Callable[[], Awaitable[None]]
) -> str:
    """Open the stream, read two events, do `then`, and read the rest."""
    async with aiohttp.ClientSession() as session, session.post(s.api + CHAT, json=body) as resp:
        await first_events(resp, 2)
        await then()
        return await read_ending(resp)


@pytest.mark.parametrize(
    ("body", "ending"),
    [
        pytest.param(chat("x"), DONE, id="eos"),  # y, z, then EOS
        pytest.param(chat("a") | {"stop": ["d"]}, DONE, id="stop-string"),
        pytest.param(chat("a") | {"max_tokens": 3}, DONE, id="length"),
        pytest.param(
            chat("a") | {"max_tokens": 3, "stream_options": {"include_usage": True}},
            DONE,
            id="length-with-usage",
        ),
    ],
)
async def test_a_finished_generation_ends_with_done(
    tiny: TinyModels, body: dict[str, Any], ending: str
) -> None:
    async with serving(tiny.succ) as s:
        assert await ending_of(s, body) == ending


async def test_a_client_that_leaves_has_its_request_aborted(tiny: TinyModels) -> None:
    async with serving(tiny.succ, core=SLOW) as s:
        session = aiohttp.ClientSession()
        resp = await session.post(s.api + CHAT, json=chat(max_tokens=500, ignore_eos=True))
        rid = (await first_events(resp, 2))[0]["id"].removeprefix("chatcmpl-")
        resp.close()
        await session.close()
        await eventually(lambda: rid in s.core.aborted())
        await eventually(lambda: s.server.services.drain_gate.in_flight == 0)


async def test_a_lost_core_ends_the_stream_with_an_error_event(tiny: TinyModels) -> None:
    async with serving(tiny.succ, core=SLOW) as s:

        async def lose_core() -> None:
            s.core.stop()

        ending = await ending_after(s, chat(max_tokens=500, ignore_eos=True), lose_core)
        assert ending == "error engine_unavailable"


async def test_a_failed_request_in_the_core_ends_with_an_error_event(tiny: TinyModels) -> None:
    async with serving(tiny.succ, core=SLOW | {"fail_after": 3}) as s:
        assert await ending_of(s, chat(max_tokens=500, ignore_eos=True)) == "error internal_error"


@pytest.mark.parametrize(
    ("raised", "ending"),
    [(RuntimeError, "error internal_error"), (ConnectionResetError, RESET)],
    ids=["a-frontend-failure-is-an-error-event", "a-connection-error-on-an-open-connection-resets"],
)
async def test_a_failure_in_the_frontend_mid_stream(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch, raised: type[Exception], ending: str
) -> None:
    """The ConnectionResetError case: one that is not the client's leaving (the connection is
    still open) was taken for it, the handler returned, and aiohttp ended the chunked body
    cleanly. (It fails once the stream holds its second token: the role chunk is out by then,
    and a first content chunk too unless the two tokens came merged into one event.)"""
    push = Generation.push

    def failing_push(self: Generation, event: Any) -> Any:
        piece = push(self, event)
        if self.num_tokens >= 2:
            raise raised("injected")
        return piece

    monkeypatch.setattr(Generation, "push", failing_push)
    async with serving(tiny.succ, core=SLOW) as s:
        assert await ending_of(s, chat(max_tokens=50)) == ending


async def test_a_stream_in_flight_at_a_drain_finishes(tiny: TinyModels) -> None:
    async with serving(tiny.succ, core=SLOW) as s:
        drain: asyncio.Task[None] | None = None

        async def start_drain() -> None:
            nonlocal drain
            drain = asyncio.create_task(s.server.drain())
            await eventually(lambda: s.server.services.drain_gate.draining)

        assert await ending_after(s, chat(max_tokens=20), start_drain) == DONE
        assert drain is not None
        await asyncio.wait_for(drain, 10)


async def test_a_stream_cut_by_the_drain_timeout_is_reset(tiny: TinyModels) -> None:
    async with serving(tiny.succ, core=SLOW, drain_timeout_s=0.2) as s:

        async def drain() -> None:
            await s.server.drain()  # the window passes; the handler is cancelled

        ending = await ending_after(s, chat(max_tokens=500, ignore_eos=True), drain)
        assert ending == RESET
