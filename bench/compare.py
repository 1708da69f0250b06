"""tl-serve against llama.cpp's llama-server on the same GGUF, one server at a time, on loopback.

    flock /tmp/tl-heavy.lock .venv/bin/python -m bench.compare [--model bundled] [--phases levels,overload,prefix,long]

Four phases, each runnable alone (`--phases`), every one a fresh start of each server:

- levels: the same tl-bench load (chat, streaming, 128 output tokens, temperature 0, a unique
  prompt per request) at concurrency 1, 4, 16 and 64 against tl-serve (in its default numerics;
  `--other-numerics int8,exact` adds a run per other mode, `--other-block-sizes 32` one per
  other KV block size, each with the same KV capacity in tokens), llama-server
  (`-t 2 -np 64 -c 64 x --ctx-per-slot`; tl-serve gets a KV cache of the same capacity in
  tokens) and, when its venv exists, llama-cpp-python's server. With `--rounds N`, each
  round starts tl-serve and llama-server afresh, both up, and runs each level on one then the
  other, with new prompts each round: a pair is minutes apart at most (this host's speed
  moves in phases of minutes), and the targets are judged on each level's median ratio;
- overload: 64 clients against 16 running requests (tl-serve: max_num_seqs 16, queue 8, 429
  beyond; llama-server: 16 slots, everything else queued);
- prefix: a shared ~1000-token system prompt, tl-serve's radix cache on and off, llama-server
  (16 slots, its prompt cache on as by default);
- long: unique ~2,000-token prompts at concurrency 1 and 4, tl-serve and llama-server (4 slots
  of 4096 tokens; tl-serve a KV cache of the same capacity), where a prompt's prefill, and
  attention over its context, weigh most.

`--model` takes a bench.models name (bundled, Q4_K_M, Q8_0, 360M, 1.7B, ...) or a GGUF path.
Each run writes its files under bench/out/compare/<model>/ (the machine's own); the model's
summary, every phase's runs with their reports, is bench/results-<model>.json, kept in the
repository beside RESULTS.md: a phase run replaces that phase only, so the model's section of
bench/RESULTS.md, rewritten with its plot from the summary, keeps the phases measured before,
on any machine. Needs `python -m bench.llamacpp build` (or `--llama-server PATH`). CI does
not run it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import llamacpp
from bench.compare_load import (
    PY,
    long_flags,
    prefix_flags,
    run_levels,
    run_round,
    tl_bench,
    wait_quiet,
    warm_up,
)
from bench.compare_overload import MAX_NUM_SEQS, TL_ENGINE, overload
from bench.compare_report import results_path_for, summary_path_for, write_results
from bench.isa import blas_as_told
from bench.models import catalogue, resolve
from bench.server_process import LLAMACPP_VENV, ROOT, llama_cpp_python, llama_server, tl_serve
from shared.config import EngineConfig

PHASES = ("levels", "overload", "prefix", "long")
SLOTS = 64  # llama-server's -np at the levels: a slot for every stream of the highest level
PREFIX_CTX = 2048  # per-slot context of the prefix phase: ~1000-token prompts and more
LONG_SLOTS, LONG_CTX = 4, 4096  # the long phase's llama-server: a slot per stream


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.compare", description=__doc__.split("\n")[0])
    p.add_argument("--model", default="bundled", help="a bench.models name or a GGUF path")
    p.add_argument("--phases", default=",".join(PHASES), help="any of " + ",".join(PHASES))
    p.add_argument("--levels", default="1:8,4:16,16:32,64:64", help="concurrency:requests, ...")
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--max-seconds", type=float, default=240.0, help="cap per level")
    p.add_argument("--llama-server", type=Path, help="default: the bench.llamacpp build's")
    p.add_argument("--ctx-per-slot", type=int, default=1024, help="llama-server -c = -np x this")
    p.add_argument("--no-llama-cpp-python", action="store_true")
    p.add_argument(
        "--other-numerics",
        default="",
        help="levels: tl-serve again in these numerics too (e.g. int8,exact), beside the default",
    )
    p.add_argument(
        "--other-block-sizes",
        default="",
        help="levels: tl-serve again with these KV block sizes too (e.g. 32), beside the default",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="levels: this many rounds, each starting tl-serve and llama-server afresh, both up, "
        "every level run on each back to back (new prompts each round); targets judged on the "
        "median round's ratio",
    )
    p.add_argument("--wait-load", type=float, default=0.7, help="1-min loadavg before a server")
    p.add_argument(
        "--wait-others", type=float, default=0.15, help="others' cores to wait for before a level"
    )
    p.add_argument(
        "--retry-disturbed", type=int, default=2, help="repeats of a level others disturbed"
    )
    p.add_argument("--out-dir", type=Path, default=ROOT / "bench" / "out" / "compare")
    p.add_argument("--results", type=Path, default=ROOT / "bench" / "RESULTS.md")
    p.add_argument(
        "--report-only",
        action="store_true",
        help="re-render from the summary (bench/results-<model>.json)",
    )
    args = p.parse_args(argv)
    unknown = set(args.phases.split(",")) - set(PHASES)
    if unknown:
        p.error(f"unknown phases {sorted(unknown)}; choose from {', '.join(PHASES)}")
    return args


def model_key(name: str, told: str | None = None) -> str:
    """The folder and section name of a model: its bench.models name, else the file's stem;
    `@avx2` after it when NUMBA_CPU_FEATURES (`told`) has both servers compiled for less than
    the host (bench/isa.py), a run that must not replace the host's own figures."""
    key = name if name in catalogue() else Path(name).stem
    return key if told is None else f"{key}@{compiled_as(told)}"


def compiled_as(told: str) -> str:
    """The llama.cpp build tag of the CPU an LLVM feature string makes of this host ('avx2')."""
    return llamacpp.isa_tag(llamacpp.host_options(told))


def told_prefix(told: str | None) -> str:
    """How a command line sets NUMBA_CPU_FEATURES: by bench.isa's name of it when it is one."""
    if told is None:
        return ""
    from llvmlite import binding as llvm

    from bench.isa import CEILINGS, ceiling_features

    host = dict(llvm.get_host_cpu_features())
    named = [c for c in CEILINGS if ceiling_features(host, c) == told]
    value = f"$(.venv/bin/python -m bench.isa {named[0]})" if named else shlex.quote(told)
    blas = os.environ.get("OPENBLAS_CORETYPE")
    return f"NUMBA_CPU_FEATURES={value} " + (f"OPENBLAS_CORETYPE={blas} " if blas else "")


def machine() -> dict[str, Any]:
    """CPU model, flags and core counts from /proc/cpuinfo; memory from /proc/meminfo."""
    info = llamacpp.cpuinfo_fields(Path("/proc/cpuinfo").read_text())
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    told = os.environ.get("NUMBA_CPU_FEATURES")
    # a proxy run (bench/isa.py): what the servers were compiled as, and OpenBLAS's kernels
    proxy = (
        {
            "compiled_as": compiled_as(told),
            "numba_cpu_features": told,
            "openblas_coretype": os.environ.get("OPENBLAS_CORETYPE", ""),
        }
        if told
        else {}
    )
    return {
        **proxy,
        "cpu": info.get("model name", "?"),
        "flags": info.get("flags", ""),
        "logical_cpus": Path("/proc/cpuinfo").read_text().count("processor\t:"),
        "cores_per_socket": info.get("cpu cores", "?"),
        "cache": info.get("cache size", "?"),
        "mem_gib": round(mem_kb / 2**20, 1),
    }


def versions(llama_python: Path | None, server_binary: Path) -> dict[str, str]:
    code = "import sys, numpy, numba; print(sys.version.split()[0], numpy.__version__, numba.__version__)"
    py, np_, nb = subprocess.check_output([PY, "-c", code], text=True).split()
    out = {"python": py, "numpy": np_, "numba": nb}
    server = subprocess.run([str(server_binary), "--version"], capture_output=True, text=True)
    out["llama-server"] = " ".join((server.stderr or server.stdout).split())
    build = llamacpp.find()
    if build is not None and server_binary == build.bin("llama-server"):
        out["llama.cpp"] = (
            f"{llamacpp.PACKAGE} {build.manifest['version']} ({build.manifest['isa_tag']})"
        )
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


def llamacpp_python() -> Path | None:
    """llama-cpp-python's venv interpreter when it can import the server (never built here)."""
    python = LLAMACPP_VENV / "bin" / "python"
    probe = [str(python), "-c", "import llama_cpp.server"]
    if python.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return python
    return None


def levels_phase(args: argparse.Namespace, model: Path, out: Path, binary: Path) -> dict[str, Any]:
    """Every server at every level, one server at a time (with --rounds, tl-serve and
    llama-server taking turns level by level)."""
    tokens = SLOTS * args.ctx_per_slot  # llama-server's KV capacity: tl-serve's too
    blocks = -(-tokens // EngineConfig().block_size)
    runs: list[dict[str, Any]] = []
    anchor = f"llama-server -np {SLOTS}"
    paired = args.rounds > 1
    for r in range(1, args.rounds + 1):  # one round unless paired
        wait_quiet(args.wait_load)
        tl = tl_serve(out, "tl-serve", model_dir=str(model), num_kv_blocks=blocks)
        with contextlib.ExitStack() as stack:
            try:
                server = stack.enter_context(tl)
            except RuntimeError as e:  # it refuses the model (a weight type it does not serve)
                log = tl.log_path.read_text(errors="replace").strip().splitlines()[-3:]
                runs.append({"label": tl.label, "error": f"{e}; its log ends: {' | '.join(log)}"})
                paired = paired and r > 1  # refused at once: llama-server still runs alone
                break
            if paired:  # both fresh each round; the levels alternate between the two
                other = stack.enter_context(
                    llama_server(binary, out, model, SLOTS, args.ctx_per_slot, label=anchor)
                )
                runs += run_round((server, other), args, out, r)
            else:
                runs += run_levels(server, args, {}, out)
    others = [("numerics", n, blocks) for n in filter(None, args.other_numerics.split(","))]
    others += [
        ("block_size", int(b), -(-tokens // int(b)))
        for b in filter(None, args.other_block_sizes.split(","))
    ]
    for key, value, n_blocks in others:
        wait_quiet(args.wait_load)
        label = f"tl-serve {key}={value}"
        with tl_serve(
            out, label, model_dir=str(model), num_kv_blocks=n_blocks, **{key: value}
        ) as server:
            runs += run_levels(server, args, {}, out)
    if not paired:
        wait_quiet(args.wait_load)
        with llama_server(binary, out, model, SLOTS, args.ctx_per_slot, label=anchor) as server:
            runs += run_levels(server, args, {}, out)
    python = None if args.no_llama_cpp_python else llamacpp_python()
    if python is not None:
        wait_quiet(args.wait_load)
        with llama_cpp_python(out, model) as server:
            runs += run_levels(server, args, {"min_tokens": args.output_len}, out)
    return {"runs": runs, "kv_tokens": tokens, "tl_kv_blocks": blocks}


def overload_phase(
    args: argparse.Namespace, model: Path, out: Path, binary: Path
) -> dict[str, Any]:
    """The same 64 clients against tl-serve's bounded admission and llama-server's 16 slots."""
    load = wait_quiet(args.wait_load)
    with tl_serve(out, "tl-serve overload", model_dir=str(model), **TL_ENGINE) as server:
        results = [asyncio.run(overload(server, load)) | {"engine": TL_ENGINE}]
    load = wait_quiet(args.wait_load)
    label = f"llama-server -np {MAX_NUM_SEQS}"
    with llama_server(binary, out, model, MAX_NUM_SEQS, args.ctx_per_slot, label=label) as server:
        results.append(asyncio.run(overload(server, load)))
    return {"results": results}


def prefix_phase(args: argparse.Namespace, model: Path, out: Path, binary: Path) -> dict[str, Any]:
    """Shared ~1000-token system prompt: tl-serve's radix cache on and off, and llama-server."""
    runs = []
    for mode in ("radix", "none"):
        wait_quiet(args.wait_load)
        label = f"tl-serve prefix_cache={mode}"
        with tl_serve(out, label, model_dir=str(model), prefix_cache=mode) as server:
            runs.append(tl_bench(server, out / f"prefix-{mode}.json", args, *prefix_flags()))
    wait_quiet(args.wait_load)
    ctx, label = max(args.ctx_per_slot, PREFIX_CTX), f"llama-server -np {MAX_NUM_SEQS}"
    with llama_server(binary, out, model, MAX_NUM_SEQS, ctx, label=label) as server:
        runs.append(tl_bench(server, out / "prefix-llama-server.json", args, *prefix_flags()))
    return {"runs": runs}


def long_phase(args: argparse.Namespace, model: Path, out: Path, binary: Path) -> dict[str, Any]:
    """Unique ~2,000-token prompts at 1 and 4 streams: tl-serve, then llama-server."""
    tokens = LONG_SLOTS * LONG_CTX
    runs = []
    wait_quiet(args.wait_load)
    blocks = -(-tokens // EngineConfig().block_size)
    with tl_serve(out, "tl-serve", model_dir=str(model), num_kv_blocks=blocks) as server:
        warm_up(server)
        runs.append(tl_bench(server, out / "long-tl-serve.json", args, *long_flags(),
                             retries=args.retry_disturbed))  # fmt: skip
    wait_quiet(args.wait_load)
    label = f"llama-server -np {LONG_SLOTS}"
    with llama_server(binary, out, model, LONG_SLOTS, LONG_CTX, label=label) as server:
        warm_up(server)
        runs.append(tl_bench(server, out / "long-llama-server.json", args, *long_flags(),
                             retries=args.retry_disturbed))  # fmt: skip
    return {"runs": runs, "kv_tokens": tokens}


def measure(
    args: argparse.Namespace, argv: list[str], model: Path, out: Path, path: Path
) -> dict[str, Any]:
    """The requested phases, merged into the model's summary at `path` (other phases kept)."""
    binary = args.llama_server
    if binary is None:
        build = llamacpp.find()
        if build is None:
            sys.exit(f"no llama-server: {llamacpp.how_to_build()}, or pass --llama-server PATH")
        binary = build.bin("llama-server")
    out.mkdir(parents=True, exist_ok=True)
    summary = json.loads(path.read_text()) if path.exists() else {}
    if summary.get("model") != str(model):
        summary = {"model": str(model), "phases": {}}
    run_phase = {
        "levels": levels_phase,
        "overload": overload_phase,
        "prefix": prefix_phase,
        "long": long_phase,
    }
    for phase in args.phases.split(","):
        started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        record = run_phase[phase](args, model, out, binary)
        summary["phases"][phase] = record | {
            "command": told_prefix(os.environ.get("NUMBA_CPU_FEATURES"))
            + "NUMBA_CACHE_DIR=.cache/numba .venv/bin/python -m bench.compare "
            + shlex.join(argv),
            "date": started,
            "finished": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "machine": machine(),
            "versions": versions(None if args.no_llama_cpp_python else llamacpp_python(), binary),
        }
        path.write_text(json.dumps(summary, indent=2) + "\n")  # a finished phase is kept
    return summary


def main(argv: list[str] | None = None) -> int:
    raw = sys.argv[1:] if argv is None else argv
    args = parse_args(raw)
    if importlib.util.find_spec("matplotlib") is None:  # the report's plot; fail before measuring
        sys.exit("bench.compare needs matplotlib for its plot: .venv/bin/pip install -e '.[bench]'")
    key = model_key(args.model, os.environ.get("NUMBA_CPU_FEATURES"))
    if not args.report_only:
        blas_as_told()
    path = summary_path_for(args.results, key)
    if args.report_only:
        summary = json.loads(path.read_text())
    else:
        summary = measure(args, raw, resolve(args.model), args.out_dir / key, path)
    soak_json = args.out_dir.parent / "soak.json"
    soak = json.loads(soak_json.read_text()) if soak_json.exists() else None
    write_results(args.results, key, summary, soak)
    print(f"wrote {args.results} and {results_path_for(args.results, key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
