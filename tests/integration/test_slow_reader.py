"""Backpressure: while a stream's writes are held (its client does not read), what the core
sends for it waits as a bounded number of events (the last merges the rest), and the stream catches up whole when it resumes."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp
import pytest

from frontend.api.sse import SSEStream
from frontend.core.request_stream import MERGE_AFTER, Item, RequestStream
from tests.conftest import TinyModels
from tests.fixtures.frontend_harness import eventually, serving, sse_data

pytestmark = pytest.mark.integration

CHAT = "/v1/chat/completions"
NUM_TOKENS = 600


async def test_a_held_stream_waits_on_a_bounded_backlog_and_loses_nothing(
    tiny: TinyModels, monkeypatch: pytest.MonkeyPatch
) -> None:
    resume = asyncio.Event()
    send = SSEStream.send
    writes = 0

    async def held_send(self: SSEStream, document: object) -> None:
        nonlocal writes
        writes += 1
        if writes == 3:  # the role chunk and one delta went out; then the client stops reading
            await resume.wait()
        await send(self, document)

    streams: list[RequestStream] = []
    most_pending = 0
    put = RequestStream.put

    def watched_put(self: RequestStream, item: Item) -> bool:
        nonlocal most_pending
        if self not in streams:
            streams.append(self)
        done = put(self, item)
        most_pending = max(most_pending, self.pending)
        return done

    monkeypatch.setattr(SSEStream, "send", held_send)
    monkeypatch.setattr(RequestStream, "put", watched_put)
    body: dict[str, Any] = {
        "model": "succ",
        "messages": [{"role": "user", "content": "a"}],
        "max_tokens": NUM_TOKENS,
        "ignore_eos": True,
        "temperature": 0,
    }
    async with serving(tiny.succ) as s, aiohttp.ClientSession() as session:
        async with session.post(s.api + CHAT, json=body) as r:
            whole = (await r.json())["choices"][0]["message"]["content"]
        streams.clear()
        most_pending = 0
        async with session.post(s.api + CHAT, json=body | {"stream": True}) as resp:
            await eventually(lambda: bool(streams) and streams[0].closed)  # the core is done
            assert most_pending == MERGE_AFTER  # the rest of the wait merged into the last
            resume.set()
            events = sse_data((await resp.read()).decode())
    assert events[-1] == "[DONE]"
    deltas = [e["choices"][0]["delta"].get("content") or "" for e in events[1:-1]]
    assert "".join(deltas) == whole
    assert len(deltas) < NUM_TOKENS // 2  # the held tokens came as one delta
