"""llama.cpp's own benchmarks on a GGUF, printed beside bench.model's and bench.engine's lines.

`llama-bench` (pp512: one 512-token prompt; tg128: 128 tokens generated one at a time) is the
twin of bench.model's prefill 512 and decode B=1; `llama-batched-bench` (B sequences, each a
prompt then tokens generated together) is the twin of bench.engine's concurrency levels. Both
run from the `python -m bench.llamacpp build` of this host, on 2 threads; without a build each
prints one line saying how to make it.
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path
from typing import Any

from bench import llamacpp

THREADS = 2


def _run(argv: list[str], timeout_s: float) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"{shlex.join(argv)} failed ({done.returncode}): {tail}")
    return done.stdout


def llama_bench(
    build: llamacpp.Build, model: Path, repetitions: int
) -> tuple[list[str], list[dict[str, Any]]]:
    """(command, one record per test: n_prompt, n_gen, avg_ts, stddev_ts, ...) of pp512 + tg128."""
    argv = [str(build.bin("llama-bench")), "-m", str(model), "-p", "512", "-n", "128",
            "-t", str(THREADS), "-r", str(repetitions), "-o", "json"]  # fmt: skip
    tests: list[dict[str, Any]] = json.loads(_run(argv, 1800))
    return argv, tests


def batched_context(prompt_len: int, gen_len: int, batches: list[int]) -> int:
    """-c for llama-batched-bench: every sequence's share of it is padded to 256 tokens."""
    return max(batches) * (-(-(prompt_len + gen_len) // 256) * 256)


def batched_bench(
    build: llamacpp.Build, model: Path, prompt_len: int, gen_len: int, batches: list[int]
) -> tuple[list[str], list[dict[str, Any]]]:
    """(command, one record per B: pl, t_pp, speed_pp, t_tg, speed_tg, t, speed)."""
    argv = [str(build.bin("llama-batched-bench")), "-m", str(model),
            "-c", str(batched_context(prompt_len, gen_len, batches)), "-npp", str(prompt_len), "-ntg", str(gen_len),
            "-npl", ",".join(map(str, batches)), "-t", str(THREADS), "-tb", str(THREADS),
            "--output-format", "jsonl"]  # fmt: skip
    out = _run(argv, 3600)
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return argv, rows


def _version(build: llamacpp.Build) -> str:
    return f"llama.cpp {build.manifest['version']} ({build.manifest['isa_tag']})"


def llama_bench_lines(model: Path, repetitions: int) -> list[str]:
    """bench.model's twin lines: llama-bench pp512 and tg128 on `model`."""
    build = llamacpp.find()
    if build is None:
        return [f"llama-bench: no llama.cpp build here; {llamacpp.how_to_build()}"]
    try:
        argv, tests = llama_bench(build, model, repetitions)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return [f"llama-bench: {e}"]
    return [*format_llama_bench(tests, repetitions, _version(build)), f"  $ {shlex.join(argv)}"]


def format_llama_bench(tests: list[dict[str, Any]], repetitions: int, version: str) -> list[str]:
    lines = []
    for t in tests:
        name = f"pp{t['n_prompt']}" if t["n_gen"] == 0 else f"tg{t['n_gen']}"
        lines.append(
            f"{'llama-bench ' + name:<28} {t['avg_ts']:8.1f} tok/s (sd {t['stddev_ts']:.1f} over "
            f"{repetitions} runs, {version})"
        )
    return lines


def batched_bench_lines(
    model: Path, prompt_len: int, gen_len: int, batches: list[int]
) -> list[str]:
    """bench.engine's twin lines: llama-batched-bench at each B on `model`."""
    build = llamacpp.find()
    if build is None:
        return [f"llama-batched-bench: no llama.cpp build here; {llamacpp.how_to_build()}"]
    try:
        argv, rows = batched_bench(build, model, prompt_len, gen_len, batches)
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return [f"llama-batched-bench: {e}"]
    head = (
        f"llama-batched-bench, {prompt_len}-token prompts, {gen_len} generated ({_version(build)}):"
    )
    return [head, *format_batched(rows), f"  $ {shlex.join(argv)}"]


def format_batched(rows: list[dict[str, Any]]) -> list[str]:
    """Per B: output tokens over the whole time (prompts included), then its two phases."""
    lines = []
    for r in rows:
        out_tok_s = r["pl"] * r["tg"] / r["t"]
        lines.append(
            f"  B={r['pl']:3d}: {out_tok_s:7.1f} tok/s   (output tokens / whole time; prompts "
            f"{r['speed_pp']:.1f} tok/s, generation alone {r['speed_tg']:.1f} tok/s)"
        )
    return lines
