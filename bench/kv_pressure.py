"""A KV pool too small for the load: 64 streaming clients with long prompts against a tl-serve
whose pool holds a fraction of what they need.

    NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.kv_pressure [--seconds 90]

Bundled model, loopback, `num_kv_blocks` 160 (5120 token slots; 64 sequences of 400-560 tokens
need about 1100 blocks). Each closed-loop client streams a unique prompt of about 400-480
tokens and asks 32-96 output tokens (ignore_eos). Checks: the scheduler preempted (the
preemption counter moved), every request completed with all its tokens or got a 429 or 503,
none lasted beyond the hang limit, /metrics shows 0 active sequences and 0 used blocks after,
the core was not respawned. Writes bench/out/kv_pressure.json; exits 1 when a check fails.
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
from pathlib import Path
from typing import Any

import aiohttp

from bench.load import first_model
from bench.load_workload import words
from bench.server_process import ROOT, ServerProcess, tl_serve
from bench.soak import ACTIVE, USED, attempt, settled, stream_body

HANG_S = 150.0  # no request may take longer
ACCEPTED = ("completed", "429", "503")
_PREEMPTIONS = re.compile(r"^tl_engine_preemptions_total (\S+)$", re.M)
_CODE = re.compile(r'"code":\s*"(\w+)"')


def preemptions(health_url: str) -> float:
    with urllib.request.urlopen(health_url + "/metrics", timeout=5) as resp:
        found = _PREEMPTIONS.search(resp.read().decode())
    return float(found[1]) if found else 0.0


async def client(
    index: int, url: str, model: str, stop_at: float, outcomes: Counter[str], examples: list[str]
) -> None:
    rng = random.Random(2000 + index)
    timeout = aiohttp.ClientTimeout(total=HANG_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            prompt = f"Pool {index}.{n}: {words(rng, rng.randint(400, 480))}"
            body = stream_body(model, prompt, rng.randint(32, 96))
            outcome, detail, _ = await attempt(session, url, body)
            code = _CODE.search(detail) if outcome in ("429", "503") else None
            outcomes[outcome if code is None else f"{outcome} {code[1]}"] += 1
            if outcome not in ACCEPTED and len(examples) < 10:
                examples.append(f"{outcome}: {detail}"[:300])
            if outcome in ("429", "503"):
                await asyncio.sleep(1.0)  # Retry-After: 1


async def pressure(server: ServerProcess, seconds: float, clients: int) -> dict[str, Any]:
    model = await first_model(server.base_url)
    cores = server.children()
    before = await asyncio.to_thread(preemptions, server.health_url)
    outcomes: Counter[str] = Counter()
    examples: list[str] = []
    t0 = time.monotonic()
    url = server.base_url + "/v1/chat/completions"
    await asyncio.gather(
        *(client(i, url, model, t0 + seconds, outcomes, examples) for i in range(clients))
    )
    load_s = time.monotonic() - t0
    after = await asyncio.to_thread(settled, server.health_url)
    preempted = await asyncio.to_thread(preemptions, server.health_url) - before
    checks = {
        "preempted": preempted > 0,
        "every_request_completed_or_429_or_503": all(o.split()[0] in ACCEPTED for o in outcomes),
        "active_sequences_0": after.get(ACTIVE) == 0,
        "kv_blocks_used_0": after.get(USED) == 0,
        "core_not_respawned": server.children() == cores,
    }
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": seconds,
        "load_s": load_s,
        "clients": clients,
        "requests": sum(outcomes.values()),
        "outcomes": dict(outcomes),
        "preemptions": preempted,
        "unexpected_examples": examples,
        "metrics_after": after,
        "checks": checks,
        "passed": all(checks.values()),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.kv_pressure", description=__doc__.split("\n")[0]
    )
    p.add_argument("--seconds", type=float, default=90.0)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--num-kv-blocks", type=int, default=160)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "kv_pressure.json")
    args = p.parse_args(argv)
    server = tl_serve(
        args.out.parent / "kv_pressure", "tl-serve kv", num_kv_blocks=args.num_kv_blocks
    )
    with server:
        doc = asyncio.run(pressure(server, args.seconds, args.clients))
    doc["num_kv_blocks"] = args.num_kv_blocks
    doc["command"] = (
        "NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.kv_pressure "
        + " ".join(argv if argv is not None else sys.argv[1:])
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(
        f"kv pressure: {doc['clients']} clients, {args.num_kv_blocks} KV blocks, "
        f"{doc['load_s']:.0f} s, {doc['requests']} requests: {doc['outcomes']}, "
        f"{doc['preemptions']:.0f} preemptions"
    )
    print(f"  /metrics after: {doc['metrics_after']}")
    print("\n".join(f"  check {k}: {'ok' if v else 'FAILED'}" for k, v in doc["checks"].items()))
    print("\n".join(f"  unexpected: {e}" for e in doc["unexpected_examples"]))
    print(f"wrote {args.out}")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
