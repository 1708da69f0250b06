"""The panel format of quantized weights, and its integer-mode matmul.

`fmt` is one matrix's panels: (lanes, d, dm, isc, imn, four_bit, off, sub, sps, has_min).

Every GGUF type is decoded at load into one kernel format (enginecore/loader/gguf_types.py):
small unsigned integers `v` with a per-type offset, in 16-row panels (layout: kernels/dot.py;
`lanes` is a panel's bytes viewed as one uint32 (4 bytes per row, int8 activations and exact
mode) or uint16 (2 bytes per row, int16 activations) per row and group), and per row:

  d  (P, n_super, 16) uint16: fp16 bits of the super-block scale
  dm (P, n_super, 16) uint16: fp16 bits of the super-block minimum (n_super = 0: none)
  isc, imn (P, n_sub, 16) int8: integer sub-block scale and minimum (n_sub = 0: super = sub)

so that weight = sc * (v - off) + mn, with sc = d * isc and mn = dm * imn per sub-block of
`sub` (16 or 32) values, exactly as gguf.quants.dequantize computes it.

Integer modes: activations quantized per block of 32 to int8 or int16 (scale xa, block sums
xb per 16), each panel's exact int32 sums per sub-block from kernels/dot.py (or the portable
loop here), then per output element, in one fixed order, float32 mul then add (no fastmath,
no FMA contraction): the same bits for any row count, thread split or ISA path. Exact mode
and the embedding lookups: kernels/dequant.py.
"""

import numpy as np
from numba import njit, prange

from enginecore.kernels.f16 import f16_bits_to_f32
from enginecore.kernels.simd import (
    ROWS,
    WIDE,
    panel_row_4,
    panel_row_8,
    panel_rows_4,
    panel_rows_8,
    panel_wide_4,
    panel_wide_8,
)

LANES = 16  # output rows per panel


@njit(cache=True, nogil=True, inline="always")
def sub_scales(d, dm, isc, imn, p, sps, has_min, j, r):
    # (sc, mn) of sub-block j of row r of panel p
    sc = f16_bits_to_f32(d[p, j // sps, r])
    mn = np.float32(0.0)
    if has_min:
        mn = f16_bits_to_f32(dm[p, j // sps, r])
    if sps > 1:
        sc = sc * np.float32(isc[p, j, r])
        if has_min:
            mn = mn * np.float32(imn[p, j, r])
    return sc, mn


@njit(cache=True, nogil=True, inline="always")
def panel_scales(d, dm, isc, imn, p, sps, has_min, sc, mn):
    # sc, mn (n_sub, 16) float32 of panel p
    for j in range(sc.shape[0]):
        for r in range(LANES):
            sc[j, r], mn[j, r] = sub_scales(d, dm, isc, imn, p, sps, has_min, j, r)


# Rows quantized on one thread below this many (a parallel region costs more than they do).
QUANTIZE_SERIAL_ROWS = 16


@njit(cache=True, nogil=True, inline="always")
def _quantize_row(x, t, qmax, xq, xa, xb):
    # row t of x (n, K) float32 -> xq = round(x / xa) (int8 / int16), xa (K // 32) the block
    # scales max|x| / qmax, xb (K // 16) the sums of xq per 16; the same operations whatever
    # loop runs it
    for blk in range(x.shape[1] // 32):
        amax = np.float32(0.0)
        for i in range(32):
            amax = max(amax, abs(x[t, blk * 32 + i]))
        scale = amax / np.float32(qmax)
        inv = np.float32(qmax) / amax if amax > 0 else np.float32(0.0)
        for half in range(2):
            s = np.int32(0)
            for i in range(16):
                k = blk * 32 + half * 16 + i
                q = np.int32(np.floor(x[t, k] * inv + np.float32(0.5)))
                q = min(max(q, np.int32(-qmax)), np.int32(qmax))
                xq[t, k] = q
                s += q
            xb[t, blk * 2 + half] = s
        xa[t, blk] = scale


@njit(parallel=True, cache=True, nogil=True)
def quantize_rows(x, qmax, xq, xa, xb):
    # x (n, K) float32 -> xq (n, K), xa (n, K // 32), xb (n, K // 16): see _quantize_row
    n = x.shape[0]
    if n < QUANTIZE_SERIAL_ROWS:
        for t in range(n):
            _quantize_row(x, t, qmax, xq, xa, xb)
    else:
        for t in prange(n):
            _quantize_row(x, t, qmax, xq, xa, xb)


@njit(cache=True, nogil=True, inline="always")
def _portable_sums(lanes, p, g0, n_groups, four_bit, xq, t, k0, s16):
    # s16 (16,) int32 = the panel's integer sums over groups g0.. against xq[t, k0..]
    il = lanes.itemsize
    per_group = 2 * il if four_bit else il
    for r in range(LANES):
        s16[r] = 0
    for g in range(n_groups):
        kg = k0 + g * per_group
        for r in range(LANES):
            w = np.int64(lanes[p, (g0 + g) * LANES + r])
            s = 0
            for b in range(il):
                if four_bit:
                    s += ((w >> (8 * b)) & 15) * xq[t, kg + b]
                    s += ((w >> (8 * b + 4)) & 15) * xq[t, kg + il + b]
                else:
                    s += ((w >> (8 * b)) & 255) * xq[t, kg + b]
            s16[r] += s


@njit(cache=True, nogil=True, inline="always")
def _portable_row(lanes, p, four_bit, off, sub, has_min, sc, mn, xq, xa, xb, t, s16, acc):
    # acc (16,) = panel p's rows times activation row t, in panel_row's order of operations
    il = lanes.itemsize
    gpsub = sub // (2 * il if four_bit else il)
    acc[:] = 0
    for j in range(sc.shape[0]):
        _portable_sums(lanes, p, j * gpsub, gpsub, four_bit, xq, t, j * sub, s16)
        bsum = 0
        for i in range(sub // 16):
            bsum += xb[t, j * (sub // 16) + i]
        a = xa[t, (j * sub) // 32]
        fb = np.float32(bsum)
        for r in range(LANES):
            tmp = sc[j, r] * np.float32(s16[r] - off * bsum)
            if has_min:
                tmp = tmp + mn[j, r] * fb
            acc[r] = acc[r] + a * tmp


@njit(cache=True, nogil=True, inline="always")
def _panel_rows(rows, four_bit, args):
    # kernels/simd.py's kernel for `rows` (1, ROWS or WIDE) activation rows
    if rows == WIDE and four_bit:
        panel_wide_4(*args)
    elif rows == WIDE:
        panel_wide_8(*args)
    elif rows == ROWS and four_bit:
        panel_rows_4(*args)
    elif rows == ROWS:
        panel_rows_8(*args)
    elif four_bit:
        panel_row_4(*args)
    else:
        panel_row_8(*args)


@njit(parallel=True, cache=True, nogil=True)
def int_matmul(xq, xa, xb, fmt, isa, out, col0, n_rows, parts):
    # out[t, col0 + row] for the matrix's n_rows rows (the last panel may hold padding) =
    # sum over sub-blocks of xa * (sc * (S - off * B) + mn * B), S the exact int32 sum of
    # v * xq and B the sum of xq over the sub-block: kernels/simd.py's panel_row, or the same
    # arithmetic in plain loops (isa 0)
    lanes, d, dm, isc, imn, four_bit, off, sub, sps, has_min = fmt
    n, K = xq.shape
    P = lanes.shape[0]
    n_sub = K // sub
    panel_bytes = lanes.shape[1] * lanes.itemsize
    step = -(-P // parts)
    for part in prange(parts):
        s16 = np.empty(LANES, np.int32)
        acc = np.empty(WIDE * LANES, np.float32)
        sc = np.empty((n_sub, LANES), np.float32)
        mn = np.empty((n_sub, LANES), np.float32)
        for p in range(part * step, min(P, part * step + step)):
            if isa == 0:
                panel_scales(d, dm, isc, imn, p, sps, has_min, sc, mn)
            t = 0
            while t < n:
                rows = 1
                if isa != 0 and t + WIDE <= n:
                    rows = WIDE
                elif isa != 0 and t + ROWS <= n:
                    rows = ROWS
                if isa == 0:
                    _portable_row(lanes, p, four_bit, off, sub, has_min, sc, mn, xq, xa, xb, t,
                                  s16, acc)  # fmt: skip
                else:
                    args = (isa, lanes, p * panel_bytes, xq, t * K, xa, t * (K // 32), xb,
                            t * (K // 16), d, dm, isc, imn, p * d.shape[1] * LANES,
                            p * isc.shape[1] * LANES, sps, has_min, n_sub, sub, off, acc)  # fmt: skip
                    _panel_rows(rows, four_bit, args)
                for i in range(rows):
                    for r in range(min(LANES, n_rows - p * LANES)):
                        out[t + i, col0 + p * LANES + r] = acc[i * LANES + r]
                t += rows


@njit(cache=True, nogil=True)
def quantize_matmul(x, xq_dtype, qmax, fmt, isa, out, col0, n_rows, parts):
    # int_matmul of x (n, K) float32, quantized here to xq_dtype's type (one call, not two)
    n, K = x.shape
    xq = np.empty((n, K), xq_dtype.dtype)
    xa = np.empty((n, K // 32), np.float32)
    xb = np.empty((n, K // 16), np.int32)
    quantize_rows(x, qmax, xq, xa, xb)
    int_matmul(xq, xa, xb, fmt, isa, out, col0, n_rows, parts)
