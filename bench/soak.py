"""A bounded soak: 64 streaming clients against a tl-serve it starts, a quarter cutting streams.

    NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.soak [--seconds 180]

Bundled model, default config, loopback. Each request is a unique prompt with 16-128 output
tokens (ignore_eos); one in four closes its connection after a random number of chunks. After
the load: /metrics must show no active sequence and no used KV block (polled up to 10 s), every
request not cut by its client must have completed with all its tokens or got a 429, and the
core must not have been respawned. RSS of the frontend and the core is sampled every 10 s,
compared between the end of a 30 s warm-up and the end. Writes bench/out/soak.json; exits 1
when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import random
import re
import sys
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.compare_report import write_results
from bench.load import first_model
from bench.load_sse import DONE, SSEDecoder, read_chunk
from bench.load_workload import words
from bench.server_process import ROOT, ServerProcess, tl_serve

WARMUP_S = 30.0
SAMPLE_EVERY_S = 10.0
SETTLE_S = 10.0
_GAUGE = re.compile(r"^(tl_engine_active_sequences|tl_engine_kv_blocks\{state=\"\w+\"\}) (\S+)$")
ACTIVE = "tl_engine_active_sequences"
USED = 'tl_engine_kv_blocks{state="used"}'
CACHED = 'tl_engine_kv_blocks{state="cached"}'


@dataclass(slots=True)
class Tally:
    """Outcomes of every request, and a few examples of unexpected ones."""

    outcomes: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    tokens: int = 0

    def add(self, outcome: str, detail: str = "") -> None:
        self.outcomes[outcome] += 1
        if outcome not in ("completed", "disconnected", "429") and len(self.examples) < 10:
            self.examples.append(f"{outcome}: {detail}"[:300])


def stream_body(model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """A streamed greedy chat request for exactly max_tokens tokens (ignore_eos), with usage."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def attempt(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], cut_after: int | None = None
) -> tuple[str, str, int]:
    """one_request; the session's timeout passing is a "hang", a client error a "connection"."""
    try:
        return await one_request(session, url, body, cut_after)
    except TimeoutError:
        return "hang", "no end within the session's timeout", 0
    except aiohttp.ClientError as exc:
        return "connection", f"{type(exc).__name__}: {exc}", 0


async def one_request(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any], cut_after: int | None
) -> tuple[str, str, int]:
    """(outcome, detail, content chunks): cut_after = close the connection after that many chunks."""
    chunks = 0
    async with session.post(url, json=body) as resp:
        if resp.status != 200:
            return str(resp.status), (await resp.text())[:200], 0
        if cut_after == 0:
            resp.close()
            return "disconnected", "", 0
        decoder, done, usage = SSEDecoder(), False, None
        async for data in resp.content.iter_any():
            for event in decoder.feed(data):
                if event == DONE:
                    done = True
                    continue
                info = read_chunk(event)
                if info.error is not None:
                    return "stream_error", info.error, chunks
                usage = info.usage or usage
                chunks += bool(info.text)
                if cut_after is not None and chunks >= cut_after:
                    resp.close()  # drops the connection, not back to the pool
                    return "disconnected", "", chunks
    if not done:
        return "incomplete", "no [DONE]", chunks
    if usage is None or usage[1] != body["max_tokens"]:
        return "short", f"usage {usage}, max_tokens {body['max_tokens']}", chunks
    return "completed", "", usage[1]


async def client(
    index: int, url: str, model: str, stop_at: float, cut_share: float, tally: Tally
) -> None:
    """One closed-loop client: a new request as soon as the last one ended, until stop_at."""
    rng = random.Random(index)
    timeout = aiohttp.ClientTimeout(total=300)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            max_tokens = rng.randint(16, 128)
            prompt = f"Soak {index}.{n}: {words(rng, rng.randint(32, 64))}"
            body = stream_body(model, prompt, max_tokens)
            cut = rng.randint(0, max_tokens - 1) if rng.random() < cut_share else None
            outcome, detail, tokens = await attempt(session, url, body, cut)
            tally.add(outcome, detail)
            tally.tokens += tokens if outcome == "completed" else 0
            if outcome == "429":
                await asyncio.sleep(1.0)  # Retry-After: 1


def rss_mb(pid: int) -> float | None:
    """VmRSS of a process in MiB, None once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def gauges(health_url: str) -> dict[str, float]:
    with urllib.request.urlopen(health_url + "/metrics", timeout=5) as resp:
        text = resp.read().decode()
    return {m[1]: float(m[2]) for line in text.splitlines() if (m := _GAUGE.match(line))}


def settled(health_url: str) -> dict[str, float]:
    """The gauges once active sequences and used blocks are 0, or as they are after SETTLE_S."""
    deadline = time.monotonic() + SETTLE_S
    while True:
        values = gauges(health_url)
        if (values.get(ACTIVE) == 0 and values.get(USED) == 0) or time.monotonic() > deadline:
            return values
        time.sleep(0.25)


async def soak(
    server: ServerProcess, seconds: float, clients: int, cut_share: float
) -> dict[str, Any]:
    """Run the load while sampling RSS; the figures and the checks."""
    model = await first_model(server.base_url)
    cores = server.children()
    assert len(cores) == 1, f"expected one engine core child, found {cores}"
    pids = {"frontend": server.pid, "core": cores[0]}
    tally = Tally()
    t0 = time.monotonic()
    url = server.base_url + "/v1/chat/completions"
    load = asyncio.gather(
        *(client(i, url, model, t0 + seconds, cut_share, tally) for i in range(clients))
    )
    samples: list[dict[str, Any]] = []
    while not load.done():
        rss = {name: rss_mb(pid) for name, pid in pids.items()}
        cached = (await asyncio.to_thread(gauges, server.health_url)).get(CACHED)
        samples.append({"t": round(time.monotonic() - t0, 1), **rss, "kv_cached": cached})
        await asyncio.wait([load], timeout=SAMPLE_EVERY_S)
    await load
    load_s = time.monotonic() - t0
    after = await asyncio.to_thread(settled, server.health_url)
    end = {name: rss_mb(pid) for name, pid in pids.items()}
    warm = next((s for s in samples if s["t"] >= WARMUP_S), samples[-1])
    unexpected = {
        k: v for k, v in tally.outcomes.items() if k not in ("completed", "disconnected", "429")
    }
    checks = {
        "active_sequences_0": after.get(ACTIVE) == 0,
        "kv_blocks_used_0": after.get(USED) == 0,
        "every_request_completed_or_429": not unexpected,
        "core_not_respawned": server.children() == [pids["core"]],
    }
    growth = {
        name: {
            "warm_mb": warm[name],
            "end_mb": end[name],
            "growth_mb": None if end[name] is None else end[name] - warm[name],
            "growth_pct": None if end[name] is None else 100 * (end[name] / warm[name] - 1),
        }
        for name in pids
    }
    total = sum(tally.outcomes.values())
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": seconds,
        "load_s": load_s,
        "clients": clients,
        "cut_share": cut_share,
        "requests": total,
        "outcomes": dict(tally.outcomes),
        "unexpected_examples": tally.examples,
        "completed_tokens": tally.tokens,
        "completed_tokens_per_s": tally.tokens / load_s,
        "metrics_after": after,
        "rss": growth,
        "rss_samples": samples,
        "warmup_sample_t": warm["t"],
        "checks": checks,
        "passed": all(checks.values()),
    }


def report(doc: dict[str, Any]) -> str:
    o = doc["outcomes"]
    lines = [
        f"soak: {doc['clients']} clients for {doc['load_s']:.0f} s, {doc['requests']} requests: "
        f"completed {o.get('completed', 0)}, disconnected by the client {o.get('disconnected', 0)}, "
        f"429 {o.get('429', 0)}, other {sum(v for k, v in o.items() if k not in ('completed', 'disconnected', '429'))}",
        f"  completed tokens {doc['completed_tokens']} ({doc['completed_tokens_per_s']:.1f} tok/s)",
        f"  /metrics after: {doc['metrics_after']}",
    ]
    for name, r in doc["rss"].items():
        lines.append(
            f"  RSS {name}: {r['warm_mb']:.1f} MiB at t={doc['warmup_sample_t']:.0f} s -> "
            f"{r['end_mb']:.1f} MiB at the end ({r['growth_mb']:+.1f} MiB, {r['growth_pct']:+.1f}%)"
        )
    lines += [f"  check {k}: {'ok' if v else 'FAILED'}" for k, v in doc["checks"].items()]
    lines += [f"  unexpected: {e}" for e in doc["unexpected_examples"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--cut-share", type=float, default=0.25, help="share of requests cut mid-stream")
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "soak.json")
    args = p.parse_args(argv)
    if args.seconds < WARMUP_S + SAMPLE_EVERY_S:
        p.error(f"--seconds must be at least {WARMUP_S + SAMPLE_EVERY_S:g}")
    with tl_serve(args.out.parent / "soak", "tl-serve soak") as server:
        doc = asyncio.run(soak(server, args.seconds, args.clients, args.cut_share))
    doc["command"] = "NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.soak " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(report(doc))
    print(f"wrote {args.out}")
    write_results(ROOT / "bench" / "RESULTS.md", None, None, doc)  # its soak section only
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
