"""tl-serve against llama.cpp servers on the same GGUF, one server at a time, on loopback.

    NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.compare [--llama-server PATH]

Runs the same tl-bench load (chat, streaming, 128 output tokens, temperature 0, a unique
prompt per request) against tl-serve, llama-cpp-python's server (its own venv in
.cache/llamacpp-venv, created when missing) and, when given, llama.cpp's llama-server; then
tl-serve's overload answer (429s from a small queue) and the shared-prefix TTFT with the radix
cache on and off. Writes bench/out/compare/ (JSON, logs), bench/results.png and
bench/RESULTS.md. Takes 10-20 minutes (waiting for a quiet machine included); CI does not run it.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import resource
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.compare_overload import overload
from bench.compare_report import render
from bench.server_process import (
    LLAMACPP_VENV,
    ROOT,
    ServerProcess,
    busy_cpu_s,
    get_json,
    llama_cpp_python,
    llama_server,
    post_json,
    tl_serve,
)

PY = str(ROOT / ".venv" / "bin" / "python")
INPUT_LEN = "32:64"  # words of the unique user prompt, about one token each
PREFIX_LEN = 1000


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    p.add_argument("--levels", default="1:8,16:32,64:64", help="concurrency:requests, ...")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-seconds", type=float, default=240.0, help="cap per level")
    p.add_argument("--llama-server", type=Path, help="llama.cpp's llama-server binary")
    p.add_argument("--llama-server-parallel", default="16,64", help="-np values to run")
    p.add_argument("--no-llama-cpp-python", action="store_true")
    p.add_argument("--wait-load", type=float, default=0.7, help="1-min loadavg before a server")
    p.add_argument(
        "--wait-others", type=float, default=0.15, help="others' cores to wait for before a level"
    )
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out" / "compare")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    p.add_argument("--plot", type=Path, default=ROOT / "bench" / "results.png")
    p.add_argument("--report-only", action="store_true", help="re-render from summary.json")
    return p.parse_args(argv)


def loadavg() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0])


def wait_quiet(threshold: float, max_wait_s: float = 600.0) -> float:
    """Wait until the 1-minute load average is below threshold (or give up); return it."""
    deadline = time.monotonic() + max_wait_s
    while (load := loadavg()) >= threshold and time.monotonic() < deadline:
        time.sleep(5)
    return load


def ensure_llamacpp_venv() -> Path:
    """The llama-cpp-python venv's interpreter; created with pip when it cannot import the server."""
    python = LLAMACPP_VENV / "bin" / "python"
    probe = [str(python), "-c", "import llama_cpp.server"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    subprocess.run([sys.executable, "-m", "venv", str(LLAMACPP_VENV)], check=True)
    pip = [str(python), "-m", "pip", "install", "llama-cpp-python[server]"]
    print("building llama-cpp-python (10+ minutes on 2 cores):", shlex.join(pip), flush=True)
    subprocess.run(pip, check=True)
    return python


def warm_up(server: ServerProcess) -> None:
    """Two short requests, so neither server pays a first-request cost inside a level."""
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
    server: ServerProcess, out: Path, args: argparse.Namespace, *flags: str
) -> dict[str, Any]:
    """One tl-bench invocation (its table goes to our stdout); the run's record for the report."""
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
    return {
        "label": server.label,
        "json": str(out),
        "command": shlex.join(argv),
        "loadavg": load,
        "others_before": idle,
        "server_cores": server_cpu / wall,
        "client_cores": client / wall,
        "other_cores": other / wall,
    }


def run_levels(
    server: ServerProcess, args: argparse.Namespace, extra: dict[str, Any]
) -> list[dict[str, Any]]:
    """The comparison load at every level: same prompts per level (seed = concurrency) everywhere."""
    warm_up(server)
    runs = []
    for spec in args.levels.split(","):
        c, n = (int(x) for x in spec.split(":"))
        name = server.label.replace(" ", "")
        flags = [
            "--concurrency", str(c),
            "--num-requests", str(n),
            "--input-len", INPUT_LEN,
            "--output-len", str(args.output_len),
            "--seed", str(c),
        ]  # fmt: skip
        if extra:
            flags += ["--extra-body", json.dumps(extra)]
        run = tl_bench(server, args.out_dir / f"{name}-c{c}.json", args, *flags)
        runs.append(run | {"concurrency": c})
    return runs


def prefix_runs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Shared ~1000-token system prompt: TTFT with the radix prefix cache on and off."""
    runs = []
    for mode in ("radix", "none"):
        wait_quiet(args.wait_load)
        with tl_serve(args.out_dir, f"tl-serve prefix_cache={mode}", prefix_cache=mode) as server:
            warm_up(server)
            flags = [
                "--concurrency", "1,16",
                "--num-requests", "16",
                "--shared-prefix-len", str(PREFIX_LEN),
                "--input-len", "16",
                "--output-len", "32",
                "--seed", "100",
            ]  # fmt: skip
            out = args.out_dir / f"prefix-{mode}.json"
            runs.append(tl_bench(server, out, args, *flags) | {"mode": mode})
    return runs


def machine() -> dict[str, Any]:
    """CPU model, flags and core counts from /proc/cpuinfo; memory from /proc/meminfo."""
    info: dict[str, str] = {}
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    return {
        "cpu": info.get("model name", "?"),
        "flags": info.get("flags", ""),
        "logical_cpus": Path("/proc/cpuinfo").read_text().count("processor\t:"),
        "cores_per_socket": info.get("cpu cores", "?"),
        "cache": info.get("cache size", "?"),
        "mem_gib": round(mem_kb / 2**20, 1),
    }


def versions(llama_python: Path | None) -> dict[str, str]:
    code = "import sys, numpy, numba; print(sys.version.split()[0], numpy.__version__, numba.__version__)"
    py, np_, nb = subprocess.check_output([PY, "-c", code], text=True).split()
    out = {"python": py, "numpy": np_, "numba": nb}
    if llama_python is not None:
        get = "import llama_cpp; print(llama_cpp.__version__)"
        out["llama-cpp-python"] = subprocess.check_output(
            [str(llama_python), "-c", get], text=True
        ).strip()
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    )
    out["tl-serve commit"] = commit.stdout.strip() or "?"
    return out


def measure(args: argparse.Namespace, argv: list[str]) -> dict[str, Any]:
    """Every phase, one server at a time; the summary the report is rendered from."""
    args.out_dir.mkdir(parents=True, exist_ok=True)
    llama_python = None if args.no_llama_cpp_python else ensure_llamacpp_venv()
    summary: dict[str, Any] = {
        "command": "NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.compare "
        + shlex.join(argv),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": machine(),
        "versions": versions(llama_python),
        "runs": [],
    }
    wait_quiet(args.wait_load)
    with tl_serve(args.out_dir) as server:
        summary["runs"] += run_levels(server, args, {})
    if llama_python is not None:
        wait_quiet(args.wait_load)
        with llama_cpp_python(args.out_dir) as server:
            summary["runs"] += run_levels(server, args, {"min_tokens": args.output_len})
    if args.llama_server is not None:
        for np_ in (int(x) for x in args.llama_server_parallel.split(",")):
            wait_quiet(args.wait_load)
            with llama_server(args.llama_server, args.out_dir, np_) as server:
                summary["runs"] += run_levels(server, args, {})
    summary["overload"] = asyncio.run(overload(args.out_dir, wait_quiet(args.wait_load)))
    summary["prefix"] = prefix_runs(args)
    summary["finished"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    (args.out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parse_args(raw)
    if args.report_only:
        summary = json.loads((args.out_dir / "summary.json").read_text())
    else:
        summary = measure(args, raw)
    soak_json = args.out_dir.parent / "soak.json"
    soak = json.loads(soak_json.read_text()) if soak_json.exists() else None
    args.results.write_text(render(summary, args.plot, args.results.parent, soak))
    print(f"wrote {args.results} and {args.plot}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
