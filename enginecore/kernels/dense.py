"""fp32 matmul on dense weights whose every output element is one fma chain in a fixed order.

A dense matrix (F32 / F16 / BF16 files, Hugging Face checkpoints) is kept as panels of
PANEL output rows, transposed: panels (P, K, PANEL), panels[p, k, j] = W[p PANEL + j, k],
zero rows padding the last panel (enginecore/weights.py's DenseMatrix packs them). out[r, n] =
the fma chain over k = 0 .. K - 1, in order, of x[r, k] * W[n, k], started from 0, whatever
the batch, the row tile, the thread split or the ISA: a request's logits never depend on what
it was batched with. OpenBLAS gives no such promise (its Haswell kernels, used on AVX2 hosts,
round a row differently in a call of one to three rows than in a call of four or more).

The work is attention's pv tile (kernels/attention_simd.py): a[g, d] += w[g, j] v[j, d] is
x rows times a panel, all accumulators in registers; K runs in chunks of K_CHUNK so that a
panel's chunk stays in L1 while every row tile passes over it (a chain continues through
its float32 partial in `out`, which changes no bit).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from enginecore.kernels.attention_simd import LANES, TWO_VEC_HEADS, pv_scalar, pv_tile

PANEL = 2 * LANES  # output rows per panel: two 16-lane vectors a tile row
K_CHUNK = 128  # a panel's chunk: 128 x 32 float32 = 16 KB


@njit(parallel=True, cache=True, nogil=True)
def matmul(x, panels, n_out, out, col0, workers):
    # out[:, col0 : col0 + n_out] = x (m, K) @ W.T, W (n_out, K) in panels (P, K, PANEL);
    # x and out C-contiguous. Worker w takes panels w, w + workers, ...
    m, k = x.shape
    ldo = out.shape[1]
    n_panels = panels.shape[0]
    xf, pf, of = x.reshape(-1), panels.reshape(-1), out.reshape(-1)
    for w in prange(workers):
        for p in range(w, n_panels, workers):
            c = col0 + p * PANEL
            width = min(PANEL, n_out - p * PANEL)
            for r in range(m):
                for j in range(width):
                    out[r, c + j] = np.float32(0.0)
            for k0 in range(0, k, K_CHUNK):
                kc = min(K_CHUNK, k - k0)
                at = (p * k + k0) * PANEL
                for r0 in range(0, m, TWO_VEC_HEADS):
                    rows = min(TWO_VEC_HEADS, m - r0)
                    x_at, o_at = r0 * k + k0, r0 * ldo + c
                    if width == PANEL:
                        pv_tile(xf, x_at, k, pf, at, PANEL, kc, of, o_at, ldo, rows, 2, -1)
                        continue
                    if width >= LANES:
                        pv_tile(xf, x_at, k, pf, at, PANEL, kc, of, o_at, ldo, rows, 1, -1)
                    done = LANES if width >= LANES else 0
                    pv_scalar(xf, x_at, k, pf, at + done, PANEL, kc, of, o_at + done, ldo, rows,
                              width - done)  # fmt: skip


@njit(cache=True, nogil=True)
def gather(ids, panels, out):
    # out (n, K) = rows ids of W (an embedding lookup)
    k = panels.shape[1]
    for t in range(ids.shape[0]):
        p, j = ids[t] // PANEL, ids[t] % PANEL
        for i in range(k):
            out[t, i] = panels[p, i, j]
