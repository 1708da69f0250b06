"""A client that does not read its stream for a minute beside 16 normal streams.

    NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.slow_reader [--seconds 60]

Bundled model, default config, loopback. Two phases of `--seconds` each on one server: 16
closed-loop streaming clients alone, then the same 16 beside one stalled client. The stalled
client sends a streamed chat request with a 4 KiB receive buffer and a long generation
(ignore_eos), reads nothing for the phase, then reads its whole body. Figures: the 16 streams'
output tok/s and median inter-token time in each phase, the frontend's RSS through the second
phase, and whether the stalled stream, once read, holds all its tokens and [DONE]. Checks: the
stalled stream is complete, the frontend's RSS grew by less than 16 MiB during the stall.
Writes bench/out/slow_reader.json; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import random
import re
import socket
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp

from bench.load import first_model
from bench.load_sse import DONE, SSEDecoder, read_chunk
from bench.load_workload import words
from bench.server_process import ROOT, ServerProcess, tl_serve
from bench.soak import rss_mb, stream_body

STREAMS = 16
STALLED_TOKENS = 1500  # more than it can generate during the stall: it is still going
RCVBUF = 4096
BOUND_MB = 16.0
_USAGE = re.compile(rb'"completion_tokens":\s*(\d+)')


async def stream(index: int, url: str, model: str, stop_at: float, gaps: list[float]) -> int:
    """One closed-loop client until stop_at: its output tokens; inter-token times into gaps."""
    rng, tokens = random.Random(3000 + index), 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300)) as session:
        while time.monotonic() < stop_at:
            doc = stream_body(model, f"Reader {index}: {words(rng, 48)}", rng.randint(64, 128))
            async with session.post(url, json=doc) as resp:
                resp.raise_for_status()
                decoder, last = SSEDecoder(), None
                async for data in resp.content.iter_any():
                    for event in decoder.feed(data):
                        if event == DONE:
                            continue
                        info = read_chunk(event)
                        if info.error is not None:
                            raise RuntimeError(f"stream error: {info.error}")
                        if info.usage is not None:
                            tokens += info.usage[1]
                        elif info.text:
                            now = time.monotonic()
                            if last is not None:
                                gaps.append(now - last)
                            last = now
    return tokens


async def phase(url: str, model: str, seconds: float) -> dict[str, float]:
    gaps: list[float] = []
    t0 = time.monotonic()
    tokens = await asyncio.gather(
        *(stream(i, url, model, t0 + seconds, gaps) for i in range(STREAMS))
    )
    elapsed = time.monotonic() - t0
    return {
        "tok_s": sum(tokens) / elapsed,
        "itl_p50_ms": 1000 * statistics.median(gaps),
        "seconds": elapsed,
    }


def stalled_request(port: int, doc: dict[str, Any]) -> socket.socket:
    """A connection with a small receive buffer that has sent its request and reads nothing."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF)
    sock.connect(("127.0.0.1", port))
    payload = json.dumps(doc).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    sock.sendall(head.encode() + payload)
    return sock


def send_queue(server_port: int, client_port: int) -> int | None:
    """Bytes the server's end of a loopback connection holds unsent in the kernel."""
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = int(fields[1].split(":")[1], 16), int(fields[2].split(":")[1], 16)
        if (local, remote) == (server_port, client_port):
            return int(fields[4].split(":")[0], 16)
    return None


def read_all(sock: socket.socket) -> bytes:
    sock.settimeout(300)
    parts = []
    while chunk := sock.recv(1 << 16):
        parts.append(chunk)
    sock.close()
    return b"".join(parts)


async def measure(server: ServerProcess, seconds: float) -> dict[str, Any]:
    model = await first_model(server.base_url)
    url = server.base_url + "/v1/chat/completions"
    alone = await phase(url, model, seconds)
    max_tokens = STALLED_TOKENS
    doc = stream_body(model, "Tell a very long story.", max_tokens)
    sock = await asyncio.to_thread(stalled_request, server.port, doc)
    rss: list[float | None] = []

    async def sample() -> None:
        while True:
            rss.append(rss_mb(server.pid))
            await asyncio.sleep(2.0)

    sampler = asyncio.create_task(sample())
    beside = await phase(url, model, seconds)
    sampler.cancel()
    unsent = send_queue(server.port, sock.getsockname()[1])
    raw = await asyncio.to_thread(read_all, sock)
    usage = _USAGE.findall(raw)
    kept = [x for x in rss if x is not None]
    growth = max(kept) - kept[0] if kept else float("inf")
    checks = {
        "stalled_stream_complete": b"data: [DONE]" in raw and bool(usage),
        "frontend_rss_bounded": growth < BOUND_MB,
    }
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": seconds,
        "streams": STREAMS,
        "alone": alone,
        "beside_stalled": beside,
        "stalled": {
            "completion_tokens": int(usage[-1]) if usage else None,
            "max_tokens": max_tokens,
            "body_bytes": len(raw),
            "kernel_send_queue_at_end_of_stall": unsent,
        },
        "frontend_rss_mb": {"first": kept[0] if kept else None, "max": max(kept, default=None)},
        "frontend_rss_growth_mb": growth,
        "checks": checks,
        "passed": all(checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.slow_reader", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "slow_reader.json")
    args = p.parse_args(argv)
    with tl_serve(args.out.parent / "slow_reader", "tl-serve slow reader") as server:
        doc = asyncio.run(measure(server, args.seconds))
    doc["command"] = (
        "NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.slow_reader "
        + " ".join(argv if argv is not None else sys.argv[1:])
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    a, b, s = doc["alone"], doc["beside_stalled"], doc["stalled"]
    print(
        f"slow reader: {STREAMS} streams alone {a['tok_s']:.1f} tok/s (ITL p50 {a['itl_p50_ms']:.0f} ms), "
        f"beside a client not reading for {args.seconds:.0f} s {b['tok_s']:.1f} tok/s "
        f"(ITL p50 {b['itl_p50_ms']:.0f} ms)"
    )
    print(
        f"  stalled stream, read afterwards: {s['completion_tokens']} tokens, {s['body_bytes']} bytes "
        f"({s['kernel_send_queue_at_end_of_stall']} bytes in the kernel's send queue at the end of the stall); "
        f"frontend RSS {doc['frontend_rss_mb']['first']:.1f} -> max {doc['frontend_rss_mb']['max']:.1f} MiB"
    )
    print("\n".join(f"  check {k}: {'ok' if v else 'FAILED'}" for k, v in doc["checks"].items()))
    print(f"wrote {args.out}")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
