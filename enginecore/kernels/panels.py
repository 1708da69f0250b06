"""The panel format of quantized weights, and its integer-mode matmul.

`fmt` is one matrix's panels: (lanes, d, dm, isc, imn, four_bit, off, sub, sps, has_min).

Every GGUF type is decoded at load into one kernel format (enginecore/loader/gguf_types.py):
small unsigned integers `v` with a per-type offset, in 16-row panels (layout: kernels/dot.py;
`lanes` is a panel's bytes viewed as one uint32 (4 bytes per row, int8 activations and exact
mode) or uint16 (int16 activations: 2 bytes per row, or two words with 4-bit weights) per
row and group), and per row:

  d  (P, n_super, 16) uint16: fp16 bits of the super-block scale
  dm (P, n_super, 16) uint16: fp16 bits of the super-block minimum (n_super = 0: none)
  isc, imn (P, n_sub, 16) int8: integer sub-block scale and minimum (n_sub = 0: super = sub)

so that weight = sc * (v - off) + mn, with sc = d * isc and mn = dm * imn per sub-block of
`sub` (16 or 32) values, exactly as gguf.quants.dequantize computes it.

Integer modes: activations quantized per block (`act_block`: 16 values for int8, 32 for
int16) to int8 or int16 (scale xa, block sums xb per 16), each panel's exact int32 sums per
sub-block, or per activation block when that is shorter, from kernels/dot.py (or the portable
loop here), then per output element, in one fixed order, float32 mul then add (no fastmath,
no FMA contraction; explicit fused multiply-adds where kernels/simd.py says): the same bits
for any row count, thread split or ISA path. Exact mode and the embedding lookups:
kernels/dequant.py.
"""

import numpy as np
from numba import njit, prange

from enginecore.kernels.f16 import f16_bits_to_f32
from enginecore.kernels.simd import (
    ROWS,
    WIDE,
    fma32,
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
def act_block(xq):
    # activations per scale for xq's type: int8's rounding step is 258 times int16's, and
    # one large value sets the step of its whole block, so int8 blocks are 16 values (on
    # the bundled model's Q8_0 file this halves int8's mean KL against 32), int16 ones 32
    return 16 if xq.itemsize == 1 else 32


@njit(cache=True, nogil=True, inline="always")
def _quantize_row(x, t, qmax, xq, xa, xb):
    # row t of x (n, K) float32 -> xq = round(x / xa) (int8 / int16), xa (K // act_block) the
    # block scales max|x| / qmax, xb (K // 16) the sums of xq per 16; the same operations
    # whatever loop runs it
    ab = act_block(xq)
    for blk in range(x.shape[1] // ab):
        amax = np.float32(0.0)
        for i in range(ab):
            amax = max(amax, abs(x[t, blk * ab + i]))
        scale = amax / np.float32(qmax)
        inv = np.float32(qmax) / amax if amax > 0 else np.float32(0.0)
        for half in range(ab // 16):
            s = np.int32(0)
            for i in range(16):
                k = blk * ab + half * 16 + i
                q = np.int32(np.floor(x[t, k] * inv + np.float32(0.5)))
                q = min(max(q, np.int32(-qmax)), np.int32(qmax))
                xq[t, k] = q
                s += q
            xb[t, blk * (ab // 16) + half] = s
        xa[t, blk] = scale


@njit(parallel=True, cache=True, nogil=True)
def quantize_rows(x, qmax, xq, xa, xb):
    # x (n, K) float32 -> xq (n, K), xa (n, K // act_block), xb (n, K // 16): _quantize_row
    n = x.shape[0]
    if n < QUANTIZE_SERIAL_ROWS:
        for t in range(n):
            _quantize_row(x, t, qmax, xq, xa, xb)
    else:
        for t in prange(n):
            _quantize_row(x, t, qmax, xq, xa, xb)


@njit(cache=True, nogil=True, inline="always")
def group_values(lanes, four_bit):
    # values of k in one group of 16 rows (kernels/dot.py's group_layout)
    return 8 if four_bit else lanes.itemsize


@njit(cache=True, nogil=True, inline="always")
def _portable_sums(lanes, p, g0, n_groups, four_bit, xq, t, k0, s16):
    # s16 (16,) int32 = the panel's integer sums over groups g0.. against xq[t, k0..]
    il = lanes.itemsize
    per_group = group_values(lanes, four_bit)
    for r in range(LANES):
        s16[r] = 0
    for g in range(n_groups):
        kg = k0 + g * per_group
        for r in range(LANES):
            s = 0
            if four_bit and il == 2:  # two words per row: nibble q of word e is kg + 2q + e
                for e in range(2):
                    w = np.int64(lanes[p, (g0 + g) * 2 * LANES + 2 * r + e])
                    for q in range(4):
                        s += ((w >> (4 * q)) & 15) * xq[t, kg + 2 * q + e]
                s16[r] += s
                continue
            w = np.int64(lanes[p, (g0 + g) * LANES + r])
            for b in range(il):
                if four_bit:
                    s += ((w >> (8 * b)) & 15) * xq[t, kg + b]
                    s += ((w >> (8 * b + 4)) & 15) * xq[t, kg + il + b]
                else:
                    s += ((w >> (8 * b)) & 255) * xq[t, kg + b]
            s16[r] += s


@njit(cache=True, nogil=True, inline="always")
def _portable_row(lanes, p, four_bit, off, sub, has_min, sc, mn, xq, xa, xb, t, s16, psum, acc):
    # acc (16,) = panel p's rows times activation row t, in panel_row's order of operations:
    # a sub-block inside one activation block adds a * (sc * (S - off * B) + mn * B); one
    # over several (int8's blocks of 16 in a sub-block of 32) adds sc * (P - off * X) + mn * X
    # by fused multiply-adds, P and X the sums over its blocks of a * S and a * B
    per_group = group_values(lanes, four_bit)
    ab = act_block(xq)
    pieces = max(sub // ab, 1)
    plen = sub // pieces
    acc[:] = 0
    for j in range(sc.shape[0]):
        xsum = np.float32(0.0)
        for h in range(pieces):
            k0 = j * sub + h * plen
            _portable_sums(lanes, p, k0 // per_group, plen // per_group, four_bit, xq, t, k0,
                           s16)  # fmt: skip
            bsum = 0
            for i in range(plen // 16):
                bsum += xb[t, k0 // 16 + i]
            a = xa[t, k0 // ab]
            fb = np.float32(bsum)
            if pieces == 1:
                for r in range(LANES):
                    tmp = sc[j, r] * np.float32(s16[r] - off * bsum)
                    if has_min:
                        tmp = tmp + mn[j, r] * fb
                    acc[r] = acc[r] + a * tmp
                continue
            for r in range(LANES):
                fs = np.float32(s16[r])
                psum[r] = a * fs if h == 0 else fma32(a, fs, psum[r])
            xsum = a * fb if h == 0 else fma32(a, fb, xsum)
        if pieces > 1:
            offx = np.float32(off) * xsum
            for r in range(LANES):
                acc[r] = fma32(sc[j, r], psum[r] - offx, acc[r])
                if has_min:
                    acc[r] = fma32(mn[j, r], xsum, acc[r])


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
    # sum over sub-blocks (or the activation blocks inside one, when shorter) of
    # xa * (sc * (S - off * B) + mn * B), S the exact int32 sum of v * xq and B the sum of xq
    # over that piece: kernels/simd.py's panel_row, or the same arithmetic in plain loops
    # (isa 0)
    lanes, d, dm, isc, imn, four_bit, off, sub, sps, has_min = fmt
    n, K = xq.shape
    P = lanes.shape[0]
    n_sub = K // sub
    ab = act_block(xq)
    panel_bytes = lanes.shape[1] * lanes.itemsize
    step = -(-P // parts)
    for part in prange(parts):
        s16 = np.empty(LANES, np.int32)
        psum = np.empty(LANES, np.float32)
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
                                  s16, psum, acc)  # fmt: skip
                else:
                    args = (isa, lanes, p * panel_bytes, xq, t * K, xa, t * (K // ab), xb,
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
    xa = np.empty((n, K // act_block(xq)), np.float32)
    xb = np.empty((n, K // 16), np.int32)
    quantize_rows(x, qmax, xq, xa, xb)
    int_matmul(xq, xa, xb, fmt, isa, out, col0, n_rows, parts)
