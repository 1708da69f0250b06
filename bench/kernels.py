"""Per-kernel microbenchmarks at the model's shapes, each beside plain numpy doing the same work.

`python -m bench.kernels [--repeat N] [--types Q4_K,Q6_K] [--only-matmuls | --shapes]`: best-of-N
wall time per call, JIT warmed first. `--shapes` prints only the integer matmuls at the bundled
model's matrix shapes and types: GB/s of packed weights at 1 activation row, G multiply-adds
per second at 4 / 16 / 64 / 512 rows, for int16 and int8 on the path this host selects, under
bench.peak's int16 ceiling, measured first. Numba kernels run with the process's numba threads
(2 here); numpy uses OpenBLAS's 2 threads. A 0.5 s pause before each numpy timing lets the
other side's idle threads stop spinning.
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import gguf
import numpy as np

from bench.isa import blas_as_told
from bench.model import timed
from bench.peak import peak
from enginecore import weights
from enginecore.kernels import attention, dot, gemm, ops, panels, threads
from enginecore.loader import gguf_types
from enginecore.weights import Numerics, PackedMatrix
from tests.fixtures.quant_blocks import random_blocks

D, FFN, VOCAB, N_KV, HD, N_HEADS, BS = 576, 1536, 49152, 3, 64, 9, 16


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # compile / warm
    return timed(fn, repeat)[0] * 1e3


def row(name: str, ours: float, numpy_ms: float) -> None:
    print(f"{name:<44} numba {ours:9.3f} ms   numpy {numpy_ms:9.3f} ms   x{numpy_ms / ours:5.2f}")


def read_gb_per_s(repeat: int) -> float:
    """Streaming read rate: OpenBLAS's 2-thread sgemv over 512 MB (twice the largest L3 seen)."""
    a = np.ones((16384, 8192), np.float32)
    x, y = np.ones(8192, np.float32), np.empty(16384, np.float32)
    with gemm.numpy_blas_threads():
        return a.nbytes / best_ms(lambda: np.matmul(a, x, out=y), repeat) / 1e6


def quick_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()
    ts = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts) * 1e3


MATMUL_ROWS = (1, 8, 512)


def matmuls(repeat: int, types: list[str]) -> None:
    """Each GGUF type, numerics and ISA path on a 3072 x 1536 matrix (gate_up-sized, K-quant
    rows), n = 1 / 8 / 512 activation rows, beside numpy BLAS fp32 and the read bound."""
    n_out, k = 3072, 1536
    rng = np.random.default_rng(0)
    gbs = read_gb_per_s(repeat)
    xs = {n: rng.standard_normal((n, k), np.float32) for n in MATMUL_ROWS}
    outs = {n: np.empty((n, n_out), np.float32) for n in MATMUL_ROWS}
    dense = rng.standard_normal((n_out, k), np.float32)
    with gemm.numpy_blas_threads():
        blas = {n: best_ms(lambda n=n: np.matmul(xs[n], dense.T, out=outs[n]), repeat)
                for n in MATMUL_ROWS}  # fmt: skip
    print(f"streaming read {gbs:.1f} GB/s; matmul {n_out}x{k}, ms per call (n=512: GMAC/s)")
    print(f"{'numpy BLAS fp32':<30} {'':>8}   n=1 {blas[1]:7.3f}   n=8 {blas[8]:7.3f}   "
          f"n=512 {n_out * k * 512 / blas[512] / 1e6:7.1f}")  # fmt: skip
    for name in types:
        qtype = gguf.GGMLQuantizationType[name]
        dec = gguf_types.decode(qtype, random_blocks(qtype, n_out, k, rng))
        for numerics in Numerics:
            m = PackedMatrix.pack(name, dec, numerics)
            bound = m.nbytes / gbs / 1e6
            paths = dot.supported() if numerics.batch_invariant else [dot.SELECTED]
            for isa in paths:
                weights.ISA = isa
                # the portable path's scalar loops take seconds at n=512: few rows only
                rows = MATMUL_ROWS[:2] if isa == dot.Isa.PORTABLE else MATMUL_ROWS
                ms = {n: quick_ms(lambda n=n, m=m: m.matmul(xs[n], outs[n]), repeat) for n in rows}
                label = f"{name} {numerics} {isa.name if numerics.batch_invariant else ''}"
                many = f"{n_out * k * 512 / ms[512] / 1e6:7.1f}" if 512 in ms else f"{'-':>7}"
                print(f"{label:<30} bound {bound:5.3f}   n=1 {ms[1]:7.3f}   n=8 {ms[8]:7.3f}   "
                      f"n=512 {many}", flush=True)  # fmt: skip
    weights.ISA = dot.SELECTED


# the bundled model's matrices: (GGUF type, name, output rows, input columns)
MODEL_SHAPES = (
    ("Q4_1", "wqkv", 960, 576), ("Q4_1", "wo", 576, 576), ("Q4_1", "w_gate_up", 3072, 576),
    ("Q4_1", "w_down", 576, 1536), ("Q8_0", "lm_head", 49152, 576),
)  # fmt: skip
SHAPE_ROWS = (1, 4, 16, 64, 512)


def model_shapes(repeat: int) -> None:
    """Integer matmuls (pre-quantized activations, as the fused layer calls them) per shape."""
    rng = np.random.default_rng(0)
    print(peak()[0])  # the int16 rows' ceiling
    print(f"integer matmuls at the bundled model's shapes, {dot.SELECTED.name}, "
          f"{threads.count()} threads: n=1 GB/s of packed weights, else G MAC/s")  # fmt: skip
    for name, what, n_out, k in MODEL_SHAPES:
        qtype = gguf.GGMLQuantizationType[name]
        dec = gguf_types.decode(qtype, random_blocks(qtype, n_out, k, rng))
        for numerics in (Numerics.INT16, Numerics.INT8):
            m = PackedMatrix.pack(name, dec, numerics)
            fmt = m.panel_parts()[0][0]  # type: ignore[index]
            cells = []
            for n in SHAPE_ROWS:
                a = weights.quantize(rng.standard_normal((n, k), np.float32), numerics)
                out = np.empty((n, n_out), np.float32)

                def call(a: weights.Activations = a, out: np.ndarray = out, fmt: object = fmt,
                         n_out: int = n_out) -> None:  # fmt: skip
                    panels.int_matmul(a.xq, a.xa, a.xb, fmt, weights.isa_arg(), out, 0, n_out,
                                      threads.count())  # fmt: skip

                # enough calls for ~0.1 s of multiply-adds at ~100 G MAC/s, at least `repeat`
                ms = quick_ms(call, max(repeat, min(200, int(1e10 // (n_out * k * n)))))
                if n == 1:
                    cells.append(f"n=1 {ms * 1e3:7.1f} us {m.nbytes / ms / 1e6:5.1f} GB/s")
                else:
                    cells.append(f"n={n} {n_out * k * n / ms / 1e6:6.1f}")
            label = f"{what} {name} {n_out}x{k} {numerics}"
            print(f"{label:<32} " + "   ".join(cells), flush=True)


def elementwise(repeat: int) -> None:
    rng = np.random.default_rng(0)
    for n in (1, 512):
        x, y = rng.standard_normal((n, D), np.float32), rng.standard_normal((n, D), np.float32)
        w, h = rng.standard_normal(D, np.float32), np.empty((n, D), np.float32)

        def np_add_norm(x: np.ndarray = x, y: np.ndarray = y, w: np.ndarray = w) -> object:
            s = x + y
            return s / np.sqrt((s * s).mean(1, keepdims=True) + 1e-5) * w

        row(f"add_rmsnorm n={n}", best_ms(lambda x=x, y=y, w=w, h=h: ops.add_rmsnorm(x, y, w, 1e-5, h), repeat),
            best_ms(np_add_norm, repeat))  # fmt: skip
        gu = rng.standard_normal((n, 2 * FFN), np.float32)
        act = np.empty((n, FFN), np.float32)

        def np_silu(gu: np.ndarray = gu) -> object:
            g = gu[:, :FFN]
            return g / (1 + np.exp(-g)) * gu[:, FFN:]

        row(f"silu_mul n={n}", best_ms(lambda gu=gu, act=act: ops.silu_mul(gu, act), repeat),
            best_ms(np_silu, repeat))  # fmt: skip


def attention_kernels(repeat: int) -> None:
    rng = np.random.default_rng(0)
    for b, ctx in ((1, 150), (64, 192)):
        blocks = -(-ctx // BS) + 1
        k = rng.standard_normal((b * blocks, BS, N_KV, HD), np.float32)
        v = rng.standard_normal((b * blocks, BS, N_KV, HD), np.float32)
        tables = rng.permutation(b * blocks).astype(np.int32).reshape(b, blocks)
        qkv = rng.standard_normal((b, D + 2 * N_KV * HD), np.float32)
        seq, pos = np.arange(b, dtype=np.int32), np.full(b, ctx - 1, np.int32)
        out = np.empty((b, D), np.float32)
        p = attention.plan(seq, None)
        kc, vc = attention.k_cache_layout(k), attention.v_cache_layout(v)

        def np_att(qkv: np.ndarray = qkv, k: np.ndarray = k, v: np.ndarray = v,
                   tables: np.ndarray = tables, b: int = b, ctx: int = ctx) -> object:  # fmt: skip
            kk = k[tables].reshape(b, -1, N_KV, HD)[:, :ctx]  # (b, ctx, n_kv, hd)
            vv = v[tables].reshape(b, -1, N_KV, HD)[:, :ctx]
            q = qkv[:, :D].reshape(b, N_KV, N_HEADS // N_KV, HD)
            s = np.einsum("bkgi,bpki->bkgp", q, kk) / math.sqrt(HD)
            e = np.exp(s - s.max(-1, keepdims=True))
            return np.einsum("bkgp,bpki->bkgi", e / e.sum(-1, keepdims=True), vv)

        row(f"paged_attention decode B={b} ctx={ctx}",
            best_ms(lambda qkv=qkv, seq=seq, pos=pos, tables=tables, kc=kc, vc=vc, out=out, p=p:
                    attention.attend(qkv, p, seq, pos, tables, kc, vc, N_HEADS, out), repeat),
            best_ms(np_att, repeat))  # fmt: skip
    n = 512
    k = rng.standard_normal((n // BS, BS, N_KV, HD), np.float32)
    v = rng.standard_normal((n // BS, BS, N_KV, HD), np.float32)
    qkv = rng.standard_normal((n, D + 2 * N_KV * HD), np.float32)
    seq, pos = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    tables = np.arange(n // BS, dtype=np.int32)[None]
    out = np.empty((n, D), np.float32)
    p = attention.plan(seq, 16)
    kc, vc = attention.k_cache_layout(k), attention.v_cache_layout(v)

    def np_causal() -> object:
        q = qkv[:, :D].reshape(n, N_KV, N_HEADS // N_KV, HD).transpose(1, 2, 0, 3)
        kk, vv = (
            k.reshape(n, N_KV, HD).transpose(1, 0, 2),
            v.reshape(n, N_KV, HD).transpose(1, 0, 2),
        )
        s = q @ kk[:, None].transpose(0, 1, 3, 2) / math.sqrt(HD)  # (n_kv, g, n, n)
        s[..., np.triu_indices(n, 1)[0], np.triu_indices(n, 1)[1]] = -np.inf
        e = np.exp(s - s.max(-1, keepdims=True))
        return (e / e.sum(-1, keepdims=True)) @ vv[:, None]

    row("chunk_attention prefill 512 (BLAS path)",
        best_ms(lambda: attention.attend(qkv, p, seq, pos, tables, kc, vc, N_HEADS, out), repeat),
        best_ms(np_causal, repeat))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument(
        "--types", default=",".join(t.name for t in gguf_types.DECODERS),
        help="GGUF types to time, comma-separated",
    )  # fmt: skip
    parser.add_argument("--only-matmuls", action="store_true")
    parser.add_argument("--shapes", action="store_true", help="only the model-shape matmuls")
    args = parser.parse_args()
    blas_as_told()
    if args.shapes:
        model_shapes(max(3, args.repeat // 4))
        return
    matmuls(max(3, args.repeat // 4), args.types.split(","))
    if args.only_matmuls:
        return
    elementwise(args.repeat)
    attention_kernels(args.repeat)


if __name__ == "__main__":
    main()
