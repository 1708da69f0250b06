"""The HTTP side of a load run: one streamed request, and a level in closed or open loop."""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

import aiohttp
import msgspec

from bench.load_sse import DONE, SSEDecoder, read_chunk
from bench.load_stats import RequestRecord

JSON = {"Content-Type": "application/json"}


async def send_one(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    timeout_s: float,
    deadline: float,
) -> RequestRecord:
    """One streamed request, never raising: a failure is recorded by status or kind.

    A pooled connection the server has just closed (llama-server closes each one after a
    streamed answer, a race with its reuse) fails before any answer: the request is sent once
    more, as HTTP clients do, on a new connection of its own (the pool's others may be closing
    too), its time counted from the first try.
    """
    record = RequestRecord()
    t0 = time.perf_counter()
    budget = min(timeout_s, deadline - t0)
    try:
        async with asyncio.timeout(budget):
            try:
                await _stream(session, url, body, record, t0)
            except aiohttp.ClientConnectionError:
                if record.end or record.token_times:  # the answer had begun: a real failure
                    raise
                async with aiohttp.ClientSession() as fresh:
                    await _stream(fresh, url, body, record, t0)
    except TimeoutError:
        record.failure = "deadline" if budget < timeout_s else "timeout"
    except aiohttp.ClientError as exc:
        record.failure = "connection"
        record.detail = f"{type(exc).__name__}: {exc}"
    if record.failure is not None:
        record.end = time.perf_counter() - t0
    return record


async def _stream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    record: RequestRecord,
    t0: float,
) -> None:
    async with session.post(url, data=msgspec.json.encode(body), headers=JSON) as resp:
        if resp.status != 200:
            record.failure = str(resp.status)
            record.detail = (await resp.text(errors="replace"))[:300]
            return
        decoder = SSEDecoder()
        usage: tuple[int, int] | None = None
        done = False
        async for data in resp.content.iter_any():
            now = time.perf_counter() - t0  # every event in this read arrived now
            for event in decoder.feed(data):
                if event == DONE:
                    done = True
                    continue
                info = read_chunk(event)
                if info.error is not None:
                    record.failure, record.detail = "stream_error", info.error
                    return
                if info.text:
                    record.token_times.append(now)
                usage = info.usage or usage
            record.end = now
    if not done:
        record.failure = "incomplete"  # the stream closed without [DONE]
        return
    # a usage chunk counts tokens exactly; a content chunk may carry several tokens or none
    record.input_tokens, record.output_tokens = usage or (0, len(record.token_times))


@dataclass(slots=True)
class Progress:
    """One stderr line: rewritten in place on a terminal, written once per level otherwise."""

    label: str
    total: int
    out: TextIO = field(default_factory=lambda: sys.stderr)
    done: int = 0
    failed: int = 0
    t0: float = field(default_factory=time.perf_counter)
    shown: float = 0.0

    def add(self, record: RequestRecord) -> None:
        self.done += 1
        self.failed += record.failure is not None
        now = time.perf_counter()
        if self.out.isatty() and now - self.shown >= 0.1:
            self.shown = now
            self.out.write("\r" + self.line())
            self.out.flush()

    def close(self) -> None:
        self.out.write(("\r" if self.out.isatty() else "") + self.line() + "\n")
        self.out.flush()

    def line(self) -> str:
        filled = 20 * self.done // max(self.total, 1)
        bar = "#" * filled + "-" * (20 - filled)
        elapsed = time.perf_counter() - self.t0
        return f"{self.label} [{bar}] {self.done}/{self.total} done, {self.failed} failed, {elapsed:6.1f} s"


@dataclass(slots=True)
class LevelRun:
    """The records of one level and how long it took."""

    records: list[RequestRecord]
    duration_s: float
    hit_deadline: bool


async def run_level(
    url: str,
    bodies: Sequence[dict[str, Any]],
    *,
    concurrency: int | None,
    request_rate: float | None,
    max_concurrency: int | None,
    max_seconds: float,
    timeout_s: float,
    seed: int,
    progress: Progress,
) -> LevelRun:
    """Closed loop (`concurrency` requests in flight) or open loop (Poisson `request_rate`)."""
    limit = concurrency or max_concurrency or len(bodies)
    records: list[RequestRecord] = []
    t0 = time.perf_counter()
    deadline = t0 + max_seconds
    connector = aiohttp.TCPConnector(limit=limit)
    async with aiohttp.ClientSession(
        connector=connector, timeout=aiohttp.ClientTimeout(total=None)
    ) as session:

        async def one(body: dict[str, Any]) -> None:
            record = await send_one(session, url, body, timeout_s, deadline)
            records.append(record)
            progress.add(record)

        if concurrency is not None:
            pending = iter(bodies)  # shared by the workers: each takes the next body

            async def worker() -> None:
                for body in pending:
                    if time.perf_counter() >= deadline:
                        return
                    await one(body)

            await asyncio.gather(*(worker() for _ in range(concurrency)))
        else:
            assert request_rate is not None
            await _open_loop(bodies, one, request_rate, max_concurrency, deadline, seed)
    duration = time.perf_counter() - t0
    cut = len(records) < len(bodies) or any(r.failure == "deadline" for r in records)
    return LevelRun(records, duration, cut)


async def _open_loop(
    bodies: Sequence[dict[str, Any]],
    one: Callable[[dict[str, Any]], Awaitable[None]],
    request_rate: float,
    max_concurrency: int | None,
    deadline: float,
    seed: int,
) -> None:
    """Send at Poisson arrival times (exponential gaps), each request on its own task."""
    rng = random.Random(seed)
    gate = asyncio.Semaphore(max_concurrency or len(bodies))

    async def gated(body: dict[str, Any]) -> None:
        async with gate:
            if time.perf_counter() < deadline:
                await one(body)

    tasks: list[asyncio.Task[None]] = []
    at = time.perf_counter()
    try:
        for i, body in enumerate(bodies):
            if i:
                at += rng.expovariate(request_rate)
            if at >= deadline:
                break
            await asyncio.sleep(max(0.0, at - time.perf_counter()))
            tasks.append(asyncio.create_task(gated(body)))
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
