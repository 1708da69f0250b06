"""Where a busy engine core spends its time: py-spy samples the core while it decodes; or the
Python -> numba calls of one forward step.

    python -m bench.profile [--concurrency 64] [--seconds 12]   (py-spy: pip install -e '.[bench]')
    python -m bench.profile --step [--rows 1 | --prefill 512] [--numerics int16] [--model PATH]
    python -m bench.profile --step --perf [--rows 16] [--seconds 12]   (needs Linux perf)

Starts a core on the bundled model (bench.engine.Core), keeps `concurrency` greedy requests of
128 tokens running, records the core with py-spy for `seconds`, and prints the share of samples
per source line, self and inclusive, for the core's own code.

`--step` runs decode steps of `rows` sequences (bench.model's contexts), or with `--prefill N`
steps that prefill an N-token prompt, in this process and prints the step time, every numba
kernel called from Python per step (calls, time per step and per call, found by wrapping the
kernel modules' dispatchers), the Python time between them, and what one call costs with no
work: numba's dispatch of a matmul's arguments, and a parallel region on top. An integer model
runs a layer as one numba call (kernels/layer.py); the same kernels are then timed once more
through the unfused pass, one call each, and their time split into matmuls, attention, RoPE
and the KV store, norms, activation and the embedding. `--step --perf` instead records the
process with `perf` for `seconds` of steps and prints the share of samples per jitted
function, a parallel region's body named after the kernel that starts it (bench/perfmap.py):
inside the one call of a fused layer, which the dispatcher wrappers cannot split.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numba
import numpy as np
from numba.core.registry import CPUDispatcher

from bench import perfmap
from bench.engine import Core, random_prompts
from bench.isa import blas_as_told
from bench.model import (
    BLOCK,
    DECODE_STEPS,
    FIRST_BLOCK,
    decode_batch,
    prefill_batch,
    runner_size,
)
from bench.models import resolve
from enginecore.kernels import attention, dense, dequant, gemm, layer, ops, panels
from enginecore.model_runner import ModelRunner
from enginecore.weights import PackedMatrix, Weights
from shared.config import BUNDLED_MODEL, EngineConfig
from shared.protocol import SamplingParams

KERNEL_MODULES = (attention, dense, dequant, gemm, layer, ops, panels)

# the part of a layer (or step) each kernel does, for the split of the unfused pass
PARTS = {
    "attention.paged_attention": "attention",
    "attention.chunk_attention": "attention",
    "attention.store_kv": "RoPE + KV store",
    "ops.rope": "RoPE + KV store",
    "ops.rope_parallel": "RoPE + KV store",
    "ops.rmsnorm": "norms",
    "ops.head_rmsnorm": "norms",
    "ops.add_rmsnorm": "norms",
    "ops.add_rmsnorm_parallel": "norms",
    "ops.add_inplace": "norms",
    "ops.silu_mul": "activation",
    "ops.silu_mul_parallel": "activation",
    "ops.gelu_mul": "activation",
    "ops.gelu_mul_parallel": "activation",
    "dequant.dequantize_rows": "embedding",
    "dense.gather": "embedding",
}


def summarize(raw: Path, top: int) -> None:
    own, inclusive, total = Counter[str](), Counter[str](), 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        frames, n = stack.split(";"), int(count)
        total += n
        own[frames[-1]] += n
        for frame in set(frames):
            inclusive[frame] += n
    print(f"{total} samples")
    print("self:")
    for frame, n in own.most_common(top):
        print(f"  {100 * n / total:5.1f}%  {frame}")
    print("inclusive (enginecore only):")
    for frame, n in inclusive.most_common():
        if "enginecore/" in frame and n / total >= 0.01:
            print(f"  {100 * n / total:5.1f}%  {frame}")


def per_call_us(fn: Callable[[], object], repeat: int = 2000) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts) * 1e6


@numba.njit(nogil=True)
def _no_work(x: Any, fmt: Any, out: Any, col0: int, n_rows: int, parts: int) -> int:
    return 0


@numba.njit(nogil=True, parallel=True)
def _empty_region(x: Any, fmt: Any, out: Any, col0: int, n_rows: int, parts: int) -> int:
    done = np.zeros(parts, np.int64)
    for p in numba.prange(parts):
        done[p] = 1
    return int(done.sum())


def count_kernels(run: Callable[[], float]) -> tuple[float, Counter[str], Counter[str]]:
    """run() (seconds per step) with every kernel dispatcher wrapped: (its result, calls per
    kernel, seconds per kernel), both over all steps."""
    calls, spent = Counter[str](), Counter[str]()
    saved: list[tuple[Any, str, Any]] = []

    def counting(name: str, fn: Any) -> Callable[..., Any]:
        def wrapper(*a: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*a)
            finally:
                spent[name] += time.perf_counter() - t
                calls[name] += 1

        return wrapper

    for mod in KERNEL_MODULES:
        for name, fn in list(vars(mod).items()):
            if isinstance(fn, CPUDispatcher):
                saved.append((mod, name, fn))
                setattr(mod, name, counting(f"{mod.__name__.rsplit('.', 1)[1]}.{name}", fn))
    try:
        wall = run()
    finally:
        for mod, name, fn in saved:
            setattr(mod, name, fn)
    return wall, calls, spent


def print_kernels(wall: float, calls: Counter[str], spent: Counter[str], steps: int) -> None:
    inside = sum(spent.values()) / steps
    print(f"with counting wrappers: {wall * 1e3:.3f} ms per step, "
          f"{sum(calls.values()) / steps:.0f} numba calls per step")  # fmt: skip
    for name, t in spent.most_common():
        print(f"  {name:<28} {calls[name] / steps:6.0f} calls  {t / steps * 1e3:7.3f} ms/step  "
              f"{t / calls[name] * 1e6:8.1f} us/call")  # fmt: skip
    print(f"  Python between the calls     {(wall - inside) * 1e3:7.3f} ms/step")


def print_split(wall: float, spent: Counter[str], steps: int) -> None:
    """The unfused step's time by part of the layer; every other kernel is a matmul's."""
    parts = Counter[str]()
    for name, t in spent.items():
        parts[PARTS.get(name, "matmuls (and lm_head)")] += t / steps
    parts["Python between the calls"] = wall - sum(parts.values())
    print(f"split of the unfused step ({wall * 1e3:.3f} ms):")
    for part, t in parts.most_common():
        print(f"  {part:<28} {t * 1e3:8.3f} ms  {100 * t / wall:5.1f}%")


def perf_profile(run_step: Callable[[int], None], seconds: int, top: int) -> None:
    """Record this process with perf while it runs steps; print the shares per function."""
    perf = shutil.which("perf")
    if perf is None:
        raise SystemExit("--perf needs Linux perf on PATH")
    named = perfmap.write_map()
    data = Path(tempfile.mkdtemp(prefix="tl-perf-")) / "perf.data"
    cmd = [perf, "record", "-F", "1999", "-p", str(os.getpid()), "-o", str(data), "--",
           "sleep", str(seconds)]  # fmt: skip
    recorder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    done = 0
    while recorder.poll() is None:
        run_step(done)
        done += 1
    try:
        got = perfmap.shares(data)
    finally:  # the recording and the map are read: nothing left behind in /tmp
        shutil.rmtree(data.parent)
        Path(f"/tmp/perf-{os.getpid()}.map").unlink(missing_ok=True)
    print(f"perf: {done} steps in {seconds} s, {named} jitted functions named; share of samples:")
    for name, pct in got.most_common(top):
        print(f"  {pct:5.1f}%  {name}")


def step_profile(
    model: str, numerics: str, rows: int, prefill: int, steps: int, perf: int, top: int
) -> None:
    if perf:
        perfmap.capture()  # before any kernel loads
    blocks, max_len = runner_size(64, prefill)
    runner = ModelRunner.from_path(
        resolve(model), BLOCK, blocks, 0, max_len, numerics, EngineConfig().kv_cache_dtype
    )
    runner.warmup()
    if prefill:
        batches = [prefill_batch(prefill, s) for s in range(steps)]
        what = f"prefill {prefill}"
    else:
        batches = [decode_batch(rows, s, FIRST_BLOCK) for s in range(steps)]
        what = f"decode B={rows}"

    def run_all() -> float:
        t = time.perf_counter()
        for b in batches:
            runner.run(b)
        return (time.perf_counter() - t) / steps

    run_all()
    times = []
    for b in batches:
        t = time.perf_counter()
        runner.run(b)
        times.append(time.perf_counter() - t)
    times.sort()
    print(f"{resolve(model).name}, numerics {numerics}, {what}, {steps} steps: "
          f"best {times[0] * 1e3:.3f} ms, median {times[len(times) // 2] * 1e3:.3f} ms")  # fmt: skip
    if perf:
        perf_profile(lambda i: runner.run(batches[i % steps]), perf, top)
        return
    wall, calls, spent = count_kernels(run_all)
    print_kernels(wall, calls, spent, steps)
    if runner.weights.panel_layers() is not None:
        fused = Weights.panel_layers
        Weights.panel_layers = lambda self: None  # type: ignore[method-assign]
        try:
            run_all()  # compiles the unfused pass's signatures
            wall, calls, spent = count_kernels(run_all)
        finally:
            Weights.panel_layers = fused  # type: ignore[method-assign]
        print("the same steps unfused, one call per kernel:")
        print_kernels(wall, calls, spent, steps)
    print_split(wall, spent, steps)
    m = next(
        m for m in (runner.weights.embed, runner.weights.lm_head) if isinstance(m, PackedMatrix)
    )
    x, out = np.zeros((rows, m.shape[1]), np.float32), np.zeros((rows, 16), np.float32)
    args = (x, m._format(), out, 0, 16, numba.get_num_threads())
    print(f"a call with a matmul's arguments and no work: {per_call_us(lambda: _no_work(*args)):.1f} us; "
          f"with an empty parallel region: {per_call_us(lambda: _empty_region(*args)):.1f} us")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=int, default=12)
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--step", action="store_true", help="profile forward steps instead")
    parser.add_argument("--rows", type=int, default=1, help="--step: sequences per step")
    parser.add_argument(
        "--prefill", type=int, default=0, help="--step: steps prefill a prompt of this length"
    )
    parser.add_argument(
        "--steps", type=int, default=0, help="--step: steps timed (default 50, 5 of a prefill)"
    )
    parser.add_argument("--numerics", default=EngineConfig().numerics, help="--step")
    parser.add_argument(
        "--perf", action="store_true", help="--step: perf's shares per jitted function instead"
    )
    parser.add_argument(
        "--model", default=BUNDLED_MODEL, help="--step: a path or bench.models name"
    )
    args = parser.parse_args()
    blas_as_told()
    if args.step:
        steps = args.steps or (5 if args.prefill else 50)
        if not args.prefill and steps > DECODE_STEPS:
            parser.error(f"--steps: at most {DECODE_STEPS} decode steps (bench.model's contexts)")
        step_profile(args.model, args.numerics, args.rows, args.prefill, steps,
                     args.seconds if args.perf else 0, args.top)  # fmt: skip
        return
    # the venv's bin is not on PATH when the bench runs as .venv/bin/python -m bench.profile
    spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if spy is None:
        raise SystemExit("py-spy is not installed: pip install -e '.[bench]'")
    raw = Path(tempfile.mkdtemp(prefix="tl-profile-")) / "core.txt"
    params = SamplingParams(max_tokens=128, temperature=0.0, ignore_eos=True)
    with Core() as core:
        core.run(random_prompts(2, 32, 99), params)  # warm
        cmd = [spy, "record", "-p", str(core.proc.pid), "-o", str(raw), "-f", "raw", "-r", "200",
               "--nonblocking", "--duration", str(args.seconds)]  # fmt: skip
        recorder = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        r = core.run(random_prompts(args.concurrency, 32, args.concurrency), params)
        recorder.wait()
    wall = max(r["done"])
    print(f"{args.concurrency} concurrent: {sum(r['tokens']) / wall:.1f} tok/s over {wall:.1f} s")
    summarize(raw, args.top)


if __name__ == "__main__":
    main()
