"""Exact mode over the quantized panels (fp32 activations), and the row lookups of every mode.

Few rows stream the panels with lane-parallel fp32 sums (kernels/simd.py); many rows
dequantize cache-sized tiles for single-threaded sgemm calls (kernels/gemm.py). A weight is
sc * (v - off) + mn exactly as gguf.quants.dequantize computes it (kernels/panels.py has the
format), so an embedding lookup is bit-exact.
"""

import numpy as np
from numba import njit, prange

from enginecore.kernels import gemm
from enginecore.kernels.panels import LANES, panel_scales, sub_scales
from enginecore.kernels.simd import panel_row_4, panel_row_8

TILE_PANELS = 8  # panels dequantized per sgemm call (K x 128 fp32)


@njit(cache=True, nogil=True)
def block_sums(x, sub, xs):  # x (n, K) float32 -> xs (n, K // sub) sums per sub-block
    for t in range(x.shape[0]):
        for j in range(xs.shape[1]):
            s = np.float32(0.0)
            for i in range(sub):
                s += x[t, j * sub + i]
            xs[t, j] = s


@njit(parallel=True, cache=True, nogil=True)
def f32_matmul(x, xs, fmt, out, col0, n_rows, parts):
    # exact mode, few rows: out[t, col0 + row] = sum over sub-blocks of
    # sc * sum_k (v_k - off) x_k + mn * xs (kernels/simd.py); lanes uint32, one row per lane
    lanes, d, dm, isc, imn, four_bit, off, sub, sps, has_min = fmt
    n, K = x.shape
    P = lanes.shape[0]
    n_sub = K // sub
    panel_bytes = lanes.shape[1] * 4
    unused = np.empty(1, np.int32)
    step = -(-P // parts)
    for part in prange(parts):
        acc = np.empty(LANES, np.float32)
        for p in range(part * step, min(P, part * step + step)):
            for t in range(n):
                args = (1, lanes, p * panel_bytes, x, t * K, xs, t * n_sub, unused, 0, d, dm,
                        isc, imn, p * d.shape[1] * LANES, p * isc.shape[1] * LANES, sps,
                        has_min, n_sub, sub, off, acc)  # fmt: skip
                if four_bit:
                    panel_row_4(*args)
                else:
                    panel_row_8(*args)
                for r in range(min(LANES, n_rows - p * LANES)):
                    out[t, col0 + p * LANES + r] = acc[r]


@njit(cache=True, nogil=True, inline="always")
def _weight(v, off, sc, mn, has_min):
    w = sc * np.float32(np.int64(v) - off)
    if has_min:
        w = w + mn
    return w


@njit(cache=True, nogil=True, inline="always")
def _dequantize_panel(lanes, p, four_bit, off, sub, has_min, sc, mn, tile, c0):
    # tile[k, c0 + r] = weight k of row r of panel p; lanes uint32 (4 bytes per row)
    K = tile.shape[0]
    per_group = 8 if four_bit else 4
    for g in range(K // per_group):
        for b in range(4):
            for r in range(LANES):
                w = lanes[p, g * LANES + r] >> np.uint32(8 * b)
                if four_bit:
                    k = g * 8 + b
                    tile[k, c0 + r] = _weight(w & np.uint32(15), off, sc[k // sub, r],
                                              mn[k // sub, r], has_min)  # fmt: skip
                    tile[k + 4, c0 + r] = _weight((w >> np.uint32(4)) & np.uint32(15), off,
                                                  sc[(k + 4) // sub, r], mn[(k + 4) // sub, r],
                                                  has_min)  # fmt: skip
                else:
                    k = g * 4 + b
                    tile[k, c0 + r] = _weight(w & np.uint32(255), off, sc[k // sub, r],
                                              mn[k // sub, r], has_min)  # fmt: skip


@njit(parallel=True, cache=True, nogil=True)
def f32_gemm(x, fmt, out, col0, n_rows, parts):
    # exact mode, many rows: each thread dequantizes TILE_PANELS panels at a time into a
    # (K, 128) fp32 tile and multiplies it by sgemm on its own thread
    lanes, d, dm, isc, imn, four_bit, off, sub, sps, has_min = fmt
    K = x.shape[1]
    P = lanes.shape[0]
    n_sub = K // sub
    n_tiles = -(-P // TILE_PANELS)
    step = -(-n_tiles // parts)
    for part in prange(parts):
        tile = np.empty((K, TILE_PANELS * LANES), np.float32)
        sc = np.empty((n_sub, LANES), np.float32)
        mn = np.empty((n_sub, LANES), np.float32)
        for ti in range(part * step, min(n_tiles, part * step + step)):
            p0 = ti * TILE_PANELS
            p1 = min(P, p0 + TILE_PANELS)
            for p in range(p0, p1):
                panel_scales(d, dm, isc, imn, p, sps, has_min, sc, mn)
                _dequantize_panel(lanes, p, four_bit, off, sub, has_min, sc, mn, tile,
                                  (p - p0) * LANES)  # fmt: skip
            c0 = p0 * LANES
            cols = min(n_rows, p1 * LANES) - c0
            gemm.sgemm_serial(x, tile[:, :cols], out[:, col0 + c0 : col0 + c0 + cols], False)


@njit(parallel=True, cache=True, nogil=True)
def dequantize_rows(ids, fmt, out):
    # out (n, K) float32 = rows ids of the matrix (an embedding lookup); lanes uint32 or
    # uint16 (4 or 2 bytes per row and group)
    lanes, d, dm, isc, imn, four_bit, off, sub, sps, has_min = fmt
    n, K = out.shape
    il = lanes.itemsize
    per_group = 2 * il if four_bit else il
    for t in prange(n):
        p, r = ids[t] // LANES, ids[t] % LANES
        for k in range(K):
            g, rem = k // per_group, k % per_group
            shift = 8 * rem
            mask = 255
            if four_bit:
                shift = 8 * (rem % il) + 4 * (rem // il)
                mask = 15
            v = (np.int64(lanes[p, g * LANES + r]) >> shift) & mask
            sc, mn = sub_scales(d, dm, isc, imn, p, sps, has_min, k // sub, r)
            out[t, k] = _weight(v, off, sc, mn, has_min)
