"""bench.load_client against a server that closes every connection after its streamed answer."""

from __future__ import annotations

import asyncio
import io
import time

import aiohttp

from bench.load_client import Progress, run_level, send_one

SSE = (
    b'data: {"choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'
    b'data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1}}\n\n'
    b"data: [DONE]\n\n"
)


async def one_answer_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Like llama-server here: announce keep-alive, stream one answer, close the connection."""
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length"))  # fmt: skip
    await reader.readexactly(length)
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nKeep-Alive: timeout=5, max=100\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
        + f"{len(SSE):x}\r\n".encode()
        + SSE
        + b"\r\n0\r\n\r\n"
    )
    await writer.drain()
    writer.close()


async def sequential_requests(n: int) -> list[str | None]:
    server = await asyncio.start_server(one_answer_then_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with server, aiohttp.ClientSession() as session:
        records = [
            await send_one(session, url, {"stream": True}, 10.0, time.perf_counter() + 10)
            for _ in range(n)
        ]
    assert all(r.output_tokens == 1 for r in records if r.failure is None)
    return [r.failure for r in records]


def test_a_connection_closed_after_each_answer_does_not_fail_the_next_request() -> None:
    assert asyncio.run(sequential_requests(6)) == [None] * 6


async def concurrent_level(concurrency: int, n: int) -> list[str | None]:
    server = await asyncio.start_server(one_answer_then_close, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        run = await run_level(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            [{"stream": True}] * n,
            concurrency=concurrency,
            request_rate=None,
            max_concurrency=None,
            max_seconds=30.0,
            timeout_s=10.0,
            seed=0,
            progress=Progress("test", n, out=io.StringIO()),
        )
    return [r.failure for r in run.records]


def test_many_streams_whose_connections_all_close_at_once_still_complete() -> None:
    # a whole wave of answers ends together: every pooled connection is closing at once
    assert asyncio.run(concurrent_level(16, 96)) == [None] * 96
