"""A bounded chaos run: streaming clients against `frontend --workers 2` while the engine core is
SIGKILLed and a worker too, at random moments.

    NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.chaos [--seconds 180] [--seed 1]

Bundled model, default config, loopback. 48 closed-loop clients stream unique prompts with
16-128 output tokens (ignore_eos). The core is killed 3 times and worker 1 twice, at random
moments at least 12 s apart (each kill comes at least 10 s after the last one's recovery).
Checks: every request completed, got a 429, or failed (an error event, an HTTP error, a cut
connection) within 3 s of a kill, or was refused at once while the core was down; none
lasted beyond the hang limit; afterwards /metrics shows 0 active sequences and 0 used KV blocks; worker 0's
RSS is flat from the end of the warm-up to the end, and so is the last core's from 20 s after
its start; after the SIGTERM, no process of the run and no socket file is left. Writes
bench/out/chaos.json; exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import datetime
import itertools
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp

from bench.load import first_model
from bench.load_workload import words
from bench.server_process import ROOT, ServerProcess, http_status, tl_serve
from bench.soak import ACTIVE, USED, attempt, rss_mb, settled, stream_body

KILL_WINDOW_S = 3.0  # a request cut by a kill must end within this
HANG_S = 120.0  # no request may take longer (the longest needs well under a minute)
MIN_GAP_S = 12.0
MIN_UP_S = (
    10.0  # a kill comes at least this long after the last one's recovery: it cuts a loaded core
)
SAMPLE_EVERY_S = 5.0
WARMUP_S = 30.0
CORE_SETTLE_S = 20.0  # a respawned core's RSS is judged from this long after it starts
FLAT_MB, FLAT_PCT = 16.0, 5.0  # RSS growth within either bound counts as flat


def cmdline(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def child_pids(server: ServerProcess, marker: str) -> list[int]:
    """The live (not zombie) children of the server whose command line holds `marker`."""
    return [
        pid
        for pid in server.children()
        if any(marker in arg for arg in cmdline(pid)) and not zombie(pid)
    ]


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def run_processes(marker: str) -> list[int]:
    """Every live process whose command line holds `marker` (the run's config path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            pid = int(entry.name)
            if any(marker in arg for arg in cmdline(pid)) and not zombie(pid):
                found.append(pid)
    return found


def socket_files() -> set[str]:
    """The ipc sockets and worker health directories tl-serve keeps in the temp dir."""
    tmp = Path(tempfile.gettempdir())
    found = {str(p) for p in tmp.glob("tl-serve-workers-*")}
    found |= {str(p) for p in tmp.glob(f"tl-serve-{os.getuid()}/*.sock")}
    return found


@dataclass(slots=True)
class Record:
    t0: float
    t1: float
    outcome: str
    detail: str


@dataclass(slots=True)
class Kill:
    t: float
    what: str  # core | worker
    pid: int
    recovered: float | None = None  # when /readyz (core) or a new worker pid was seen


@dataclass(slots=True)
class Run:
    records: list[Record] = field(default_factory=list)
    kills: list[Kill] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)


async def client(index: int, url: str, model: str, stop_at: float, t0: float, run: Run) -> None:
    rng = random.Random(1000 + index)
    timeout = aiohttp.ClientTimeout(total=HANG_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        n = 0
        while time.monotonic() < stop_at:
            n += 1
            prompt = f"Chaos {index}.{n}: {words(rng, 48)}"
            body = stream_body(model, prompt, rng.randint(16, 128))
            start = time.monotonic()
            outcome, detail, _ = await attempt(session, url, body)
            end = time.monotonic()
            run.records.append(Record(start - t0, end - t0, outcome, detail[:200]))
            if outcome != "completed":
                await asyncio.sleep(1.0)  # Retry-After: 1, and no busy loop on a dead port


def kill_plan(rng: random.Random, seconds: float) -> list[tuple[float, str]]:
    """3 core kills and 2 worker kills at random times, MIN_GAP_S apart, none in the warm-up
    and none in the last 40 s (the last core's memory needs a stretch of its own)."""
    while True:
        times = sorted(rng.uniform(WARMUP_S * 0.7, seconds - 40) for _ in range(5))
        if all(b - a >= MIN_GAP_S for a, b in itertools.pairwise(times)):
            kinds = ["core"] * 3 + ["worker"] * 2
            rng.shuffle(kinds)
            return list(zip(times, kinds, strict=True))


async def chaos(server: ServerProcess, t0: float, plan: list[tuple[float, str]], run: Run) -> None:
    for at, what in plan:
        back = max((k.recovered or 0.0 for k in run.kills), default=0.0)
        await asyncio.sleep(max(0.0, t0 + max(at, back + MIN_UP_S) - time.monotonic()))
        marker = "enginecore" if what == "core" else "--worker"
        while (
            not (pids := child_pids(server, marker))
            or http_status(server.health_url + "/readyz") != 200
        ):
            await asyncio.sleep(0.2)  # the last kill's recovery is not over yet
        kill = Kill(time.monotonic() - t0, what, pids[0])
        os.kill(kill.pid, signal.SIGKILL)
        run.kills.append(kill)
        while True:
            await asyncio.sleep(0.1)
            fresh = [p for p in child_pids(server, marker) if p != kill.pid]
            ready = http_status(server.health_url + "/readyz") == 200
            if fresh and (what == "worker" or ready):
                kill.recovered = time.monotonic() - t0
                break


async def sample(server: ServerProcess, t0: float, until: asyncio.Future[Any], run: Run) -> None:
    while not until.done():
        core = child_pids(server, "enginecore")
        worker = child_pids(server, "--worker")
        run.samples.append(
            {
                "t": round(time.monotonic() - t0, 1),
                "worker0": rss_mb(server.pid),
                "worker1": rss_mb(worker[0]) if worker else None,
                "core": rss_mb(core[0]) if core else None,
                "core_pid": core[0] if core else None,
            }
        )
        await asyncio.wait([until], timeout=SAMPLE_EVERY_S)


EXPECTED = ("completed", "429", "ended at a kill", "refused while the core was down")


def judge(record: Record, kills: list[Kill]) -> str:
    """One of EXPECTED, or why not: a failure must come within KILL_WINDOW_S of a kill, or be
    an HTTP refusal answered at once while a killed core was not back yet."""
    if record.outcome in ("completed", "429"):
        return record.outcome
    if record.outcome in ("hang", "incomplete", "short"):
        return record.outcome
    if any(kill.t <= record.t1 <= kill.t + KILL_WINDOW_S for kill in kills):
        return "ended at a kill"
    refused_at_once = record.outcome.isdigit() and record.t1 - record.t0 <= KILL_WINDOW_S
    for kill in kills:
        back = kill.recovered if kill.recovered is not None else float("inf")
        if refused_at_once and kill.what == "core" and kill.t <= record.t1 <= back + KILL_WINDOW_S:
            return "refused while the core was down"
    return f"{record.outcome} away from any kill"


def flat(before: float | None, after: float | None) -> bool:
    if before is None or after is None:
        return False
    return after - before <= FLAT_MB or 100 * (after / before - 1) <= FLAT_PCT


def memory(run: Run, seconds: float) -> dict[str, Any]:
    s = run.samples
    warm = next((x for x in s if x["t"] >= WARMUP_S), s[-1])
    last_core = s[-1]["core_pid"]
    core_start = min((x["t"] for x in s if x["core_pid"] == last_core), default=0.0)
    core_warm = next(
        (x for x in s if x["core_pid"] == last_core and x["t"] >= core_start + CORE_SETTLE_S),
        s[-1],
    )
    return {
        "worker0": {"from_t": warm["t"], "from_mb": warm["worker0"], "end_mb": s[-1]["worker0"]},
        "core": {"from_t": core_warm["t"], "from_mb": core_warm["core"], "end_mb": s[-1]["core"]},
    }


async def load(server: ServerProcess, args: argparse.Namespace) -> dict[str, Any]:
    model = await first_model(server.base_url)
    run = Run()
    t0 = time.monotonic()
    plan = kill_plan(random.Random(args.seed), args.seconds)
    url = server.base_url + "/v1/chat/completions"
    clients = asyncio.gather(
        *(client(i, url, model, t0 + args.seconds, t0, run) for i in range(args.clients))
    )
    killer = asyncio.create_task(chaos(server, t0, plan, run))
    sampler = asyncio.create_task(sample(server, t0, clients, run))
    await clients
    await killer
    await sampler
    load_s = time.monotonic() - t0
    after = await asyncio.to_thread(settled, server.health_url)
    verdicts = [judge(r, run.kills) for r in run.records]
    bad = [(r, v) for r, v in zip(run.records, verdicts, strict=True) if v not in EXPECTED]
    mem = memory(run, args.seconds)
    outcomes: dict[str, int] = {}
    for r in run.records:
        outcomes[r.outcome] = outcomes.get(r.outcome, 0) + 1
    checks = {
        "five_kills": len(run.kills) == 5 and all(k.recovered for k in run.kills),
        "every_request_completed_or_failed_at_a_kill": not bad,
        "active_sequences_0": after.get(ACTIVE) == 0,
        "kv_blocks_used_0": after.get(USED) == 0,
        "worker0_rss_flat": flat(mem["worker0"]["from_mb"], mem["worker0"]["end_mb"]),
        "core_rss_flat": flat(mem["core"]["from_mb"], mem["core"]["end_mb"]),
    }
    return {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "seconds": args.seconds,
        "load_s": load_s,
        "clients": args.clients,
        "seed": args.seed,
        "requests": len(run.records),
        "outcomes": outcomes,
        "verdicts": dict(collections.Counter(verdicts)),
        "kills": [vars_of(k) for k in run.kills],
        "unexpected": [f"{v}: t {r.t0:.1f}-{r.t1:.1f} {r.detail}" for r, v in bad[:20]],
        "failure_delays_s": failure_delays(run),
        "metrics_after": after,
        "memory": mem,
        "rss_samples": run.samples,
        "checks": checks,
    }


def vars_of(kill: Kill) -> dict[str, Any]:
    return {"t": round(kill.t, 2), "what": kill.what, "pid": kill.pid, "recovered": kill.recovered}


def failure_delays(run: Run) -> dict[str, list[float]]:
    """Per kill, the requests in flight at it that failed before the next kill: how many, and
    the longest time from the kill to their end (s)."""
    out = {}
    for i, kill in enumerate(run.kills):
        until = run.kills[i + 1].t if i + 1 < len(run.kills) else float("inf")
        cut = [
            r.t1 - kill.t
            for r in run.records
            if r.t0 < kill.t <= r.t1 < until and r.outcome not in ("completed", "429")
        ]
        out[f"{i + 1}:{kill.what}@{kill.t:.0f}s"] = [len(cut), round(max(cut, default=0.0), 3)]
    return out


def report(doc: dict[str, Any]) -> str:
    lines = [
        f"chaos: {doc['clients']} clients, --workers 2, {doc['load_s']:.0f} s, "
        f"{doc['requests']} requests: {doc['outcomes']}",
        f"  judged: {doc['verdicts']}",
        "  kills: "
        + ", ".join(
            f"{k['what']} at {k['t']:.0f} s (back at {k['recovered']:.0f} s)" for k in doc["kills"]
        ),
        f"  requests cut by each kill, and the slowest one's end after it (s): "
        f"{doc['failure_delays_s']}",
        f"  /metrics after: {doc['metrics_after']}",
    ]
    for name, m in doc["memory"].items():
        lines.append(
            f"  RSS {name}: {m['from_mb']:.1f} MiB at t={m['from_t']:.0f} s -> {m['end_mb']:.1f} MiB"
        )
    lines += [f"  check {k}: {'ok' if v else 'FAILED'}" for k, v in doc["checks"].items()]
    lines += [f"  unexpected: {e}" for e in doc["unexpected"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.chaos", description=__doc__.split("\n")[0])
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--clients", type=int, default=48)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "chaos.json")
    args = p.parse_args(argv)
    if args.seconds < 5 * MIN_GAP_S + 60:
        p.error(f"--seconds must be at least {5 * MIN_GAP_S + 60:g}")
    sockets_before = socket_files()
    server = tl_serve(args.out.parent / "chaos", "tl-serve chaos")
    server.argv += ["--workers", "2"]
    config = server.argv[server.argv.index("--config") + 1]
    with server:
        doc = asyncio.run(load(server, args))
    time.sleep(1.0)  # the last children are reaped
    left = run_processes(config)
    doc["left_behind"] = {
        "processes": left,
        "socket_files": sorted(socket_files() - sockets_before),
    }
    doc["checks"]["nothing_left_behind"] = not left and not doc["left_behind"]["socket_files"]
    doc["checks"]["exit_0"] = server.proc is not None and server.proc.returncode == 0
    doc["passed"] = all(doc["checks"].values())
    doc["command"] = "NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.chaos " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(report(doc))
    print(f"  left behind: {doc['left_behind']}")
    print(f"wrote {args.out}")
    return 0 if doc["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
