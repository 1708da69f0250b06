"""Two revisions of the engine in one process, their calls alternated: an A/B that survives a
noisy host.

    python -m bench.ab --base REV [--cases steps,matmul,attention] [--model bundled]
        [--rows 1,16,64] [--prefill 512] [--types Q4_1,Q8_0] [--numerics int16] [--repeat 9]

This machine's speed drifts by up to 50% within minutes (another tenant's load, the sibling
vCPU), so two runs of bench.model or bench.kernels a minute apart do not compare. Here the
checkout's `enginecore` and REV's, imported as `enginecore_base` (its `enginecore/` tree from
git, imports renamed, kept under .cache/ab/ with its own numba cache), run the same work call
for call, base and new in turn (which one goes first alternates), and each case prints both
sides' best and median and new / base. Both sides' outputs are compared too: "same bits", or
the largest difference when a change altered the numerics. Only `enginecore/` comes from REV;
`shared/` and `bench/` are the checkout's.

Cases: `steps`, ModelRunner forward steps (bench.model's decode batches of each --rows, and a
--prefill prompt); `matmul`, the integer matmul (panels.int_matmul) of random blocks of each
--types at the bundled model's shapes and --rows; `attention`, paged_attention over 30 layers'
caches at --rows decodes of contexts 128..256, or of --context positions each (f16 KV cache,
the default block size, each sequence's blocks one run: streamed from DRAM as in a step).
"""

from __future__ import annotations

import argparse
import importlib
import io
import os
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from bench.isa import blas_as_told
from shared.config import EngineConfig

ROOT = Path(__file__).resolve().parents[1]
CACHE = ROOT / ".cache" / "ab"
BASE = "enginecore_base"
MATMUL_SHAPES = ((960, 576), (3072, 576), (576, 1536))  # the bundled model's (n_out, K)


def base_package(rev: str) -> Path:
    """A folder holding REV's enginecore/ as the package enginecore_base (made once)."""
    sha = subprocess.run(
        ["git", "rev-parse", "--verify", f"{rev}^{{commit}}"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    root = CACHE / sha[:12]
    if (root / BASE / "__init__.py").exists():
        return root
    tree = subprocess.run(
        ["git", "archive", "--format=tar", sha, "enginecore"], cwd=ROOT, capture_output=True,
        check=True,
    ).stdout  # fmt: skip
    staging = root.with_name(root.name + ".part")
    shutil.rmtree(staging, ignore_errors=True)  # what an interrupted run left
    with tarfile.open(fileobj=io.BytesIO(tree)) as tar:
        tar.extractall(staging, filter="data")
    for path in (staging / "enginecore").rglob("*.py"):
        path.write_text(re.sub(r"\benginecore\b", BASE, path.read_text()))
    (staging / "enginecore").rename(staging / BASE)
    staging.rename(root)
    return root


def sides(rev: str, name: str) -> dict[str, ModuleType]:
    """{"base": REV's module `name`, "new": the checkout's}. The base's kernels package keys
    numba's cache folder on its own source (enginecore/kernels/__init__.py) and writes it to
    NUMBA_CACHE_DIR and numba's config: both are put back after the import, so the base's
    kernels keep the folder they were declared with and the checkout's process state is its
    own."""
    import numba

    new = importlib.import_module(f"enginecore.{name}")
    root = str(base_package(rev))
    if root not in sys.path:
        sys.path.insert(0, root)
    env, config = os.environ.get("NUMBA_CACHE_DIR"), numba.config.CACHE_DIR  # type: ignore[attr-defined]
    try:
        base = importlib.import_module(f"{BASE}.{name}")
    finally:
        if env is None:
            os.environ.pop("NUMBA_CACHE_DIR", None)
        else:
            os.environ["NUMBA_CACHE_DIR"] = env
        numba.config.CACHE_DIR = config  # type: ignore[attr-defined]
    return {"base": base, "new": new}


def compare(outs: dict[str, np.ndarray]) -> str:
    a, b = outs["base"], outs["new"]
    if a.shape == b.shape and np.array_equal(a.view(np.uint8), b.view(np.uint8)):
        return "same bits"
    return f"DIFFER: max |new - base| {float(np.max(np.abs(a - b))):.3g}"


def alternate(calls: Mapping[str, Callable[[int], object]], repeat: int) -> dict[str, list[float]]:
    """Seconds of each side's call(i), i = 0..repeat-1, the two sides in turn."""
    times: dict[str, list[float]] = {"base": [], "new": []}
    for i in range(repeat):
        for side in ("base", "new") if i % 2 else ("new", "base"):
            t = time.perf_counter()
            calls[side](i)
            times[side].append(time.perf_counter() - t)
    return times


def line(label: str, times: dict[str, list[float]], unit: float, what: str, bits: str) -> None:
    best = {k: min(v) for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in times.items()}
    print(
        f"{label:<34} base {best['base'] * unit:9.3f} (median {med['base'] * unit:9.3f})  "
        f"new {best['new'] * unit:9.3f} (median {med['new'] * unit:9.3f}) {what}  "
        f"new/base {best['new'] / best['base']:.3f} best, {med['new'] / med['base']:.3f} median"
        f"  {bits}",
        flush=True,
    )


def _run_nth(runner: Any, batches: list[Any], i: int) -> None:
    runner.run(batches[i])


def _matmuls(
    panels: ModuleType, acts: Any, fmt: Any, out: np.ndarray, isa: Any, n_out: int, reps: int,
    i: int,
) -> None:  # fmt: skip
    for _ in range(reps):
        panels.int_matmul(acts.xq, acts.xa, acts.xb, fmt, isa, out, 0, n_out, 2)


def _attention(attention: ModuleType, work: tuple[Any, ...], i: int) -> None:
    (qkv, seq, pos, tables, kc, vc, heads, out) = work
    for layer in range(kc.shape[0]):  # a step's layers, each its own cache
        attention.paged_attention(qkv, seq, seq, pos, tables, kc[layer], vc[layer], heads, out,
                                  2, 0, 0.125)  # fmt: skip


def steps_case(args: argparse.Namespace) -> None:
    from bench import model as bm
    from bench.models import resolve

    runner_mods, batch_mods = sides(args.base, "model_runner"), sides(args.base, "batch")
    path = resolve(args.model)
    runners = {}
    blocks, max_len = bm.runner_size(max(args.rows), args.prefill)
    for side, mod in runner_mods.items():
        runners[side] = mod.ModelRunner.from_path(
            path, bm.BLOCK, blocks, 0, max_len, args.numerics, args.kv_cache_dtype
        )
        runners[side].warmup()

    def rebuild(side: str, batch: Any) -> Any:  # bench.model's batch as that side's Batch
        return batch_mods[side].Batch(
            batch.token_ids, batch.positions, batch.seq_of_token, batch.block_tables,
            batch.slot_mapping, batch.sample_rows, batch.num_seqs,
        )  # fmt: skip

    print(f"{path.name}, numerics {args.numerics}, KV {args.kv_cache_dtype}; ms per step")
    for rows in args.rows:
        n = min(bm.DECODE_STEPS, max(args.repeat, 40 if rows < 16 else 16))
        batches = [bm.decode_batch(rows, s, bm.FIRST_BLOCK) for s in range(n)]
        per_side = {side: [rebuild(side, b) for b in batches] for side in runners}
        outs = {side: runners[side].run(per_side[side][0]) for side in runners}
        times = alternate({s: partial(_run_nth, runners[s], per_side[s]) for s in runners}, n)
        line(f"decode B={rows}", times, 1e3, "ms", compare(outs))
    if args.prefill:
        batch = bm.prefill_batch(args.prefill)
        per_side = {side: rebuild(side, batch) for side in runners}
        outs = {side: runners[side].run(per_side[side]) for side in runners}
        calls = {s: partial(_run_nth, runners[s], [per_side[s]] * args.repeat) for s in runners}
        times = alternate(calls, args.repeat)
        line(f"prefill {args.prefill}", times, 1e3, "ms", compare(outs))


def matmul_case(args: argparse.Namespace) -> None:
    import gguf

    from tests.fixtures.quant_blocks import random_blocks

    w, g, p = (sides(args.base, m) for m in ("weights", "loader.gguf_types", "kernels.panels"))
    mods = {k: (w[k], g[k], p[k]) for k in ("base", "new")}
    rng = np.random.default_rng(0)
    print(f"integer matmul, numerics {args.numerics}; us per call")
    for qname in args.types:
        qtype = gguf.GGMLQuantizationType[qname]
        for n_out, k in MATMUL_SHAPES:
            raw = random_blocks(qtype, n_out, k, rng)
            for rows in args.rows:
                x = rng.standard_normal((rows, k)).astype(np.float32)
                work, outs = {}, {}
                for side, (w, g, panels) in mods.items():
                    numerics = w.Numerics(args.numerics)
                    m = w.PackedMatrix.pack(qname, g.decode(qtype, raw), numerics)
                    acts = w.quantize(x, numerics)
                    out = np.empty((rows, n_out), np.float32)
                    fmt = m.panel_parts()[0][0]
                    # (a tree from before weights.isa_arg passed the path as an int)
                    isa = w.isa_arg() if hasattr(w, "isa_arg") else int(w.ISA)
                    work[side] = (panels, acts, fmt, out, isa)
                    panels.int_matmul(acts.xq, acts.xa, acts.xb, fmt, isa, out, 0, n_out, 2)
                    outs[side] = out
                reps = max(3, int(5e7 // (n_out * k * rows)))
                calls = {s: partial(_matmuls, *work[s], n_out, reps) for s in work}
                times = alternate(calls, args.repeat)
                times = {s: [t / reps for t in v] for s, v in times.items()}
                line(f"{qname} {n_out}x{k} rows={rows}", times, 1e6, "us", compare(outs))


def attention_case(args: argparse.Namespace) -> None:
    mods = sides(args.base, "kernels.attention")
    rng = np.random.default_rng(0)
    heads, kv_heads, head_dim = 9, 3, 64  # the bundled model's
    bs = EngineConfig().block_size  # the core's default
    print(f"paged_attention, f16 KV cache, blocks of {bs}; ms per 30 calls (a step's layers)")
    for rows in args.rows:
        ctx = np.full(rows, args.context) if args.context else rng.integers(128, 256, rows)
        n_blocks = int(sum(-(-c // bs) for c in ctx))
        # 30 layers' caches, each sequence's blocks one run (enginecore/free_blocks.py keeps
        # a table's blocks adjacent where it can), the runs in random order over the pool: a
        # step's attention streams K and V from DRAM as in the engine (one layer's cache
        # reused 30 times stayed in L3 and measured compute alone)
        shape = (30, n_blocks, kv_heads, head_dim, bs)
        kc = rng.standard_normal(shape, np.float32).astype(np.float16).view(np.uint16)
        vc = np.ascontiguousarray(kc.transpose(0, 1, 4, 2, 3))  # (layer, block, bs, kv, dim)
        tables = np.zeros((rows, -(-int(ctx.max()) // bs)), np.int32)
        used = 0
        for s in rng.permutation(rows):
            n = -(-int(ctx[s]) // bs)
            tables[s, :n] = np.arange(used, used + n)
            used += n
        qkv = (3 * rng.standard_normal((rows, (heads + 2 * kv_heads) * head_dim))).astype(
            np.float32
        )
        seq, pos = np.arange(rows, dtype=np.int32), (ctx - 1).astype(np.int32)
        outs = {side: np.empty((rows, heads * head_dim), np.float32) for side in mods}
        # each side's V layout (a side without v_cache_layout keeps blocks as made)
        vcs = {
            s: np.stack([m.v_cache_layout(v) for v in vc]) if hasattr(m, "v_cache_layout") else vc
            for s, m in mods.items()
        }
        calls = {
            s: partial(_attention, mods[s], (qkv, seq, pos, tables, kc, vcs[s], heads, outs[s]))
            for s in mods
        }
        for call in calls.values():
            call(0)
        bits = compare(outs)
        times = alternate(calls, args.repeat)
        what = f"context {args.context}" if args.context else "contexts 128..256"
        line(f"{rows} decodes, {what}", times, 1e3, "ms", bits)


CASES = {"steps": steps_case, "matmul": matmul_case, "attention": attention_case}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--base", required=True, help="a git revision: the A side")
    p.add_argument("--cases", default="steps", help=",".join(CASES))
    p.add_argument("--model", default="bundled", help="steps: a bench.models name or a path")
    p.add_argument("--rows", default="1,16,64", help="decode rows (matmul: activation rows)")
    p.add_argument("--prefill", type=int, default=512, help="steps: a prompt's length, 0: none")
    p.add_argument("--types", default="Q4_1,Q8_0", help="matmul: GGUF types")
    p.add_argument("--context", type=int, default=0, help="attention: every decode's context")
    p.add_argument("--numerics", default="int16", help="int16 or int8 (steps: exact too)")
    p.add_argument("--kv-cache-dtype", default="f16")
    p.add_argument("--repeat", type=int, default=9, help="calls per side and case")
    args = p.parse_args(argv)
    blas_as_told()
    args.rows = [int(r) for r in args.rows.split(",")]
    args.types = args.types.split(",")
    for case in args.cases.split(","):
        if case not in CASES:
            p.error(f"unknown case {case!r}: {', '.join(CASES)}")
    for case in args.cases.split(","):
        CASES[case](args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
