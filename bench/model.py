"""Forward-pass throughput on the real model, each figure beside numpy BLAS on the same matmuls.

`python -m bench.model [--model PATH] [--repeat N]`. The machine is shared: every case is run
`repeat` times and the best and median are printed; compare only figures from one run.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.isa import blas_as_told
from bench.llama_bench import llama_bench_lines
from bench.models import resolve
from bench.peak import peak
from enginecore.batch import Batch, SeqChunk
from enginecore.kernels import dot, gemm
from enginecore.model_runner import ModelRunner
from enginecore.weights import DenseMatrix, FusedMatrix, Matrix
from shared.config import BUNDLED_MODEL, EngineConfig

ROOT = Path(__file__).resolve().parents[1]

BLOCK = EngineConfig().block_size  # the core's default
DECODE_STEPS = 64  # decode_batch's steps: contexts grow by one a step
# each decode sequence owns the slots of its largest context (255 + the last step), contiguous
SEQ_BLOCKS = -(-(256 + DECODE_STEPS) // BLOCK)
FIRST_BLOCK = -(-512 // BLOCK)  # the blocks before hold the 512-token prefill


def runner_size(rows: int, prefill: int) -> tuple[int, int]:
    """(KV blocks, max model length) of a runner for decode batches of up to `rows` sequences
    (decode_batch's blocks, from FIRST_BLOCK) and a `prefill`-token prompt (prefill_batch's,
    from 0): nothing outside the engine's block manager checks a block table against the
    cache, so a prompt longer than the cache would be written past it."""
    return max(FIRST_BLOCK + rows * SEQ_BLOCKS, -(-prefill // BLOCK)), max(2048, prefill)


def timed(fn: Callable[[], object], repeat: int) -> tuple[float, float]:
    """(best, median) seconds of `repeat` calls, after BLAS's idle worker stopped spinning."""
    time.sleep(0.5)
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts), statistics.median(ts)


def dense_copy(m: Matrix) -> np.ndarray:
    """The fp32 weights of a matrix (the benchmark's BLAS reference; the engine keeps none)."""
    if isinstance(m, DenseMatrix):
        return m.rows()
    if isinstance(m, FusedMatrix):
        return np.concatenate([dense_copy(p) for p in m.parts])
    out = np.empty(m.shape, np.float32)
    m.gather(np.arange(m.shape[0], dtype=np.int32), out)
    return out


def blas_same_matmuls(
    runner: ModelRunner, rows: int, sampled: int, dense: dict[int, np.ndarray]
) -> Callable[[], None]:
    """x @ W.T on dense fp32 copies: every layer matrix for `rows`, lm_head for `sampled`."""
    w = runner.weights
    if not dense:
        for m in w.layer_matrices():
            dense[len(dense)] = dense_copy(m)
        dense[-1] = dense_copy(w.lm_head)
    mats = [a for i, a in dense.items() if i >= 0]
    rng = np.random.default_rng(0)
    xs = {k: rng.standard_normal((rows, k), np.float32) for k in {m.shape[1] for m in mats}}
    outs = [np.empty((rows, m.shape[0]), np.float32) for m in mats]
    head = dense[-1]
    hx = rng.standard_normal((sampled, head.shape[1]), np.float32)
    hout = np.empty((sampled, head.shape[0]), np.float32)

    def run() -> None:
        with gemm.numpy_blas_threads():  # numpy as it comes: OpenBLAS's own thread pool
            for m, o in zip(mats, outs, strict=True):
                np.matmul(xs[m.shape[1]], m.T, out=o)
            np.matmul(hx, head.T, out=hout)

    return run


def decode_batch(num_seqs: int, step: int, first_block: int) -> Batch:
    """One decode token per sequence, contexts spread over 128..256 (~100..200 for one), plus
    `step` (< DECODE_STEPS: the sequences' blocks hold no more)."""
    if not 0 <= step < DECODE_STEPS:
        raise ValueError(f"decode step {step}: at most {DECODE_STEPS} steps fit the blocks")
    chunks = []
    for s in range(num_seqs):
        ctx = (150 if num_seqs == 1 else 128 + (s * 37) % 128) + step
        table = list(range(first_block + s * SEQ_BLOCKS, first_block + (s + 1) * SEQ_BLOCKS))
        chunks.append(SeqChunk([(s * 7 + step) % 1000 + 10], ctx, table, 1))
    return Batch.build(chunks, BLOCK)


def prefill_batch(tokens: int, seed: int = 0, start: int = 0, chunk: int = 0) -> Batch:
    """Positions start..start + chunk - 1 of a `tokens`-long prompt in blocks 0.. (chunk 0:
    all of it); the last row is sampled when the chunk ends the prompt."""
    chunk = chunk or tokens
    ids = [(i * 13 + seed) % 40000 + 100 for i in range(start, start + chunk)]
    table = list(range(-(-tokens // BLOCK)))
    return Batch.build([SeqChunk(ids, start, table, int(start + chunk >= tokens))], BLOCK)


def prefill_calls(runner: ModelRunner, chunk: int) -> Callable[[], None]:
    batches = [prefill_batch(512, 0, a, chunk) for a in range(0, 512, chunk)]

    def run() -> None:
        for b in batches:
            runner.run(b)

    return run


def matmul_macs(runner: ModelRunner, rows: int, sampled: int) -> int:
    """Multiply-adds of a step's matmuls: every layer matrix for `rows`, lm_head for `sampled`
    (what blas_same_matmuls runs)."""
    w = runner.weights
    n, k = w.lm_head.shape
    return rows * sum(m.shape[0] * m.shape[1] for m in w.layer_matrices()) + sampled * n * k


def report(
    name: str,
    tokens: int,
    ours: tuple[float, float],
    blas: tuple[float, float],
    macs: int,
    ceiling: float | None,
) -> None:
    """`ceiling`: bench.peak's G MAC/s on every thread; the step's matmul multiply-adds over
    its best time (everything else in the step counted as matmul time: a floor of their rate)
    beside it."""
    macs_s = macs / ours[0] / 1e9
    share = f" ({100 * macs_s / ceiling:3.0f}% of the peak)" if ceiling else ""
    print(
        f"{name:<28} {tokens / ours[0]:8.1f} tok/s (best {ours[0] * 1e3:7.1f} ms, "
        f"median {ours[1] * 1e3:7.1f})   BLAS same matmuls {blas[0] * 1e3:7.1f} ms   "
        f"ratio {ours[0] / blas[0]:5.2f}   matmuls {macs_s:5.1f} G MAC/s{share}"
    )


# Samples of "decode B=1" alone and after a prefill, at least: one step each, so with 5 a few
# noisy steps decided the best and the median (4.9 ms best / 5.0 median against 4.9 median
# alone, unsettled).
AFTER_PREFILL_SAMPLES = 20


def after_prefill(runner: ModelRunner, repeat: int) -> None:
    """A batch-1 decode step right after a 512-token prefill step, each followed by one more
    decode step, its yardstick: taken in turn, the two see the same phase of this host (timed
    apart, as against `decode B=1`, they can land in different ones)."""
    prefill = prefill_calls(runner, 512)
    batch = decode_batch(1, 0, FIRST_BLOCK)
    after: list[float] = []
    again: list[float] = []
    for _ in range(max(repeat, AFTER_PREFILL_SAMPLES)):
        prefill()
        for ts in (after, again):
            t = time.perf_counter()
            runner.run(batch)
            ts.append(time.perf_counter() - t)
    best, median = min(after), statistics.median(after)
    best_d, median_d = min(again), statistics.median(again)
    print(
        f"{'decode B=1 after a prefill':<28} {1 / best:8.1f} tok/s (best {best * 1e3:7.1f} ms, "
        f"median {median * 1e3:7.1f}); the next decode step: best {best_d * 1e3:.1f} ms, "
        f"median {median_d * 1e3:.1f}; after / next {median / median_d:.2f} by median"
    )


def llama_cpp_figures(path: Path, repeat: int, python: str) -> None:
    """llama.cpp on the same GGUF, in a subprocess of a Python that has llama-cpp-python."""
    script = Path(__file__).with_name("llama_cpp_ref.py")
    try:
        done = subprocess.run(
            [python, str(script), str(path), str(repeat)],
            capture_output=True,
            text=True,
            timeout=600,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        done = subprocess.CompletedProcess([], 1, "", str(e))
    if done.returncode != 0:
        print(
            f"llama.cpp: not available from {python} ({done.stderr.strip().splitlines()[-1:]}). "
            "`pip install llama-cpp-python` into some venv builds llama.cpp from source "
            "(~10+ min on 2 cores); pass that venv's python as --llama-python."
        )
        return
    r = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"llama.cpp {r['version']} prompt eval 512   {r['prompt_eval_tok_s']:8.1f} tok/s")
    print(
        f"llama.cpp {r['version']} decode B=1        {r['decode_tok_s']:8.1f} tok/s (64 tokens from ctx 150)"
    )


def bench_mode(
    path: Path, numerics: str, kv: str, repeat: int, dense: dict[int, np.ndarray]
) -> None:
    """Every case of one numerics mode (a runner of its own; `dense` is shared by the modes)."""
    blocks, max_len = runner_size(64, 512)
    runner = ModelRunner.from_path(path, BLOCK, blocks, 0, max_len, numerics, kv)
    runner.warmup()
    rng = np.random.default_rng(0)
    for cache in (runner.cache.k, runner.cache.v):  # plausible contexts without a long prefill
        values = rng.standard_normal(cache.shape[1:], np.float32) * 0.5
        cache[...] = (
            values[None]
            if cache.dtype == np.float32
            else values.astype(np.float16).view(np.uint16)[None]
        )
    ceiling = None
    if numerics == "int16":  # the loop is of the int16 kernels' instructions
        line, ceiling = peak()
        print(line)
    print(f"numerics {numerics}, KV {kv}:")
    for chunk in (512, 256):
        run = prefill_calls(runner, chunk)
        run()
        report(
            f"prefill 512 as {512 // chunk} x {chunk}",
            512,
            timed(run, repeat),
            timed(blas_same_matmuls(runner, 512, 1, dense), repeat),
            matmul_macs(runner, 512, 1),
            ceiling,
        )
    for num_seqs in (1, 8, 32, 64):
        # B=1 takes as many samples as the after-prefill case it is the yardstick of
        n = max(repeat, AFTER_PREFILL_SAMPLES) if num_seqs == 1 else repeat
        batches = [decode_batch(num_seqs, step % DECODE_STEPS, FIRST_BLOCK) for step in range(n)]
        runner.run(batches[0])
        it = iter(batches * 2)
        ours = timed(lambda it=it: runner.run(next(it)), n)  # type: ignore[misc]
        blas = timed(blas_same_matmuls(runner, num_seqs, num_seqs, dense), repeat)
        macs = matmul_macs(runner, num_seqs, num_seqs)
        report(f"decode B={num_seqs}", num_seqs, ours, blas, macs, ceiling)
    after_prefill(runner, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=BUNDLED_MODEL, help="a path or a bench.models name")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--numerics",
        default=EngineConfig().numerics,
        help="comma-separated modes among exact, int8, int16 (each runs every case)",
    )
    parser.add_argument(
        "--kv-cache-dtype", default=EngineConfig().kv_cache_dtype, choices=["f32", "f16"]
    )
    parser.add_argument(
        "--llama-python",
        default=str(ROOT / ".cache" / "llamacpp-venv" / "bin" / "python"),
        help="a Python with llama-cpp-python, for the llama.cpp reference (bench/compare makes one)",
    )
    args = parser.parse_args()
    blas_as_told()
    modes = args.numerics.split(",")
    for m in modes:
        if m not in ("exact", "int8", "int16"):
            parser.error(f"--numerics: {m!r} is not one of exact, int8, int16")
    path = resolve(args.model)
    print(f"{path.name}: integer path {dot.SELECTED.name}; best and median of {args.repeat}")
    dense: dict[int, np.ndarray] = {}
    for m in modes:
        bench_mode(path, m, args.kv_cache_dtype, args.repeat, dense)
    llama_cpp_figures(path, args.repeat, args.llama_python)
    print("\n".join(llama_bench_lines(path, args.repeat)))


if __name__ == "__main__":
    main()
