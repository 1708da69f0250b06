"""A request that waits in the core's queue, seen by the official `openai` client and a raw
socket: its stream's headers and pings come once the core has queued it, its tokens later; a
full queue is still an HTTP 429; Retry-After on 429 and 503 no_capacity.

The wait is HOG_TOKENS engine steps of STEP_MS (2.4 s); TL_TEST_HOG_TOKENS=500 makes it 20 s.
With -s, the waiting stream's timeline is printed."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Iterator
from typing import Any

import aiohttp
import openai
import pytest

from tests.conftest import TinyModels
from tests.fixtures.live_server import LiveServer, default_engine, live_server, wait_metrics

pytestmark = [pytest.mark.integration, pytest.mark.conformance]

USER: list[Any] = [{"role": "user", "content": "a"}]
STEP_MS = 40
HOG_TOKENS = int(os.environ.get("TL_TEST_HOG_TOKENS", "60"))  # steps holding the only slot
PING_S = 0.2


def engine(tiny: TinyModels, **overrides: object) -> dict[str, object]:
    """One sequence at a time, slow steps, one waiting request at most."""
    return default_engine(
        tiny.succ,
        model_id="succ",
        max_num_seqs=1,
        queue_capacity=1,
        step_delay_ms=STEP_MS,
        sse_ping_interval_s=PING_S,
        **overrides,
    )


@pytest.fixture(scope="module")
def slow(tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    with live_server(tmp_path_factory.mktemp("slow"), engine(tiny)) as server:
        yield server


def client_of(server: LiveServer) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.api + "/v1", api_key="unused", max_retries=0)


async def hog(server: LiveServer) -> float:
    """Hold the only sequence slot for HOG_TOKENS steps; when it was done (monotonic)."""
    async with client_of(server) as client:
        await client.chat.completions.create(
            model="succ", messages=USER, max_tokens=HOG_TOKENS, extra_body={"ignore_eos": True}
        )
    return time.monotonic()


async def timeline(server: LiveServer) -> list[tuple[float, str]]:
    """(time, what) of a waiting stream: `sent`, `headers`, `ping`, `chunk` (no text), `text`,
    `done`."""
    body = {"model": "succ", "messages": USER, "max_tokens": 3, "stream": True}
    out: list[tuple[float, str]] = [(time.monotonic(), "sent")]
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.api + "/v1/chat/completions", json=body) as resp,
    ):
        assert resp.status == 200
        out.append((time.monotonic(), "headers"))
        while True:
            event = (await resp.content.readuntil(b"\n\n")).decode().strip()
            now = time.monotonic()
            if event == ": ping":
                out.append((now, "ping"))
            elif event == "data: [DONE]":
                out.append((now, "done"))
                return out
            else:
                delta = json.loads(event.removeprefix("data: "))["choices"][0]["delta"]
                out.append((now, "text" if delta.get("content") else "chunk"))


async def test_a_waiting_stream_gets_headers_and_pings_before_its_tokens(
    slow: LiveServer,
) -> None:
    hogging = asyncio.create_task(hog(slow))
    await wait_metrics(slow.health, {"tl_engine_active_sequences": 1}, 30.0)
    waiting = asyncio.create_task(timeline(slow))
    await wait_metrics(slow.health, {"tl_engine_queue_depth": 1}, 30.0)
    # the queue is full: a refusal before admission is a real HTTP status, with Retry-After
    async with client_of(slow) as client:
        with pytest.raises(openai.RateLimitError) as refused:
            await client.chat.completions.create(model="succ", messages=USER, stream=True)
    assert refused.value.status_code == 429
    assert 1 <= int(refused.value.response.headers["Retry-After"]) <= 60
    freed = await hogging
    events = await waiting
    start = events[0][0]
    print(  # the figures behind the assertions, with -s
        f"\nqueued stream, seconds after it was sent: slot freed {freed - start:.2f}, "
        + ", ".join(f"{kind} {t - start:.2f}" for t, kind in events[1:])
    )
    kinds = [kind for _, kind in events]
    assert kinds[:2] == ["sent", "headers"] and kinds[-1] == "done"
    first_text = next(t for t, kind in events if kind == "text")
    headers_at = events[1][0]
    # the headers (and the role chunk) came while the hog still held the slot; pings kept the
    # stream alive until its tokens, which came only once the slot was free
    assert headers_at < freed < first_text
    pings = [t for t, kind in events if kind == "ping" and t < freed]
    assert len(pings) >= 2, events
    assert kinds.index("chunk") < kinds.index("text")


async def test_waiting_past_the_deadline_is_503_with_retry_after(
    tiny: TinyModels, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with live_server(
        tmp_path_factory.mktemp("impatient"), engine(tiny, queue_deadline_ms=300)
    ) as server:
        hogging = asyncio.create_task(hog(server))
        await wait_metrics(server.health, {"tl_engine_active_sequences": 1}, 30.0)
        async with client_of(server) as client:
            with pytest.raises(openai.APIStatusError) as refused:
                await client.chat.completions.create(model="succ", messages=USER, max_tokens=2)
            assert refused.value.status_code == 503
            assert refused.value.code == "no_capacity"
            assert 1 <= int(refused.value.response.headers["Retry-After"]) <= 60
            # a stream was admitted, so its refusal comes as the stream's last event
            stream = await client.chat.completions.create(
                model="succ", messages=USER, max_tokens=2, stream=True
            )
            with pytest.raises(openai.APIError, match="waited too long"):
                async for _ in stream:
                    pass
        await hogging
