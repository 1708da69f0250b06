"""Per-kernel microbenchmarks at the model's shapes, each beside plain numpy doing the same work.

`python -m bench.kernels [--repeat N]`: best-of-N wall time per call, JIT warmed first. Numba
kernels run with the process's numba threads (2 here); numpy uses OpenBLAS's 2 threads. A
0.5 s pause before each timing lets the other side's idle threads stop spinning.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import numpy as np

from bench.model import timed
from enginecore.kernels import attention, ops, quant
from tests.unit.test_kernels import q4_1_random

D, FFN, VOCAB, N_KV, HD, N_HEADS, BS = 576, 1536, 49152, 3, 64, 9, 16


def best_ms(fn: Callable[[], object], repeat: int) -> float:
    fn()  # compile / warm
    return timed(fn, repeat)[0] * 1e3


def row(name: str, ours: float, numpy_ms: float) -> None:
    print(f"{name:<44} numba {ours:9.3f} ms   numpy {numpy_ms:9.3f} ms   x{numpy_ms / ours:5.2f}")


def matmuls(repeat: int) -> None:
    rng = np.random.default_rng(0)
    qs, d, m, dense64 = q4_1_random(3072, D)
    dense = dense64.astype(np.float32)
    for n in (1, 2, 4, 8, 16):
        x = rng.standard_normal((n, D), np.float32)
        xsum = np.empty((n, D // 32), np.float32)
        out = np.empty((n, 3072), np.float32)

        def q4(x: np.ndarray = x, xsum: np.ndarray = xsum, out: np.ndarray = out) -> None:
            quant.block_sums(x, xsum)
            quant.q4_1_matmul(x, xsum, qs, d, m, out)

        row(f"q4_1_matmul gate_up (3072x576) n={n}", best_ms(q4, repeat),
            best_ms(lambda x=x, out=out: np.matmul(x, dense.T, out=out), repeat))  # fmt: skip
    q8 = rng.integers(-127, 128, (VOCAB, D)).astype(np.int8)
    d8 = rng.random((VOCAB, D // 32), np.float32) * 0.01
    head = np.empty((VOCAB, D), np.float32)
    quant.dequantize_q8_0(q8, d8, head)
    x = rng.standard_normal((1, D), np.float32)
    out = np.empty((1, VOCAB), np.float32)
    row("q8_0_matmul lm_head (49152x576) n=1", best_ms(lambda: quant.q8_0_matmul(x, q8, d8, out), repeat),
        best_ms(lambda: np.matmul(x, head.T, out=out), repeat))  # fmt: skip


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

        def np_att(qkv: np.ndarray = qkv, k: np.ndarray = k, v: np.ndarray = v,
                   tables: np.ndarray = tables, b: int = b, ctx: int = ctx) -> object:  # fmt: skip
            kk = k[tables].reshape(b, -1, N_KV, HD)[:, :ctx]  # (b, ctx, n_kv, hd)
            vv = v[tables].reshape(b, -1, N_KV, HD)[:, :ctx]
            q = qkv[:, :D].reshape(b, N_KV, N_HEADS // N_KV, HD)
            s = np.einsum("bkgi,bpki->bkgp", q, kk) / math.sqrt(HD)
            e = np.exp(s - s.max(-1, keepdims=True))
            return np.einsum("bkgp,bpki->bkgi", e / e.sum(-1, keepdims=True), vv)

        row(f"paged_attention decode B={b} ctx={ctx}",
            best_ms(lambda qkv=qkv, seq=seq, pos=pos, tables=tables, k=k, v=v, out=out, p=p:
                    attention.attend(qkv, p, seq, pos, tables, k, v, N_HEADS, out), repeat),
            best_ms(np_att, repeat))  # fmt: skip
    n = 512
    k = rng.standard_normal((n // BS, BS, N_KV, HD), np.float32)
    v = rng.standard_normal((n // BS, BS, N_KV, HD), np.float32)
    qkv = rng.standard_normal((n, D + 2 * N_KV * HD), np.float32)
    seq, pos = np.zeros(n, np.int32), np.arange(n, dtype=np.int32)
    tables = np.arange(n // BS, dtype=np.int32)[None]
    out = np.empty((n, D), np.float32)
    p = attention.plan(seq, 16)

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
        best_ms(lambda: attention.attend(qkv, p, seq, pos, tables, k, v, N_HEADS, out), repeat),
        best_ms(np_causal, repeat))  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    matmuls(args.repeat)
    elementwise(args.repeat)
    attention_kernels(args.repeat)


if __name__ == "__main__":
    main()
