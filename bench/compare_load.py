"""bench.compare's load: tl-bench runs against one started server, on a quiet machine.

Before each server start bench.compare waits for a 1-minute load average below a threshold,
and before each level for the other processes to go quiet; during each level it measures the
CPU of the server's processes, of tl-bench and of everything else (a disturbed level shows).
"""

from __future__ import annotations

import argparse
import json
import resource
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from bench.server_process import ROOT, ServerProcess, busy_cpu_s, get_json, in_checkout, post_json

PY = str(ROOT / ".venv" / "bin" / "python")
INPUT_LEN = "32:64"  # words of the unique user prompt, about one token each
PREFIX_LEN = 1000
LONG_LEN = "1900:2100"  # words of a long-prompt request (~2,000-2,300 tokens with the template)
DISTURBED = 0.25  # cores used by other processes during a level that make it worth repeating


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_quiet(threshold: float, max_wait_s: float = 600.0) -> float:
    """Wait until the 1-minute load average is below threshold (or give up); return it."""
    deadline = time.monotonic() + max_wait_s
    while (load := loadavg()) >= threshold and time.monotonic() < deadline:
        time.sleep(5)
    return load


def warm_up(server: ServerProcess) -> None:
    """Two short requests, so no server pays a first-request cost inside a level."""
    model = get_json(server.base_url + "/v1/models")["data"][0]["id"]
    for i in range(2):
        body = {
            "model": model,
            "messages": [{"role": "user", "content": f"Warm-up {i}: name a colour."}],
            "max_tokens": 8,
            "temperature": 0,
        }
        post_json(server.base_url + "/v1/chat/completions", body)


def wait_others_idle(server: ServerProcess, limit: float, max_wait_s: float = 600.0) -> float:
    """Wait until processes other than the (idle) server use under `limit` cores over 3 s."""
    deadline = time.monotonic() + max_wait_s
    while True:
        busy0, tree0 = busy_cpu_s(), server.tree_cpu_s()
        time.sleep(3.0)
        others = (busy_cpu_s() - busy0 - (server.tree_cpu_s() - tree0)) / 3.0
        if others < limit or time.monotonic() > deadline:
            return others


def tl_bench(
    server: ServerProcess, out: Path, args: argparse.Namespace, *flags: str, retries: int = 0
) -> dict[str, Any]:
    """One tl-bench invocation (its table goes to our stdout); the run's record for the report.

    A level during which other processes used more than DISTURBED cores is run again, up to
    `retries` times, with the next seed (new prompts of the same lengths: the same ones would
    find the servers' prompt caches warm), each attempt into its own file; the record is the
    least disturbed attempt's and says which attempt it was.
    """
    tries: list[dict[str, Any]] = []
    for attempt in range(retries + 1):
        path = out if attempt == 0 else out.with_name(f"{out.stem}-try{attempt + 1}.json")
        record = _measured(server, path, args, _reseeded(list(flags), attempt))
        tries.append(record | {"attempts": attempt + 1})
        if record["other_cores"] <= DISTURBED:
            break
        print(f"disturbed: other processes used {record['other_cores']:.2f} cores", flush=True)
    return min(tries, key=lambda r: float(r["other_cores"]))


# A round's seeds are this far from the previous round's (retries step by 1000: see _reseeded).
ROUND_SEEDS = 100_000


def _reseeded(flags: list[str], attempt: int) -> list[str]:
    if attempt and "--seed" in flags:
        i = flags.index("--seed") + 1
        flags[i] = str(int(flags[i]) + 1000 * attempt)
    return flags


def run_files(out: Path, argv: list[str]) -> dict[str, Any]:
    """A finished tl-bench run's file, command and report (read back from `out`) as the
    model's summary keeps them, paths relative to the checkout: the summary renders without
    bench/out/ (the machine's own), from any clone."""
    return {
        "json": in_checkout(str(out)),
        "command": in_checkout(shlex.join(argv)),
        "report": json.loads(out.read_text()),
    }


def _measured(
    server: ServerProcess, out: Path, args: argparse.Namespace, flags: list[str]
) -> dict[str, Any]:
    argv = [
        PY,
        "-m",
        "bench.load",
        "--base-url",
        server.base_url,
        "--max-seconds",
        f"{args.max_seconds:g}",
        "--request-timeout",
        f"{args.max_seconds:g}",
        "--label",
        server.label,
        "--out",
        str(out),
        "--no-plot",
        *flags,
    ]
    idle = wait_others_idle(server, args.wait_others)
    load = loadavg()
    print(f"\n$ {shlex.join(argv)}   (loadavg {load:.2f}, others {idle:.2f} cores)", flush=True)
    t0, busy0, tree0 = time.monotonic(), busy_cpu_s(), server.tree_cpu_s()
    ours0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(argv, check=True, cwd=ROOT)
    ours1 = resource.getrusage(resource.RUSAGE_CHILDREN)  # tl-bench's own CPU, once it exited
    client = ours1.ru_utime + ours1.ru_stime - ours0.ru_utime - ours0.ru_stime
    wall, server_cpu = time.monotonic() - t0, server.tree_cpu_s() - tree0
    other = max(0.0, busy_cpu_s() - busy0 - server_cpu - client)
    print(f"cpu: server {server_cpu / wall:.2f}, tl-bench {client / wall:.2f}, "
          f"other processes {other / wall:.2f} cores", flush=True)  # fmt: skip
    config = server.argv[server.argv.index("--config") + 1] if "--config" in server.argv else ""
    return {
        "label": server.label,
        "server_argv": [in_checkout(a) for a in server.argv],
        "server_config": Path(config).read_text() if config else "",
        **run_files(out, argv),
        "loadavg": load,
        "others_before": idle,
        "server_cores": server_cpu / wall,
        "client_cores": client / wall,
        "other_cores": other / wall,
    }


def levels_of(args: argparse.Namespace) -> list[tuple[int, int]]:
    """(concurrency, requests) of every level, in order."""
    return [(int(c), int(n)) for c, n in (spec.split(":") for spec in args.levels.split(","))]


def run_level(
    server: ServerProcess,
    args: argparse.Namespace,
    extra: dict[str, Any],
    out_dir: Path,
    level: tuple[int, int],
    round_: int | None = None,
) -> dict[str, Any]:
    """One level of the comparison load: the same prompts for every server (seed = concurrency,
    plus ROUND_SEEDS x (round - 1) in round `round_` of several, counted from 1)."""
    c, n = level
    seed = c + ROUND_SEEDS * (round_ - 1 if round_ else 0)
    flags = [
        "--concurrency", str(c),
        "--num-requests", str(n),
        "--input-len", INPUT_LEN,
        "--output-len", str(args.output_len),
        "--seed", str(seed),
    ]  # fmt: skip
    if extra:
        flags += ["--extra-body", json.dumps(extra)]
    suffix = f"-r{round_}" if round_ else ""
    out = out_dir / f"{server.label.replace(' ', '')}-c{c}{suffix}.json"
    run = tl_bench(server, out, args, *flags, retries=args.retry_disturbed)
    return run | {"concurrency": c} | ({"round": round_} if round_ else {})


def run_levels(
    server: ServerProcess, args: argparse.Namespace, extra: dict[str, Any], out_dir: Path
) -> list[dict[str, Any]]:
    """The comparison load at every level: same prompts per level (seed = concurrency) everywhere."""
    warm_up(server)
    return [run_level(server, args, extra, out_dir, level) for level in levels_of(args)]


def run_round(
    servers: tuple[ServerProcess, ServerProcess],
    args: argparse.Namespace,
    out_dir: Path,
    round_: int,
) -> list[dict[str, Any]]:
    """Round `round_` (from 1) of every level, each level run on both servers back to back
    (the one going first alternates by round) with that round's prompts: the two figures of a
    pair are minutes apart at most, where this host's speed moves in phases of minutes."""
    for server in servers:
        warm_up(server)
    order = servers if round_ % 2 else servers[::-1]
    runs = []
    for level in levels_of(args):
        runs += [run_level(server, args, {}, out_dir, level, round_) for server in order]
    return runs


def prefix_flags() -> list[str]:
    """The shared-prefix load: 16 requests at concurrency 1 then 16, one ~1000-token system
    prompt per level plus a unique 16-word question, 32 output tokens."""
    return [
        "--concurrency", "1,16",
        "--num-requests", "16",
        "--shared-prefix-len", str(PREFIX_LEN),
        "--input-len", "16",
        "--output-len", "32",
        "--seed", "100",
    ]  # fmt: skip


def long_flags() -> list[str]:
    """The long-prompt load: 4 requests at concurrency 1 then 4, each a unique prompt of
    LONG_LEN words, 128 output tokens."""
    return [
        "--concurrency", "1,4",
        "--num-requests", "4",
        "--input-len", LONG_LEN,
        "--output-len", "128",
        "--seed", "300",
    ]  # fmt: skip
